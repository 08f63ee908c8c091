"""Latency measurement and distribution-free verdicts on percentiles.

Method (docs/testing.md): session creation and the first run are timed and reported apart; `warmup_runs`
untimed runs follow; then samples are taken sequentially, with the runs of several artifacts interleaved
(A B, B A, ...) when they are compared, and looked at only at checkpoints fixed in advance (the first look at
`min_samples` or FIRST_LOOK samples, then each doubling, and the plan's end). The verdict on "the p-th
percentile is at most B ms" uses binomial order statistics, as MLPerf LoadGen's early stopping does: the
k-th smallest of n samples is an upper confidence bound on the percentile when P(Binom(n, p) <= k-1) >= c.
PASS when the upper bound is within the budget, FAIL when the lower bound is above it, else INCONCLUSIVE,
with how many more samples (at the observed exceedance rate) would decide. Without a budget there is nothing to
decide: the sample is brief (BRIEF_RUNS runs or BRIEF_SECONDS, whichever comes first; warm-up likewise), its
percentiles reported, not judged.

Looking more than once inflates the error, so the error 1 - c of each direction (a wrong PASS, a wrong FAIL)
is split over that direction's looks, 1/(k(k+1)) of it to the k-th (1/2, 1/6, 1/12, ...: the shares sum to 1
however many looks there are), and a look spends a share only when it can decide in that direction at that
sample count (which does not depend on the samples). Sampling stops at the first look that decides every
budget (the union bound keeps the chance of any wrong verdict within 1 - c), at the first look where any budget
FAILs (the gate's verdict is then FAIL whatever the others would say: they are reported undecided, with their
bounds), or at the plan's end.

A FAIL measured while the machine was loaded (more runnable threads than CPUs) or while the median drifted is
measured again once the load has fallen (waiting at most `retry_wait_seconds`); a FAIL that the load could
explain and that persists under load becomes INCONCLUSIVE. A FAIL that even the fastest sample, taken
LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would still be (an impossible budget) stands.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ortbuild import __version__, machine, runtime
from ortbuild.gating.measure.percentiles import Budget as Budget
from ortbuild.gating.measure.percentiles import PercentileVerdict as PercentileVerdict
from ortbuild.gating.measure.percentiles import Spending as Spending
from ortbuild.gating.measure.percentiles import budgets_of as budgets_of
from ortbuild.gating.measure.percentiles import checkpoints as checkpoints
from ortbuild.gating.measure.percentiles import duration as duration
from ortbuild.gating.measure.percentiles import fewest_to_pass as fewest_to_pass
from ortbuild.gating.measure.percentiles import look_confidence as look_confidence
from ortbuild.gating.measure.percentiles import lower_rank as lower_rank
from ortbuild.gating.measure.percentiles import min_samples_to_bound as min_samples_to_bound
from ortbuild.gating.measure.percentiles import nearest_rank as nearest_rank
from ortbuild.gating.measure.percentiles import percentile_verdict as percentile_verdict
from ortbuild.gating.measure.percentiles import plan_said as plan_said
from ortbuild.gating.measure.percentiles import planned_samples as planned_samples
from ortbuild.gating.measure.percentiles import retry_said as retry_said
from ortbuild.gating.measure.percentiles import sequential_verdict as sequential_verdict
from ortbuild.gating.measure.percentiles import upper_rank as upper_rank
from ortbuild.gating.measure.percentiles import with_estimate as with_estimate
from ortbuild.gating.timing_records import (
    AttemptDoc,
    DataSetLatency,
    PercentileVerdictDoc,
    RetryDoc,
    SeriesSummary,
    WaitDoc,
)
from ortbuild.status import Verdict

PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE  # as this module always named them
FIRST_LOOK = 20              # the first look at the samples when min_samples is 0
LOAD_SLOWDOWN = 2.0          # a FAIL under load stands only if it stays a FAIL this much faster (x load / CPUs)
LOAD_EVERY_S = 0.01          # how often the load is read while sampling
BRIEF_RUNS = 50              # no budget: at most this many timed runs (min_samples, where set, instead) ...
BRIEF_SECONDS = 1.0          # ... or this long, whichever comes first (at least one run); warm-up likewise


# ------------------------------------------------------------------------------------------------- load

def runnable() -> float | None:
    """Threads running or ready to run on this machine right now, the reading one included (Linux's
    /proc/loadavg); None where the system does not say."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def load_now(read: Callable[[], float | None] = runnable) -> float:
    """The load now: runnable threads, or where the system does not say, the 1-minute load average."""
    r = read()
    return r if r is not None else os.getloadavg()[0]


