"""The verdicts of the load scenarios (ortbuild.gating.measure.loadgen): the machine's load while measuring, the plan and
looks of a run, the load-aware retry, and the report of one data set. The statistics are latency's
(ortbuild.gating.measure.percentiles); docs/testing.md, "Load scenarios", explains them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.measure.percentiles import (
    Budget,
    PercentileVerdict,
    Spending,
    checkpoints,
    planned_samples,
    sequential_verdict,
    with_estimate,
)
from ortbuild.status import Verdict

Read = Callable[[], float | None]
OTHERS_COMPETE = 1.0        # other runnable threads, on average, that make a FAIL suspect (a CPU's worth)
QUICK_SECONDS = 2.0         # --quick: the minimum run, at most this

# ----------------------------------------------------------------------------------------------------- load

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


class Meter:
    """The load while measuring, read at most every latency.LOAD_EVERY_S."""

    def __init__(self, read: Read = latency.runnable, own: Callable[[], int] = own_running,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.read, self.own, self.clock = read, own, clock
        self.totals: list[float] = []
        self.others: list[float] = []
        self.last = -math.inf

    def tick(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.last >= latency.LOAD_EVERY_S:
            self.last = now
            r = self.read()
            if r is not None:
                self.totals.append(r)
                self.others.append(max(0.0, r - self.own()))

    def load(self) -> Load:
        if not self.totals:
            return Load()
        return Load(sum(self.totals) / len(self.totals), sum(self.others) / len(self.others))


# ------------------------------------------------------------------------------------------------- verdicts

@dataclass(frozen=True)
class Plan:
    """How long a scenario runs before it may PASS, at what confidence, and how long a retry waits."""

    confidence: float = 0.99
    min_seconds: float = 10.0
    min_queries: int = 0
    retry_wait_seconds: float = 30.0


def plan_of(confidence: float, min_seconds: float, min_queries: int, retry_wait_seconds: float,
            quick: bool) -> Plan:
    """The plan of a scenario's keys; `quick`: 90% confidence, at most QUICK_SECONDS, no wait before a retry."""
    if quick:
        return Plan(latency.confidence_of(confidence, True), min(min_seconds, QUICK_SECONDS), 0, 0.0)
    return Plan(confidence, min_seconds, min_queries, retry_wait_seconds)


def look(values: list[float], budget: Budget, c: float, spent: Spending, can_pass: bool) -> PercentileVerdict:
    """One look of the sequential plan; before the run's minimum (`can_pass` False) it can FAIL but not PASS,
    and spends nothing of the PASS direction's error."""
    if can_pass:
        return sequential_verdict(values, budget.percentile, budget.limit, c, spent)
    trial = Spending(spent.passes, spent.fails)
    v = sequential_verdict(values, budget.percentile, budget.limit, c, trial)
    spent.fails = trial.fails
    return replace(v, verdict=Verdict.INCONCLUSIVE) if v.verdict is Verdict.PASS else v


@dataclass
class Run:
    """One measured run: the judged values (ms: query latencies, or offline ms per sample of each window), in
    order, and the verdicts of its last look."""

    values: list[float]
    seconds: float
    verdicts: dict[str, PercentileVerdict]
    looks: int
    early: bool                          # stopped before the plan's end: every budget decided
    load: Load
    facts: dict[str, object] = field(default_factory=dict)  # what the scenario reports besides

    def as_json(self) -> dict[str, object]:
        return {"values": len(self.values), "seconds": round(self.seconds, 3), "looks": self.looks,
                "stopped_early": self.early, "load": self.load.as_json(),
                "verdicts": {k: v.verdict for k, v in self.verdicts.items()}}


class Looks:
    """The checkpoints of a run and the verdicts at each: `due(n)` says whether n values call for a look."""

    def __init__(self, budgets: Sequence[Budget], plan: Plan, spending: dict[str, Spending], first: int,
                 end: int) -> None:
        self.budgets, self.plan, self.spending, self.end = budgets, plan, spending, end
        self.at: Iterator[int] = checkpoints(first, end)
        self.next = next(self.at)
        self.count = 0
        self.verdicts: dict[str, PercentileVerdict] = {}

    def due(self, n: int) -> bool:
        if n < self.next:
            return False
        while self.next <= n:
            self.next = next(self.at)
        return True

    def judge(self, values: list[float], can_pass: bool) -> bool:
        """Look at `values`: whether every budget is decided."""
        self.count += 1
        self.verdicts = {b.kind: look(values, b, self.plan.confidence, self.spending.setdefault(b.kind, Spending()),
                                      can_pass) for b in self.budgets}
        return bool(self.budgets) and all(v.verdict is not Verdict.INCONCLUSIVE for v in self.verdicts.values())

    def final(self) -> dict[str, PercentileVerdict]:
        return {k: with_estimate(v) for k, v in self.verdicts.items()}


def end_of(budgets: Sequence[Budget], plan: Plan) -> int:
    """The queries an undecided run goes on to: 1.5x the fewest that can bound the tightest percentile
    (latency's plan), and at least min_queries."""
    return max(plan.min_queries, planned_samples([b.percentile for b in budgets], plan.confidence, 0))



# ------------------------------------------------------------------------------------------ load awareness

