"""The load generator of the load scenarios (docs/testing.md, "Load scenarios"): one loaded session, a pool of
concurrent `run` calls on it (ONNX Runtime's InferenceSession.run releases the GIL and is thread-safe), and the
three ways MLPerf LoadGen drives it:

- server (ortbuild.gating.measure.server): Poisson arrivals at a rate from a fixed seed (numpy
  default_rng(seed).exponential), each query handed at its scheduled time by a dedicated issuer thread to a
  worker pool; a query's latency runs from its *scheduled* arrival to its completion, so time spent queued (and
  an issuer running late) counts, as in LoadGen.
- multi-stream (ortbuild.gating.measure.multistream): a query is N samples run at once; the next query is issued when
  the last completes; its latency is its slowest sample's.
- offline (ortbuild.gating.measure.offline): every worker runs back to back; samples per second over the run, and
  per fixed window (the verdict judges the windows' median rate).

The verdicts are the sampling engine's (ortbuild.gating.measure.engine, on ortbuild.gating.measure.percentiles):
distribution-free binomial bounds on a percentile, looked at at checkpoints fixed in advance (the first at
FIRST_LOOK queries, then doubling, and the plan's end),
each direction's error split over its looks. Before the run's minimum (its `min_seconds` and `min_queries`) a look
can FAIL (a rate far above capacity stops within seconds) but not PASS, and spends nothing of the PASS
direction's error. The bounds treat queries as independent, as LoadGen's early stopping does; queueing
correlates neighbouring queries, so the stated confidence is nominal, and the minimum duration is there to
let the queue settle.

Load: this process's pool keeps every CPU busy by design, so what competed is the machine's runnable threads
(load.runnable) less this process's own. A FAIL measured while other work competed (OTHERS_COMPETE) is
measured again once the load has fallen (engine.retried); still competing, it is INCONCLUSIVE, unless
even the fastest query, LOAD_SLOWDOWN x max(1, load / CPUs) times faster, misses the budget (load.explained).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from ortbuild.errors import GateFailed
from ortbuild.gating.measure.engine import Looks
from ortbuild.gating.measure.load import LoadMeter, Read, own_running, runnable
from ortbuild.gating.measure.load_verdicts import Run, end_of
from ortbuild.gating.measure.percentiles import Budget, Spending, duration, plan_said
from ortbuild.gating.measure.sampling import Plan
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.measure.compliance import Checker
    from ortbuild.gating.protocol import Context
    from ortbuild.project.sections import Latency, ScenarioKind

Call = Callable[[], object]
FIRST_LOOK = 20             # queries (offline: windows FIRST_WINDOWS) before the first look
FIRST_WINDOWS = 8           # the fewest windows whose median a first look (0.995) can bound from either side
POLL_S = 0.002              # how often the monitor looks at the completed queries
MAX_PEAK_STEPS = 12         # --find-peak: server runs at most


def checked(ctx: Context, i: int, call: Call, expected: object = None) -> tuple[Checker, Call]:
    """Outputs under load (MLPerf TEST01, ortbuild.gating.measure.compliance): golden data set `i`'s requests
    numbered as they are issued, a sample of their outputs kept to be compared after the run with the accuracy run's (or
    `expected`: what one run of a feed the accuracy run did not see returned on its own, before the load)."""
    from ortbuild.gating.measure.compliance import Checker

    gates = ctx.job.settings.gates
    assert gates is not None
    ds = ctx.golden.sets[i]
    check = Checker({ds.name: cast(Mapping[str, object], ctx.outputs[i] if expected is None else expected)},
                    lambda o: gates.accuracy_rule(ctx.job.settings.precision, o))
    return check, check.wrap(cast(Callable[[], Mapping[str, object]], call), ds.name)


def judge_outputs(check: Checker, job: str, entry: dict[str, object], lines: list[str]) -> Verdict | None:
    """The compliance part of a scenario's data set: into its entry, FAIL with the failure lines on a mismatch."""
    verdict, doc, failed = check.verdict(job)
    entry["compliance"] = doc
    if verdict is Verdict.FAIL:
        entry["verdict"] = Verdict.FAIL
        lines += failed
        return Verdict.FAIL
    return None


