"""The `multi_stream` gate: several concurrent streams, as MLPerf MultiStream ([targets.X.latency.multi_stream]).

On every golden data set with a table for it (the target's, or the data set's own
[targets.X.latency.data_sets.NAME.multi_stream] over it: Latency.scenario), each query runs `streams` samples at
once on one session (a pool of as many workers); the next query is issued when the last completes, and a query's
latency is its slowest sample's
(ortbuild.gating.measure.loadgen.multi_stream). `p99_ms` is judged by latency's distribution-free binomial bounds with
early stopping; a FAIL under competing load is retried, then INCONCLUSIVE (loadgen.judged).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from ortbuild.gating.measure import loadgen
from ortbuild.gating.measure.engine import gate_verdict
from ortbuild.gating.measure.load_verdicts import Run, end_of, entry, judged, scenario_plan, summary
from ortbuild.gating.measure.percentiles import Budget, Spending
from ortbuild.gating.measure.sampling import Plan
from ortbuild.project.sections import MultiStream
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.protocol import Context


def budget_of(ms: MultiStream) -> dict[str, object]:
    return {"streams": ms.streams, **({"p99_ms": float(ms.p99_ms)} if ms.p99_ms is not None else {})}


def gate(ctx: Context) -> tuple[Verdict | Literal["-"], dict[str, object], list[str]]:
    gates = ctx.job.settings.gates
    if gates is None:
        return "-", {}, []
    lat = gates.latency
    runs = [(i, ds, ms) for i, ds in enumerate(ctx.golden.sets)
            if (ms := lat.scenario("multi_stream", ds.name)) is not None]
    if not runs:  # no table for this scenario, the target's or this model's data sets'
        return loadgen.no_data_set(lat, "multi_stream")
    model = ctx.open()
    entries: list[dict[str, object]] = []
    lines: list[str] = []
    found: list[Verdict | None] = []
    for i, ds, ms in runs:
        budgets = [Budget("p99", 0.99, float(ms.p99_ms))] if ms.p99_ms is not None else []
        plan = scenario_plan(lat.confidence, ms.min_seconds, ms.min_queries, lat.retry_wait_seconds, ctx.quick)

        def run(feed: dict[str, Any] = ds.inputs) -> object:
            return model.run(feed)

        check, call = loadgen.checked(ctx, i, run)

        def measure(spending: dict[str, Spending], call: loadgen.Call = call, streams: int = ms.streams,
                    budgets: list[Budget] = budgets, plan: Plan = plan) -> Run:
            return loadgen.multi_stream(call, streams, budgets, plan, spending)

        single = loadgen.warm(run, lat.warmup_runs)
        query_s = single[len(single) // 2] / 1e3 * math.ceil(ms.streams / loadgen.cpus())  # a query: its streams

        def seconds_for(n: int, query_s: float = query_s, plan: Plan = plan) -> float:
            return max(plan.min_seconds, n * query_s)

        ctx.progress(ctx.job.name, loadgen.plan_line(
            f"multi_stream on {ds.name} ({ms.streams} streams, {query_s * 1e3:.3g} ms a query)", budgets, plan,
            end_of(budgets, plan), seconds_for))
        outcome = judged(measure, budgets, plan,
                                 say=ctx.teller(f"multi_stream on {ds.name}"))
        e = {**entry(ds.name, outcome), **summary(outcome.final.values),
             "single_stream_p50_ms": round(single[len(single) // 2], 4)}
        entries.append(e)
        found.append(outcome.verdict())
        for b in budgets:
            v = outcome.verdicts[b.kind]
            if v.verdict is Verdict.FAIL:
                lines.append(f"multi_stream: {ctx.job.name} {b.kind} ({ds.name}) of {ms.streams} streams "
                             f"{v.observed:.3f} ms (at least {v.lower:.3f} ms with {v.confidence:.0%} confidence) > "
                             f"budget {b.limit:g} ms ({v.exceeding} of {v.samples} queries above it, a query's "
                             "latency its slowest sample's)")
        found.append(loadgen.judge_outputs(check, ctx.job.name, e, lines))
    ms = runs[0][2]  # the summary and the figures: the first judged data set's
    plan = scenario_plan(lat.confidence, ms.min_seconds, ms.min_queries, lat.retry_wait_seconds, ctx.quick)
    limits = {"p99_ms": float(ms.p99_ms)} if ms.p99_ms is not None else {}
    p99 = entries[0].get("p99_ms")
    said = f"p99 {p99:.3g}" if isinstance(p99, int | float) else "p99 -"
    said += f"/{ms.p99_ms:g}" if ms.p99_ms is not None else ""
    verdict, section = loadgen.section(
        gate_verdict(found), entries, f"{said} ms, {ms.streams} streams",
        budget_of(lat.multi_stream) if lat.multi_stream is not None else {},
        per_data_set={ds.name: budget_of(m) for _, ds, m in runs},
        streams=ms.streams, budgets=limits, confidence=plan.confidence, min_seconds=plan.min_seconds,
        min_queries=plan.min_queries, quick=ctx.quick)
    return verdict, section, lines