class LoadMeter:
    """The machine's load while sampling: the runnable threads, read at most every LOAD_EVERY_S, averaged."""

    def __init__(self, read: Callable[[], float | None] = runnable,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.read, self.clock = read, clock
        self.readings: list[float] = []
        self.last = -math.inf

    def tick(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.last >= LOAD_EVERY_S:
            self.last = now
            r = self.read()
            if r is not None:
                self.readings.append(r)

    def average(self) -> float | None:
        return sum(self.readings) / len(self.readings) if self.readings else None


def wait_for_quiet(max_seconds: float, cpus: int, read: Callable[[], float | None] = runnable,
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


def environment() -> dict[str, object]:
    """What the latency numbers depend on, recorded with them (test-report.json's `environment`)."""
    ort = runtime.import_ort()

    fp = machine.fingerprint()
    flavor = runtime.installed_flavor()
    return {"cpu": fp["cpu"], "isa_flags": fp["isa_flags"], "simd_level": fp["simd_level"],
            "x86_level": fp["x86_level"],
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "onnxruntime": flavor.as_json() if flavor else {"version": ort.__version__},
            "ortbuild": __version__, "python": platform.python_version(), "machine": platform.machine()}


# ------------------------------------------------------------------------------------------ measurement

@dataclass
class Series:
    """The timings of one artifact in one run, in milliseconds."""

    name: str
    session_ms: float = 0.0
    first_run_ms: float = 0.0
    samples: list[float] = field(default_factory=list)
    load: float | None = None        # runnable threads on the machine while sampling (None: the load average)
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)

    def summary(self) -> SeriesSummary:
        xs = sorted(self.samples)
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1))
        return {"samples": len(xs), "min_ms": xs[0], "p50_ms": nearest_rank(xs, 0.5), "p90_ms": nearest_rank(xs, 0.9),
                "p99_ms": nearest_rank(xs, 0.99), "max_ms": xs[-1], "mean_ms": mean, "cov": sd / mean if mean else 0.0,
                "session_ms": self.session_ms, "first_run_ms": self.first_run_ms}

    def machine_load(self) -> float:
        """The load while sampling (where it was not measured, the 1-minute load average now)."""
        return self.load if self.load is not None else os.getloadavg()[0]

    def instability(self) -> list[str]:
        """Why these samples should not be trusted as they are (empty: stable)."""
        why = []
        third = len(self.samples) // 3
        if third >= 10:
            first = sorted(self.samples[:third])[third // 2]
            last = sorted(self.samples[-third:])[third // 2]
            drift = abs(last - first) / min(first, last)
            if drift > 0.10:
                why.append(f"median drifted {drift:.0%} between the first and last third of the run")
        load = self.machine_load()
        if load > self.cpus:
            why.append(f"load {load:.1f} above the {self.cpus} CPUs: other work competed")
        return why


def prepare(calls: Mapping[str, Callable[[], object]], warmup_runs: int) -> dict[str, float]:
    """Time each artifact's first run (ms), then make `warmup_runs` untimed runs of each."""
    return warm_up(calls, warmup_runs).first_ms


@dataclass(frozen=True)
class Warmed:
    """What warming up measured, in ms per artifact: its first run, and a typical run (the median of the warm-up
    runs; the first run where there were none)."""

    first_ms: dict[str, float]
    run_ms: dict[str, float]

    def round_seconds(self) -> float:
        """The expected seconds of one sampling round (one run of each artifact)."""
        return sum(self.run_ms.values()) / 1e3


def warm_up(calls: Mapping[str, Callable[[], object]], warmup_runs: int,
            max_seconds: float = math.inf, clock: Callable[[], float] = time.perf_counter) -> Warmed:
    """Time each artifact's first run, then make up to `warmup_runs` runs of each (stopping once they took
    `max_seconds`: the brief measurement of a target without budgets), timed only to estimate what sampling
    will take."""
    first: dict[str, float] = {}
    typical: dict[str, float] = {}
    for name, call in calls.items():
        t0 = clock()
        call()
        first[name] = (clock() - t0) * 1e3
        runs: list[float] = []
        start = clock()
        while len(runs) < warmup_runs and clock() - start < max_seconds:
            t0 = clock()
            call()
            runs.append((clock() - t0) * 1e3)
        typical[name] = sorted(runs)[len(runs) // 2] if runs else first[name]
    return Warmed(first, typical)


def brief_done(rounds: int, seconds: float, plan: Plan) -> bool:
    """Whether a sample without budgets is complete: `min_samples` rounds where the plan sets it, else
    BRIEF_RUNS rounds or BRIEF_SECONDS, whichever comes first (the percentiles are reported, not judged)."""
    if plan.min_samples:
        return rounds >= plan.min_samples
    return rounds >= BRIEF_RUNS or seconds >= BRIEF_SECONDS


@dataclass(frozen=True)
class Plan:
    """How one data set is sampled (the [latency] keys)."""

    confidence: float = 0.99
    min_samples: int = 0             # the first look (0: FIRST_LOOK); with budgets undecided, the plan's length
    min_seconds: float = 1.0         # with budgets undecided, sampling lasts at least this long
    retry_wait_seconds: float = 30.0  # a FAIL under load waits at most this long for the load to fall
    max_seconds: float = math.inf    # a deadline (ortbuild tune's): past it, one look at what there is, and stop


QUICK_CONFIDENCE = 0.90  # `ortbuild test --quick`: wider, stated, and never a release verdict
QUICK_MIN_SECONDS = 0.2


def confidence_of(confidence: float, quick: bool) -> float:
    """The confidence verdicts are judged at: the target's, or with --quick at most QUICK_CONFIDENCE."""
    return min(confidence, QUICK_CONFIDENCE) if quick else confidence


def plan_of(confidence: float, min_samples: int, min_seconds: float, retry_wait_seconds: float,
            quick: bool = False) -> Plan:
    """The [latency] keys' plan; `quick`: 90% confidence, sampling at least QUICK_MIN_SECONDS, no wait for the
    load to fall before a retry (a quick answer while iterating; `ortbuild release` refuses such verdicts)."""
    if quick:
        return Plan(confidence_of(confidence, quick), 0, min(min_seconds, QUICK_MIN_SECONDS), 0.0)
    return Plan(confidence, min_samples, min_seconds, retry_wait_seconds)


@dataclass
class Attempt:
    """One sequential measurement of the artifacts on one input."""

    series: dict[str, Series]
    verdicts: dict[str, PercentileVerdict]  # by budget kind
    looks: int
    early: bool                      # stopped before the plan's end: every budget was decided, or one FAILed
    seconds: float
    failed_on: list[str] = field(default_factory=list)  # the budgets whose FAIL stopped sampling (others undecided)

    def entry(self, mine: str, name: str) -> DataSetLatency:
        """The start of data set `name`'s report (gates.data_set_entry): the timings of the series `mine`, its samples,
        instability and load, the looks, and no verdicts yet."""
        series = self.series[mine]
        s = series.summary()
        return {"name": name, "samples": s["samples"], "min_ms": s["min_ms"], "p50_ms": s["p50_ms"],
                "p90_ms": s["p90_ms"], "p99_ms": s["p99_ms"], "max_ms": s["max_ms"], "mean_ms": s["mean_ms"],
                "cov": s["cov"], "session_ms": s["session_ms"], "first_run_ms": s["first_run_ms"],
                "samples_ms": [round(x, 4) for x in series.samples], "unstable": series.instability(),
                "load": None if series.load is None else round(series.load, 2), "looks": self.looks,
                "stopped_early": self.early, "verdicts": []}

    def as_json(self, mine: str) -> AttemptDoc:
        s = self.series[mine]
        return {"samples": len(s.samples), "seconds": round(self.seconds, 3), "looks": self.looks,
                "stopped_early": self.early, "load": None if s.load is None else round(s.load, 2),
                "unstable": s.instability(), "p50_ms": s.summary()["p50_ms"], "p90_ms": s.summary()["p90_ms"],
                "verdicts": {k: v.verdict for k, v in self.verdicts.items()}}


def undecided_note(failed: list[str], note: str) -> str:
    """The note of a budget left undecided because sampling stopped at another's FAIL (`note`: its estimate)."""
    return f"not decided: the gate had already failed on {', '.join(failed)}" + (f"; {note}" if note else "")


def sample(calls: Mapping[str, Callable[[], object]], mine: str, budgets: list[Budget], plan: Plan,
           spending: dict[str, Spending] | None = None, clock: Callable[[], float] = time.perf_counter,
           read: Callable[[], float | None] = runnable, cpus: int | None = None,
           seen: Mapping[str, Callable[[object], None]] | None = None) -> Attempt:
    """Time `calls` round by round, interleaved (A B, B A, ...), looking at the checkpoints: stop at the first
    look that decides every budget or FAILs any (the others are then reported undecided, INCONCLUSIVE with
    their bounds and a note saying so), else at the first look past the plan's end (its samples and
    min_seconds reached). Without budgets the sample is brief (brief_done: the percentiles are reported, not
    judged). `seen[name]` is given each output of `calls[name]`, after its time is taken (outside the timed
    region: ortbuild.gating.measure.compliance keeps a sample of them)."""
    spending = spending if spending is not None else {}
    seen = seen or {}
    end = planned_samples([b.percentile for b in budgets], plan.confidence, plan.min_samples)
    looks_at = checkpoints(plan.min_samples or FIRST_LOOK, end)
    look = next(looks_at)
    series = {name: Series(name, cpus=cpus or os.cpu_count() or 1) for name in calls}
    order = list(calls)
    meter = LoadMeter(read, clock)
    meter.tick(force=True)
    start, i, looks = clock(), 0, 0
    verdicts: dict[str, PercentileVerdict] = {}
    failed: list[str] = []
    decided = at_end = False
    while True:
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = clock()
            out = calls[name]()
            series[name].samples.append((clock() - t0) * 1e3)
            if name in seen:
                seen[name](out)
        i += 1
        meter.tick()
        if not budgets and brief_done(i, clock() - start, plan):
            break  # nothing to decide: a brief sample, no look needed
        late = clock() - start >= plan.max_seconds  # a look now, the next share of the error: then stop
        if i < look and not late:
            continue
        while look <= i:
            look = next(looks_at)
        looks += 1
        samples = {name: s.samples for name, s in series.items()}
        verdicts = {}
        for b in budgets:
            values, limit = b.values(samples, mine)
            verdicts[b.kind] = sequential_verdict(values, b.percentile, limit, plan.confidence,
                                                  spending.setdefault(b.kind, Spending()))
        failed = [k for k, v in verdicts.items() if v.verdict is Verdict.FAIL]
        decided = bool(failed) or (bool(budgets) and all(v.verdict is not Verdict.INCONCLUSIVE
                                                         for v in verdicts.values()))
        at_end = (i >= end and clock() - start >= plan.min_seconds) or late
        if decided or at_end:
            break
    seconds = clock() - start
    meter.tick(force=True)
    for s in series.values():
        s.load = meter.average()
    final = {k: with_estimate(v) for k, v in verdicts.items()}
    if failed:  # the gate failed: the undecided budgets say why they were not sampled on
        final = {k: replace(v, note=undecided_note(failed, v.note)) if v.verdict is Verdict.INCONCLUSIVE else v
                 for k, v in final.items()}
    return Attempt(series, final, looks, decided and not at_end, seconds, failed)


def explained_by_load(budget: Budget, attempt: Attempt, mine: str, cpus: int) -> bool:
    """Whether the instability of `attempt` could explain a FAIL of `budget`: whether even its most favourable
    sample, LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would meet the budget. (Contention only adds
    time; a budget below that is impossible on this machine, loaded or not.)"""
    values, limit = budget.values({n: s.samples for n, s in attempt.series.items()}, mine)
    load = attempt.series[mine].machine_load()
    return min(values) / (LOAD_SLOWDOWN * max(1.0, load / cpus)) <= limit


@dataclass
class Outcome:
    """The verdicts of one data set, after the retry a FAIL under load gets."""

    attempts: list[Attempt]
    verdicts: dict[str, PercentileVerdict]
    retry: RetryDoc | None = None    # why it was measured again, how long it waited

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]


def _suspects(attempt: Attempt, budgets: list[Budget], mine: str, cpus: int) -> list[str]:
    """The budgets whose FAIL the attempt's instability (load, drift) could explain."""
    if not attempt.series[mine].instability():
        return []
    return [b.kind for b in budgets if attempt.verdicts[b.kind].verdict is Verdict.FAIL
            and explained_by_load(b, attempt, mine, cpus)]


def gate(calls: Mapping[str, Callable[[], object]], mine: str, budgets: list[Budget], plan: Plan, *,
         clock: Callable[[], float] = time.perf_counter, read: Callable[[], float | None] = runnable,
         wait: Callable[[float, int], WaitDoc] | None = None, cpus: int | None = None,
         seen: Mapping[str, Callable[[object], None]] | None = None,
         say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Sample and decide; a FAIL the load or drift could explain is measured again after waiting (at most
    plan.retry_wait_seconds) for the load to fall, the looks of both attempts sharing one error budget. A FAIL
    that persists under load is INCONCLUSIVE ("measured under load N; rerun on a quiet machine"). `seen`: as
    sample's, over every attempt."""
    cpus = cpus or os.cpu_count() or 1
    spending: dict[str, Spending] = {}
    first = sample(calls, mine, budgets, plan, spending, clock, read, cpus, seen)
    out = Outcome([first], dict(first.verdicts))
    suspects = _suspects(first, budgets, mine, cpus)
    if not suspects:
        return out
    say(retry_said(suspects, "; ".join(first.series[mine].instability()), plan.retry_wait_seconds))
    waited = wait(plan.retry_wait_seconds, cpus) if wait else wait_for_quiet(plan.retry_wait_seconds, cpus, read)
    out.retry = {"why": f"{', '.join(suspects)} FAIL under {'; '.join(first.series[mine].instability())}",
                 **waited}
    again = sample(calls, mine, budgets, plan, spending, clock, read, cpus, seen)
    out.attempts.append(again)
    out.verdicts = dict(again.verdicts)
    s = again.series[mine]
    for kind in _suspects(again, budgets, mine, cpus):
        what = (f"load {s.machine_load():.1f} on {cpus} CPUs" if s.machine_load() > cpus else
                f"drift ({'; '.join(s.instability())})")
        out.verdicts[kind] = replace(out.verdicts[kind], verdict=Verdict.INCONCLUSIVE, more_samples=None,
                                     note=f"FAIL measured under {what}, twice (waited {waited['waited_s']:g} s for "
                                          "the load to fall); rerun on a quiet machine")
    if again.failed_on and not any(v.verdict is Verdict.FAIL for v in out.verdicts.values()):
        stopped = undecided_note(again.failed_on, "")  # those FAILs are now undecided too: say what stopped it
        out.verdicts = {k: replace(v, note=v.note.replace(stopped, "not decided: sampling stopped at the "
                                                          f"FAIL of {', '.join(again.failed_on)} under load"))
                        for k, v in out.verdicts.items()}
    return out


def as_json(v: PercentileVerdict) -> PercentileVerdictDoc:
    return v.as_json()


def said_before(name: str, budgets: list[Budget], plan: Plan, warmed: Warmed) -> str:
    """The line said before a data set's latency sampling: with budgets, what each needs and about how long
    (from the warm-up runs' pace); without, that the measurement is brief and not judged."""
    run_ms = warmed.round_seconds() * 1e3
    if not budgets:
        most = f"{plan.min_samples} runs" if plan.min_samples else \
            f"at most {BRIEF_RUNS} runs or {BRIEF_SECONDS:g} s"
        return f"latency on {name}: no budget: a brief measurement ({most}), reported, not judged"
    first = plan.min_samples or FIRST_LOOK
    end = planned_samples([b.percentile for b in budgets], plan.confidence, plan.min_samples)
    said = plan_said(budgets, plan.confidence, first, end, lambda n: n * run_ms / 1e3)
    paired = "".join(f", interleaved with {b.reference}" for b in budgets if b.reference)
    pace = f"{run_ms:.3g} ms" if run_ms < 1e3 else duration(run_ms / 1e3)
    return f"latency on {name} ({pace} a run{paired}): {said}"