def no_data_set(lat: Latency, kind: ScenarioKind) -> tuple[Literal["-"], dict[str, object], list[str]]:
    """A scenario that runs on none of this model's golden data sets: nothing, unless a data set of another model
    of the target declares it (then a section says so: the gate was asked and ran, on nothing here)."""
    if not lat.declares(kind):
        return "-", {}, []
    said = f"no golden data set of this model has a {kind} table"
    return "-", {"summary": said, "note": f"{said} (only another model's data sets declare one)"}, []


def section(verdict: Verdict | None, entries: list[dict[str, object]], summary: str, budget: dict[str, object],
            *, per_data_set: Mapping[str, dict[str, object]] | None = None,
            **figures: object) -> tuple[Verdict | Literal["-"], dict[str, object]]:
    """A scenario gate's verdict and section (a Judged: ortbuild.gating.protocol): its one-line `summary` for the
    text table, its `budget` for the release index (the target's table's, empty where only data sets declare the
    scenario; where a judged data set's own budget, in `per_data_set`, differs from it, a `data_sets` map of those),
    every data set's entry and the notes of the undecided ones."""
    differ = {name: own for name, own in (per_data_set or {}).items() if own != budget}
    if differ:
        budget = {**budget, "data_sets": differ}
    notes = [f"{e['name']}: {e['note']}" for e in entries if e.get("note")]
    out: dict[str, object] = {"summary": summary, "budget": budget, **figures, "data_sets": entries}
    if notes and verdict is Verdict.INCONCLUSIVE:
        out["note"] = "; ".join(notes)
    return (verdict if verdict is not None else "-"), out


# ---------------------------------------------------------------------------------------------- scenarios

def schedule(qps: float, seed: int, queries: int, seconds: float) -> Any:
    """The arrival times (seconds from the start) of a Poisson process at `qps` from `seed`: at least `queries`
    of them, and the first at or past `seconds` (a longer schedule's prefix is the same: one seed, one load)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrivals = rng.exponential(1.0 / qps, max(queries, math.ceil(qps * seconds * 1.2) + 10)).cumsum()
    while arrivals[-1] < seconds:  # a slow draw: extend the same sequence
        arrivals = np.concatenate([arrivals, arrivals[-1] + rng.exponential(1.0 / qps, len(arrivals)).cumsum()])
    return arrivals[:max(queries, int(np.searchsorted(arrivals, seconds)) + 1)]


def server(call: Call, qps: float, budgets: Sequence[Budget], plan: Plan, spending: dict[str, Spending], *,
           seed: int = 0, workers: int = 0, read: Read = runnable, own: Callable[[], int] = own_running,
           clock: Callable[[], float] = time.perf_counter) -> Run:
    """MLPerf Server: Poisson arrivals at `qps` (seed `seed`) handed by an issuer thread to `workers` concurrent
    calls; latency from scheduled arrival to completion. Looks at the longest prefix of queries (in arrival
    order) that has completed; stops at the first look that decides every budget (a PASS only once the
    judged queries span min_seconds and number min_queries), or at the plan's end."""
    import numpy as np

    arrivals = schedule(qps, seed, end_of(budgets, plan), plan.min_seconds)
    end = len(arrivals)
    done = np.full(end, np.nan)
    issued = np.full(end, np.nan)
    stop = threading.Event()
    errors: list[BaseException] = []
    workers = workers or os.cpu_count() or 1
    pool = _pool(workers)
    start = clock() + 0.01

    def query(i: int) -> None:
        try:
            call()
        except BaseException as e:
            errors.append(e)
            stop.set()
        done[i] = clock()

    def issuer() -> None:
        for i in range(end):
            wait = start + arrivals[i] - clock()
            if (wait > 0 and stop.wait(wait)) or stop.is_set():
                return
            issued[i] = clock()
            try:
                pool.submit(query, i)
            except RuntimeError as e:  # "can't start new thread": the machine's limit, said, never a hang
                errors.append(_no_threads("server", "workers", workers, e))
                stop.set()
                return

    thread = threading.Thread(target=issuer, name="ortbuild-issuer", daemon=True)
    meter = LoadMeter(read, clock, own)
    meter.tick(force=True)
    looks = Looks(budgets, plan.confidence, spending, FIRST_LOOK, end)
    thread.start()
    prefix, decided = 0, False
    try:
        while not errors:
            meter.tick()
            while prefix < end and not math.isnan(done[prefix]):
                prefix += 1
            if looks.due(prefix):
                values = [float(x) for x in (done[:prefix] - (start + arrivals[:prefix])) * 1e3]
                can_pass = prefix >= plan.min_queries and arrivals[prefix - 1] >= plan.min_seconds
                decided = looks.judge_values(values, can_pass)
                if decided or prefix >= end:
                    break
            time.sleep(POLL_S)
    finally:
        stop.set()
        thread.join()
        pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        raise errors[0]
    meter.tick(force=True)
    n_issued = int(np.count_nonzero(~np.isnan(issued)))
    lag = np.sort((issued[:prefix] - (start + arrivals[:prefix])) * 1e3)
    seconds = float(np.nanmax(done) - start) if n_issued else 0.0
    facts: dict[str, object] = {
        "qps": qps, "issued": n_issued, "judged": prefix, "workers": workers, "seed": seed,
        "achieved_qps": round(prefix / float(arrivals[prefix - 1]), 3) if prefix else 0.0,
        # completions per second from the start to the last judged completion: below the offered rate when
        # the artifact cannot hold it (the queue grows); --find-peak needs it within HOLD of the offered rate
        "completed_qps": round(prefix / float(np.nanmax(done[:prefix]) - start), 3) if prefix else 0.0,
        "issue_lag_p99_ms": round(float(lag[max(0, math.ceil(0.99 * len(lag)) - 1)]), 4) if len(lag) else None}
    values = [float(x) * 1e3 for x in done[:prefix] - (start + arrivals[:prefix])]
    return Run(values, seconds, looks.final(), looks.count, decided and prefix < end, meter.load(), facts)


