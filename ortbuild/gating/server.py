"""The `server` gate: a latency percentile at a query rate, as MLPerf Server ([targets.X.latency.server]).

On every golden data set, Poisson arrivals at `qps` from a fixed seed are queued to a pool of concurrent `run`
calls on one session (ortbuild.gating.loadgen.server); each query's latency runs from its scheduled arrival to
its completion, so queueing counts. `p99_ms` / `p90_ms` are judged by latency's distribution-free binomial
bounds with early stopping, and a FAIL under competing load is retried, then INCONCLUSIVE (loadgen.judged).

`ortbuild test --find-peak` searches the highest rate that meets the budgets, as LoadGen's peak finder does:
from the single-stream estimate (1000 / the median single run, in ms), doubling or halving until a PASS and a
non-PASS bracket the peak, then bisecting until they are within `peak_precision` of each other (at most
MAX_PEAK_STEPS server runs). Each step is a full server run with its own verdict at the target's confidence; an
INCONCLUSIVE step counts as not passing. The report lists every step (qps, p99, p90, verdict) to plot latency
against the rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from ortbuild.gating import loadgen
from ortbuild.gating.percentiles import Budget, Spending
from ortbuild.project.sections import Server
from ortbuild.status import Verdict


def budgets_of(srv: Server) -> list[Budget]:
    pairs = (("p90", 0.9, srv.p90_ms), ("p99", 0.99, srv.p99_ms))
    return [Budget(kind, p, float(ms)) for kind, p, ms in pairs if ms is not None]


def at_rate(call: loadgen.Call, qps: float, srv: Server, budgets: list[Budget], plan: loadgen.Plan) -> loadgen.Outcome:
    """One server run at `qps`, judged, with the retry a FAIL under load gets."""

    def measure(spending: dict[str, Spending]) -> loadgen.Run:
        return loadgen.server(call, qps, budgets, plan, spending, seed=srv.seed, workers=srv.workers)

    return loadgen.judged(measure, budgets, plan)


def find_peak(run_at: Callable[[float], loadgen.Outcome], start: float, precision: float,
              say: Callable[[str], None] = lambda _: None) -> dict[str, object]:
    """The highest rate whose run PASSes, by bracketing from `start` and bisecting to `precision`."""
    tried: list[dict[str, object]] = []
    lo: float | None = None
    hi: float | None = None

    def step(qps: float) -> bool:
        say(f"--find-peak: server run at {qps:.3g} QPS (step {len(tried) + 1})")
        outcome = run_at(qps)
        s = loadgen.summary(outcome.final.values)
        v = outcome.verdict()
        tried.append({"qps": round(qps, 3), "achieved_qps": outcome.final.facts.get("achieved_qps"),
                      "p90_ms": s.get("p90_ms"), "p99_ms": s.get("p99_ms"), "verdict": v if v is not None else "-"})
        return v is Verdict.PASS

    qps = start
    while len(tried) < loadgen.MAX_PEAK_STEPS and (lo is None or hi is None):
        if step(qps):
            lo, qps = qps, qps * 2
        else:
            hi, qps = qps, qps / 2
    while lo is not None and hi is not None and (hi - lo) / lo > precision and len(tried) < loadgen.MAX_PEAK_STEPS:
        mid = (lo + hi) / 2
        if step(mid):
            lo = mid
        else:
            hi = mid
    out: dict[str, object] = {"qps": None if lo is None else round(lo, 3), "lowest_not_passing": hi,
                              "start_qps": round(start, 3), "precision": precision,
                              "tried": sorted(tried, key=lambda t: float(str(t["qps"])))}
    if lo is None:
        out["note"] = f"no rate passed down to {qps * 2:.3g} QPS"
    elif hi is None:
        out["note"] = f"every rate passed up to {lo:.3g} QPS (the search stopped after {len(tried)} runs)"
    elif (hi - lo) / lo > precision:
        out["note"] = f"stopped after {len(tried)} runs, the peak between {lo:.3g} and {hi:.3g} QPS"
    return out


def failure_lines(job: str, name: str, qps: float, outcome: loadgen.Outcome, budgets: list[Budget]) -> list[str]:
    out = []
    for b in budgets:
        v = outcome.verdicts[b.kind]
        if v.verdict is Verdict.FAIL:
            out.append(f"server: {job} {b.kind} ({name}) at {qps:g} QPS {v.observed:.3f} ms (at least "
                       f"{v.lower:.3f} ms with {v.confidence:.0%} confidence) > budget {b.limit:g} ms "
                       f"({v.exceeding} of {v.samples} queries above it, latency from scheduled arrival)")
    return out


def gate(ctx: loadgen.Context) -> tuple[Verdict | Literal["-"], dict[str, object], list[str]]:
    gates = ctx.job.settings.gates
    srv = gates.latency.server if gates is not None else None
    if gates is None or srv is None:
        return "-", {}, []
    lat = gates.latency
    budgets = budgets_of(srv)
    plan = loadgen.plan_of(lat.confidence, srv.min_seconds, srv.min_queries, lat.retry_wait_seconds, ctx.quick)
    model = ctx.open()
    entries: list[dict[str, object]] = []
    lines: list[str] = []
    found: list[Verdict | None] = []
    for ds in ctx.golden.sets:
        def call(feed: dict[str, Any] = ds.inputs) -> object:
            return model.run(feed)

        single = loadgen.warm(call, lat.warmup_runs)
        ctx.progress(ctx.job.name, f"server on {ds.name}: Poisson arrivals at {srv.qps:g} QPS, at least "
                                   f"{plan.min_seconds:g} s before a PASS")
        outcome = at_rate(call, float(srv.qps), srv, budgets, plan)
        e = {**loadgen.entry(ds.name, outcome), **loadgen.summary(outcome.final.values),
             "single_stream_p50_ms": round(single[len(single) // 2], 4)}
        lines += failure_lines(ctx.job.name, ds.name, float(srv.qps), outcome, budgets)
        found.append(outcome.verdict())
        if ctx.find_peak:
            if budgets:
                e["peak"] = find_peak(lambda q: at_rate(call, q, srv, budgets, plan), 1e3 / single[len(single) // 2],
                                      srv.peak_precision, lambda text: ctx.progress(ctx.job.name, text))
            else:
                e["peak"] = {"qps": None, "note": "no p99_ms or p90_ms: nothing to search the peak against"}
        entries.append(e)
    verdict = loadgen.gate_verdict(found)
    section: dict[str, object] = {
        "qps": srv.qps, "budgets": {b.kind + "_ms": b.limit for b in budgets}, "seed": srv.seed,
        "confidence": plan.confidence, "min_seconds": plan.min_seconds, "min_queries": plan.min_queries,
        "quick": ctx.quick, "data_sets": entries}
    return (verdict if verdict is not None else "-"), section, lines
