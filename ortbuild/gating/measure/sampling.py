"""The sampling plan of every scenario, and latency: the single-stream scenario of the sampling engine
(ortbuild.gating.measure.engine: the looks, early stop, the load-aware retry and the outcome; the load scenarios,
offline, server and multi-stream: ortbuild.gating.measure.loadgen; cold start: ortbuild.gating.measure.startup).

Method (docs/testing.md): session creation and the first run are timed and reported apart; `warmup_runs`
untimed runs follow; then samples are taken sequentially, with the runs of several artifacts interleaved
(A B, B A, ...) when they are compared, and looked at only at checkpoints fixed in advance (the first look at
`min_samples` or FIRST_LOOK samples, then each doubling, and the plan's end). The verdict on "the p-th
percentile is at most B ms" uses binomial order statistics (ortbuild.gating.measure.percentiles), as MLPerf
LoadGen's early stopping does. Without a budget there is nothing to decide: the sample is brief (BRIEF_RUNS runs
or BRIEF_SECONDS, whichever comes first; warm-up likewise), its percentiles reported, not judged.

Sampling stops at the first look that decides every budget (the union bound keeps the chance of any wrong
verdict within 1 - c), at the first look where any budget FAILs (the gate's verdict is then FAIL whatever the
others would say: they are reported undecided, with their bounds), or at the plan's end.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from ortbuild import __version__, installed, machine, runtime
from ortbuild.gating.measure.engine import Looks, Retried, retried
from ortbuild.gating.measure.load import LoadMeter, Read, explained, runnable, wait_for_quiet
from ortbuild.gating.measure.percentiles import (
    Budget,
    PercentileVerdict,
    Spending,
    duration,
    nearest_rank,
    plan_said,
    planned_samples,
)
from ortbuild.gating.timing_records import AttemptDoc, DataSetLatency, PercentileVerdictDoc, SeriesSummary, WaitDoc
from ortbuild.status import Verdict

PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE  # as this module always named them
FIRST_LOOK = 20              # the first look at the samples when min_samples is 0
BRIEF_RUNS = 50              # no budget: at most this many timed runs (min_samples, where set, instead) ...
BRIEF_SECONDS = 1.0          # ... or this long, whichever comes first (at least one run); warm-up likewise
QUICK_CONFIDENCE = 0.90      # `ortbuild test --quick`: wider, stated, and never a release verdict
QUICK_MIN_SECONDS = 0.2


def environment() -> dict[str, object]:
    """What the latency numbers depend on, recorded with them (test-report.json's `environment`)."""
    ort = runtime.import_ort()

    fp = machine.fingerprint()
    flavor = installed.installed_flavor()
    return {"cpu": fp["cpu"], "isa_flags": fp["isa_flags"], "simd_level": fp["simd_level"],
            "x86_level": fp["x86_level"],
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "onnxruntime": flavor.as_json() if flavor else {"version": ort.__version__},
            "ortbuild": __version__, "python": platform.python_version(), "machine": platform.machine()}


# ------------------------------------------------------------------------------------------------- plan

@dataclass(frozen=True)
class Plan:
    """How one data set is sampled, in every scenario (the [latency] keys, and a load scenario's table)."""

    confidence: float = 0.99
    min_samples: int = 0             # the first look (0: FIRST_LOOK); with budgets undecided, the plan's length
    min_seconds: float = 1.0         # latency: undecided, it lasts at least this long; load: no PASS before it
    retry_wait_seconds: float = 30.0  # a FAIL under load waits at most this long for the load to fall
    max_seconds: float = math.inf    # a deadline (ortbuild tune's): past it, one look at what there is, and stop
    min_queries: int = 0             # load scenarios: no PASS before this many queries, and the plan at least so long


def confidence_of(confidence: float, quick: bool) -> float:
    """The confidence verdicts are judged at: the target's, or with --quick at most QUICK_CONFIDENCE."""
    return min(confidence, QUICK_CONFIDENCE) if quick else confidence


def plan_of(confidence: float, min_samples: int, min_seconds: float, retry_wait_seconds: float,
            quick: bool = False, *, min_queries: int = 0, quick_seconds: float = QUICK_MIN_SECONDS) -> Plan:
    """The keys' plan; `quick`: 90% confidence, at most `quick_seconds` of min_seconds, no minimum of samples or
    queries, no wait for the load to fall before a retry (a quick answer while iterating; `ortbuild release`
    refuses such verdicts)."""
    if quick:
        return Plan(confidence_of(confidence, quick), 0, min(min_seconds, quick_seconds), 0.0)
    return Plan(confidence, min_samples, min_seconds, retry_wait_seconds, min_queries=min_queries)


# ------------------------------------------------------------------------------------ single-stream latency

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


@dataclass
class Attempt:
    """One sequential measurement of the artifacts on one input."""

    series: dict[str, Series]
    verdicts: dict[str, PercentileVerdict]  # by budget kind
    looks: int
    early: bool                      # stopped before the plan's end: every budget was decided, or one FAILed
    seconds: float
    failed_on: list[str] = field(default_factory=list)  # the budgets whose FAIL stopped sampling (others undecided)
    mine: str = ""                   # the series judged (sample's `mine`)

    def suspects(self, budgets: Sequence[Budget], cpus: int) -> list[str]:
        """The budgets whose FAIL the attempt's instability (load, drift) could explain."""
        s = self.series[self.mine]
        if not s.instability():
            return []
        samples = {n: x.samples for n, x in self.series.items()}
        return [b.kind for b in budgets if self.verdicts[b.kind].verdict is FAIL
                and explained(*b.values(samples, self.mine), s.machine_load(), cpus)]

    def conditions(self, cpus: int) -> tuple[str, str, str]:
        s = self.series[self.mine]
        why = "; ".join(s.instability())
        what = f"load {s.machine_load():.1f} on {cpus} CPUs" if s.machine_load() > cpus else f"drift ({why})"
        return why, f"under {why}", f"under {what}"

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
           read: Read = runnable, cpus: int | None = None,
           seen: Mapping[str, Callable[[object], None]] | None = None) -> Attempt:
    """Time `calls` round by round, interleaved (A B, B A, ...), looking at the checkpoints: stop at the first
    look that decides every budget or FAILs any (the others are then reported undecided, INCONCLUSIVE with
    their bounds and a note saying so), else at the first look past the plan's end (its samples and
    min_seconds reached). Without budgets the sample is brief (brief_done: the percentiles are reported, not
    judged). `seen[name]` is given each output of `calls[name]`, after its time is taken (outside the timed
    region: ortbuild.gating.measure.compliance keeps a sample of them)."""
    seen = seen or {}
    end = planned_samples([b.percentile for b in budgets], plan.confidence, plan.min_samples)
    looks = Looks(budgets, plan.confidence, spending if spending is not None else {}, plan.min_samples or FIRST_LOOK,
                  end)
    series = {name: Series(name, cpus=cpus or os.cpu_count() or 1) for name in calls}
    order = list(calls)
    meter = LoadMeter(read, clock)
    meter.tick(force=True)
    start, i = clock(), 0
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
        if not (looks.due(i) or late):
            continue
        samples = {name: s.samples for name, s in series.items()}
        # each budget its own values (a SeriesBudget judges another series than `mine`: Budget.values, unbound,
        # would hand every budget `mine`'s samples)
        decided = looks.judge(partial(_values, series=samples, mine=mine))
        failed = looks.failed()
        decided = decided or bool(failed)
        at_end = (i >= end and clock() - start >= plan.min_seconds) or late
        if decided or at_end:
            break
    seconds = clock() - start
    meter.tick(force=True)
    for s in series.values():
        s.load = meter.average()
    final = looks.final()
    if failed:  # the gate failed: the undecided budgets say why they were not sampled on
        final = {k: replace(v, note=undecided_note(failed, v.note)) if v.verdict is INCONCLUSIVE else v
                 for k, v in final.items()}
    return Attempt(series, final, looks.count, decided and not at_end, seconds, failed, mine)