def multi_stream(call: Call, streams: int, budgets: Sequence[Budget], plan: Plan, spending: dict[str, Spending], *,
                 read: Read = runnable, own: Callable[[], int] = own_running,
                 clock: Callable[[], float] = time.perf_counter) -> Run:
    """MLPerf MultiStream: each query runs `streams` samples at once on a pool of as many workers; the next is
    issued when the last completes; a query's latency is its slowest sample's. Stops at the first look that
    decides every budget (a PASS only past min_seconds and min_queries), or at the first look past the plan's
    end and min_seconds."""
    from concurrent.futures import wait

    end = end_of(budgets, plan)
    pool = _pool(streams)

    def sample() -> float:
        call()
        return clock()

    meter = LoadMeter(read, clock, own)
    meter.tick(force=True)
    looks = Looks(budgets, plan.confidence, spending, FIRST_LOOK, end)
    values: list[float] = []
    start = clock()
    decided = at_end = False
    try:
        while True:
            t0 = clock()
            try:
                futures = [pool.submit(sample) for _ in range(streams)]
            except RuntimeError as e:
                raise _no_threads("multi_stream", "streams", streams, e) from None
            wait(futures)
            values.append((max(f.result() for f in futures) - t0) * 1e3)
            meter.tick()
            n = len(values)
            if not budgets and n >= end and clock() - start >= plan.min_seconds:
                break
            if looks.due(n):
                elapsed = clock() - start
                decided = looks.judge_values(values, n >= plan.min_queries and elapsed >= plan.min_seconds)
                at_end = n >= end and elapsed >= plan.min_seconds
                if decided or at_end:
                    break
    finally:
        pool.shutdown(wait=True)
    meter.tick(force=True)
    seconds = clock() - start
    facts: dict[str, object] = {"streams": streams, "queries": len(values),
                                "queries_per_second": round(len(values) / seconds, 3) if seconds else 0.0}
    return Run(values, seconds, looks.final(), looks.count, decided and not at_end, meter.load(), facts)