@dataclass
class Outcome:
    """The verdicts of one scenario on one data set, after the retry a FAIL under load gets."""

    runs: list[Run]
    verdicts: dict[str, PercentileVerdict]
    retry: dict[str, object] | None = None

    @property
    def final(self) -> Run:
        return self.runs[-1]

    def verdict(self) -> Verdict | None:
        found = {v.verdict for v in self.verdicts.values()}
        return (Verdict.FAIL if Verdict.FAIL in found else Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in found
                else Verdict.PASS if found else None)


def explained_by_load(budget: Budget, run: Run, cpus: int) -> bool:
    """Whether the load could explain a FAIL of `budget` (latency.explained_by_load's rule): whether even the
    run's most favourable value, LOAD_SLOWDOWN x max(1, load / CPUs) times faster, would meet it."""
    load = run.load.total if run.load.total is not None else os.getloadavg()[0]
    return bool(run.values) and min(run.values) / (latency.LOAD_SLOWDOWN * max(1.0, load / cpus)) <= budget.limit


def suspects(run: Run, budgets: Sequence[Budget], cpus: int) -> list[str]:
    """The budgets whose FAIL other work competing could explain."""
    if not run.load.competed():
        return []
    return [b.kind for b in budgets if run.verdicts[b.kind].verdict is Verdict.FAIL and explained_by_load(b, run, cpus)]


def judged(measure: Callable[[dict[str, Spending]], Run], budgets: Sequence[Budget], plan: Plan, *,
           read: Read = latency.runnable, cpus: int | None = None,
           say: Callable[[str], None] = lambda _: None) -> Outcome:
    """Measure and decide; a FAIL that competing work could explain is measured again after waiting (at most
    plan.retry_wait_seconds) for the load to fall, both runs' looks sharing one error budget; a FAIL still
    under competing load is INCONCLUSIVE. `say`: the retry, said before the wait."""
    cpus = cpus or os.cpu_count() or 1
    spending: dict[str, Spending] = {}
    first = measure(spending)
    out = Outcome([first], dict(first.verdicts))
    why = suspects(first, budgets, cpus)
    if not why:
        return out
    competing = f"competing work ({first.load.others:.1f} runnable threads of other processes on {cpus} CPUs)"
    say(latency.retry_said(why, competing, plan.retry_wait_seconds))
    waited = latency.wait_for_quiet(plan.retry_wait_seconds, cpus, read)
    out.retry = {"why": f"{', '.join(why)} FAIL while other work competed (runnable threads of other processes "
                        f"{first.load.others:.1f} on {cpus} CPUs)", **waited}
    again = measure(spending)
    out.runs.append(again)
    out.verdicts = dict(again.verdicts)
    for kind in suspects(again, budgets, cpus):
        out.verdicts[kind] = replace(out.verdicts[kind], verdict=Verdict.INCONCLUSIVE, more_samples=None,
                                     note=f"FAIL measured while other work competed ({again.load.others:.1f} "
                                          f"runnable threads of other processes on {cpus} CPUs), twice (waited "
                                          f"{waited['waited_s']:g} s for the load to fall); rerun on a quiet machine")
    return out


def verdict_doc(v: PercentileVerdict) -> dict[str, object]:
    """A verdict as the report writes it (latency's fields)."""
    return dict(v.as_json())


def gate_verdict(verdicts: Sequence[Verdict | None]) -> Verdict | None:
    """FAIL if any data set failed, else INCONCLUSIVE if any was undecided, else PASS (None: nothing judged)."""
    found = {v for v in verdicts if v is not None}
    return (Verdict.FAIL if Verdict.FAIL in found else Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in found
            else Verdict.PASS if found else None)


def summary(values: Sequence[float]) -> dict[str, float]:
    """The percentiles of query latencies (ms) a scenario reports."""
    from ortbuild.gating.measure.percentiles import nearest_rank

    xs = sorted(values)
    if not xs:
        return {}
    return {"p50_ms": round(nearest_rank(xs, 0.5), 4), "p90_ms": round(nearest_rank(xs, 0.9), 4),
            "p99_ms": round(nearest_rank(xs, 0.99), 4), "max_ms": round(xs[-1], 4),
            "mean_ms": round(sum(xs) / len(xs), 4)}


def entry(name: str, outcome: Outcome) -> dict[str, object]:
    """The report of one data set: what the final run measured, its verdicts, the retry and the notes."""
    run = outcome.final
    out: dict[str, object] = {"name": name, **run.facts, "seconds": round(run.seconds, 3), "looks": run.looks,
                              "stopped_early": run.early, "load": run.load.as_json(),
                              "verdicts": [{"kind": k, **verdict_doc(v)} for k, v in outcome.verdicts.items()]}
    if outcome.retry:
        out["retry"] = outcome.retry
        out["attempts"] = [r.as_json() for r in outcome.runs]
    notes = [f"{k}: {v.note}" for k, v in outcome.verdicts.items() if v.verdict is Verdict.INCONCLUSIVE and v.note]
    if run.load.competed():
        notes.append(f"other work competed: {run.load.others:.1f} runnable threads of other processes")
    if notes:
        out["note"] = "; ".join(notes)
    v = outcome.verdict()
    out["verdict"] = v if v is not None else "-"
    return out
