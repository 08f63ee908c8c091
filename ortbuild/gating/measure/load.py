"""The machine's load while measuring, for every scenario of the sampling engine (ortbuild.gating.measure.sampling):
the runnable threads (this process's own apart, where a scenario's pool keeps the CPUs busy by design), read while
sampling and averaged; the wait for the load to fall before a retry; and the rule that says whether the load
could explain a FAIL: whether even the most favourable value, LOAD_SLOWDOWN x max(1, load / CPUs) times faster,
would meet the budget (contention only adds time: a budget below that is impossible on this machine).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortbuild.gating.timing_records import WaitDoc

Read = Callable[[], float | None]
LOAD_SLOWDOWN = 2.0          # a FAIL under load stands only if it stays a FAIL this much faster (x load / CPUs)
LOAD_EVERY_S = 0.01          # how often the load is read while sampling
OTHERS_COMPETE = 1.0         # other runnable threads, on average, that make a scenario's FAIL suspect (a CPU's worth)


def runnable() -> float | None:
    """Threads running or ready to run on this machine right now, the reading one included (Linux's
    /proc/loadavg); None where the system does not say."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def load_now(read: Read = runnable) -> float:
    """The load now: runnable threads, or where the system does not say, the 1-minute load average."""
    r = read()
    return r if r is not None else os.getloadavg()[0]


def own_running() -> int:
    """This process's threads that are running or ready to run (state R in /proc/self/task/*/stat); 0 where the
    system does not say."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    n = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        n += stat[stat.rfind(")") + 2:].startswith("R")
    return n


@dataclass
class Load:
    """Runnable threads while measuring, averaged: on the machine (`total`) and of other processes (`others`)."""

    total: float | None = None
    others: float | None = None

    def competed(self) -> bool:
        return self.others is not None and self.others >= OTHERS_COMPETE

    def as_json(self) -> dict[str, float | None]:
        return {"runnable": _round(self.total), "others": _round(self.others)}


def _round(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


class LoadMeter:
    """The load while sampling: the runnable threads, read at most every LOAD_EVERY_S, averaged; with `own`
    (this process's runnable threads), those of other processes too."""

    def __init__(self, read: Read = runnable, clock: Callable[[], float] = time.perf_counter,
                 own: Callable[[], int] | None = None) -> None:
        self.read, self.clock, self.own = read, clock, own
        self.readings: list[float] = []
        self.others: list[float] = []
        self.last = -math.inf

    def tick(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.last >= LOAD_EVERY_S:
            self.last = now
            r = self.read()
            if r is not None:
                self.readings.append(r)
                if self.own is not None:
                    self.others.append(max(0.0, r - self.own()))

    def average(self) -> float | None:
        return sum(self.readings) / len(self.readings) if self.readings else None

    def load(self) -> Load:
        return Load(self.average(), sum(self.others) / len(self.others) if self.others else None)


def explained(values: Sequence[float], limit: float, load: float, cpus: int) -> bool:
    """Whether a load of `load` runnable threads on `cpus` CPUs could explain values above `limit`: whether the
    most favourable of them, LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would meet it."""
    return bool(values) and min(values) / (LOAD_SLOWDOWN * max(1.0, load / cpus)) <= limit


def wait_for_quiet(max_seconds: float, cpus: int, read: Read = runnable,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   window: float = 1.0, poll: float = 0.1) -> WaitDoc:
    """Poll the load until its average over `window` seconds is at most `cpus`, for at most `max_seconds`:
    {"quiet": whether it fell, "load": the last average, "waited_s": seconds waited}."""
    start = clock()
    recent: deque[tuple[float, float]] = deque()
    while True:
        now = clock()
        recent.append((now, load_now(read)))
        while recent[0][0] < now - window:
            recent.popleft()
        load = sum(x for _, x in recent) / len(recent)
        if now - start >= min(window, max_seconds) and load <= cpus:
            return {"quiet": True, "load": round(load, 2), "waited_s": round(now - start, 2)}
        if now - start >= max_seconds:
            return {"quiet": False, "load": round(load, 2), "waited_s": round(now - start, 2)}
        sleep(poll)
