"""The verdicts of the load scenarios (ortbuild.gating.measure.loadgen): a run as an attempt of the sampling engine
(ortbuild.gating.measure.engine: its looks, the load-aware retry and the outcome; the plan is
ortbuild.gating.measure.sampling's), and the report of one data set. docs/testing.md, "Load scenarios".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from ortbuild.gating.measure.engine import Retried, retried
from ortbuild.gating.measure.load import Load, Read, explained, runnable, wait_for_quiet
from ortbuild.gating.measure.percentiles import Budget, PercentileVerdict, Spending, nearest_rank, planned_samples
from ortbuild.gating.measure.sampling import Plan, plan_of
from ortbuild.status import Verdict

QUICK_SECONDS = 2.0         # --quick: the minimum run, at most this


def scenario_plan(confidence: float, min_seconds: float, min_queries: int, retry_wait_seconds: float,
                  quick: bool) -> Plan:
    """The plan of a scenario's keys (sampling.plan_of; `quick`: 90% confidence, at most QUICK_SECONDS, no wait
    before a retry)."""
    return plan_of(confidence, 0, min_seconds, retry_wait_seconds, quick, min_queries=min_queries,
                   quick_seconds=QUICK_SECONDS)


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

    def suspects(self, budgets: Sequence[Budget], cpus: int) -> list[str]:
        """The budgets whose FAIL other work competing could explain (load.explained's rule)."""
        if not self.load.competed():
            return []
        total = self.load.total if self.load.total is not None else os.getloadavg()[0]
        return [b.kind for b in budgets if self.verdicts[b.kind].verdict is Verdict.FAIL
                and explained(self.values, b.limit, total, cpus)]

    def conditions(self, cpus: int) -> tuple[str, str, str]:
        others = f"{self.load.others or 0.0:.1f}"
        return (f"competing work ({others} runnable threads of other processes on {cpus} CPUs)",
                f"while other work competed (runnable threads of other processes {others} on {cpus} CPUs)",
                f"while other work competed ({others} runnable threads of other processes on {cpus} CPUs)")


Outcome = Retried[Run]  # a scenario's on one data set


def end_of(budgets: Sequence[Budget], plan: Plan) -> int:
    """The queries an undecided run goes on to: 1.5x the fewest that can bound the tightest percentile
    (latency's plan), and at least min_queries."""
    return max(plan.min_queries, planned_samples([b.percentile for b in budgets], plan.confidence, 0))


def judged(measure: Callable[[dict[str, Spending]], Run], budgets: Sequence[Budget], plan: Plan, *,
           read: Read = runnable, cpus: int | None = None, say: Callable[[str], None] = lambda _: None) -> Outcome:
    """The engine's measure and decide (engine.retried), waiting for the load `read` says to fall before a retry."""
    n = cpus or os.cpu_count() or 1
    return retried(measure, budgets, plan.retry_wait_seconds, n, partial(wait_for_quiet, read=read), say)


def verdict_doc(v: PercentileVerdict) -> dict[str, object]:
    """A verdict as the report writes it (latency's fields)."""
    return dict(v.as_json())


def summary(values: Sequence[float]) -> dict[str, float]:
    """The percentiles of query latencies (ms) a scenario reports."""
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
        out["attempts"] = [r.as_json() for r in outcome.attempts]
    notes = [f"{k}: {v.note}" for k, v in outcome.verdicts.items() if v.verdict is Verdict.INCONCLUSIVE and v.note]
    if run.load.competed():
        notes.append(f"other work competed: {run.load.others:.1f} runnable threads of other processes")
    if notes:
        out["note"] = "; ".join(notes)
    v = outcome.verdict()
    out["verdict"] = v if v is not None else "-"
    return out