Outcome = Retried[Attempt]  # latency's: its attempts are Attempts


def _values(budget: Budget, series: Mapping[str, list[float]], mine: str) -> tuple[list[float], float]:
    """What `budget` is judged on: its own values() (a subclass's override included)."""
    return budget.values(series, mine)


def gate(calls: Mapping[str, Callable[[], object]], mine: str, budgets: list[Budget], plan: Plan, *,
         clock: Callable[[], float] = time.perf_counter, read: Read = runnable,
         wait: Callable[[float, int], WaitDoc] | None = None, cpus: int | None = None,
         seen: Mapping[str, Callable[[object], None]] | None = None,
         say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Sample and decide, with the engine's retry (retried) of a FAIL that load or drift could explain ("measured
    under load N; rerun on a quiet machine"). `seen`: as sample's, over every attempt."""
    n = cpus or os.cpu_count() or 1

    def measure(spending: dict[str, Spending]) -> Attempt:
        return sample(calls, mine, budgets, plan, spending, clock, read, n, seen)

    out = retried(measure, budgets, plan.retry_wait_seconds, n, wait or partial(wait_for_quiet, read=read), say)
    again = out.final
    if len(out.attempts) > 1 and again.failed_on and not any(v.verdict is FAIL for v in out.verdicts.values()):
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