def offline(call: Call, per_call: int, workers: int, budgets: Sequence[Budget], plan: Plan, window: float,
            spending: dict[str, Spending], *, read: Read = runnable, own: Callable[[], int] = own_running,
            clock: Callable[[], float] = time.perf_counter) -> Run:
    """MLPerf Offline: `workers` threads run `call` (`per_call` samples each) back to back. The run is cut into
    windows of `window` seconds, each call's samples spread over the windows its time overlaps; a window's value
    is its milliseconds per sample (1000 / its rate), so "the median window rate is at least R" is "the median
    of the values is at most 1000 / R ms", judged by the same binomial bounds. Windows are judged only once no
    call that overlaps them is still running. Stops at the first look that decides (a PASS only past
    min_seconds), or at twice min_seconds."""
    import numpy as np

    n_min = max(FIRST_WINDOWS, math.ceil(plan.min_seconds / window))
    end = 2 * n_min
    stop = threading.Event()
    calls: list[list[tuple[float, float]]] = [[] for _ in range(workers)]
    running = [math.nan] * workers
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            while not stop.is_set():
                t0 = clock()
                running[w] = t0
                call()
                calls[w].append((t0, clock()))
                running[w] = math.nan
        except BaseException as e:
            errors.append(e)
            stop.set()
        running[w] = math.nan

    meter = LoadMeter(read, clock, own)
    meter.tick(force=True)
    looks = Looks(budgets, plan.confidence, spending, FIRST_WINDOWS, end)
    start = clock()
    threads = [threading.Thread(target=worker, args=(w,), name=f"ortbuild-offline-{w}", daemon=True)
               for w in range(workers)]
    started = 0
    try:
        for t in threads:
            t.start()
            started += 1
    except RuntimeError as e:  # "can't start new thread": the machine's limit, not a crash
        stop.set()
        for t in threads[:started]:
            t.join()
        raise _no_threads("offline", "workers", workers, e) from None

    def windows(k: int) -> list[float]:
        spans = np.array([c for cs in calls for c in cs[:len(cs)]], dtype=float).reshape(-1, 2) - start
        edges = np.arange(k + 1) * window
        lo = np.maximum(spans[:, :1], edges[None, :-1])
        hi = np.minimum(spans[:, 1:], edges[None, 1:])
        share = np.clip(hi - lo, 0, None) / np.maximum(spans[:, 1:] - spans[:, :1], 1e-12)
        samples = share.sum(axis=0) * per_call
        return [window * 1e3 / max(float(s), 1e-9) for s in samples]

    decided, k = False, 0
    try:
        while not errors:
            meter.tick()
            now = clock()
            busy = [r for r in list(running) if not math.isnan(r)]
            k = int((min([now, *busy]) - start) // window)
            if k >= FIRST_WINDOWS and looks.due(k):
                decided = looks.judge_values(windows(k), k >= n_min)
                if decided or k >= end:
                    break
            time.sleep(POLL_S * 5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    meter.tick(force=True)
    spans = [c for cs in calls for c in cs]
    seconds = max(e for _, e in spans) - start if spans else 0.0
    values = windows(k) if k else []
    facts: dict[str, object] = {"calls": len(spans), "samples": len(spans) * per_call, "window_seconds": window,
                                "windows": k, "workers": workers,
                                "samples_per_second": round(len(spans) * per_call / seconds, 3) if seconds else 0.0}
    return Run(values, seconds, looks.final(), looks.count, decided and k < end, meter.load(), facts)


def cpus() -> int:
    return os.cpu_count() or 1


def _no_threads(scenario: str, key: str, n: int, e: BaseException) -> GateFailed:
    """The gate's error where the machine cannot start the threads a scenario asks for (its limit, not a crash)."""
    return GateFailed(f"{scenario}: this machine could not start {n} concurrent calls ({e})",
                      f"lower [latency.{scenario}] {key}")


def _pool(workers: int) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ortbuild-load")


def plan_line(what: str, budgets: Sequence[Budget], plan: Plan, end: int,
              seconds_for: Callable[[int], float]) -> str:
    """The line said before a scenario's queries (as latency's before its samples): what each budget needs to PASS
    and about how long (`seconds_for(n)` queries), the plan's end (`end`), the first look; a scenario table
    without a budget is measured to its end and reported."""
    if not budgets:
        return f"{what}: no budget: {end} queries (about {duration(seconds_for(end))}), reported, not judged"
    said = plan_said(list(budgets), plan.confidence, FIRST_LOOK, end, seconds_for, "queries")
    least = f"{plan.min_seconds:g} s" + (f" and {plan.min_queries} queries" if plan.min_queries else "")
    return f"{what}: {said}; a PASS after at least {least}, and a retry if other work competed"


def warm(call: Call, runs: int, timed: int = 20) -> list[float]:
    """`runs` untimed calls, then `timed` timed ones one at a time (ms): the single-stream estimate."""
    for _ in range(runs):
        call()
    out = []
    for _ in range(timed):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e3)
    return sorted(out)
