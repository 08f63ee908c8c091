"""The `server` gate: a latency percentile at a query rate, as MLPerf Server ([targets.X.latency.server]).

On every golden data set with a table for it (the target's, or the data set's own
[targets.X.latency.data_sets.NAME.server] over it: Latency.scenario), Poisson arrivals at `qps` from a fixed seed
are queued to a pool of concurrent `run` calls on one session (ortbuild.gating.measure.loadgen.server); each query's
latency runs from its scheduled arrival to its completion, so queueing counts. `p99_ms` / `p90_ms` are judged by
latency's distribution-free binomial bounds with early stopping, and a FAIL under competing load is retried, then
INCONCLUSIVE (loadgen.judged).

`ortbuild test --find-peak` searches the highest rate that meets the budgets, as LoadGen's peak finder does:
from the single-stream estimate (1000 / the median single run, in ms), doubling or halving until a PASS and a
non-PASS bracket the peak, then bisecting until they are within `peak_precision` of each other (at most
MAX_PEAK_STEPS server runs). Each step is a full server run with its own verdict at the target's confidence; an
INCONCLUSIVE step counts as not passing. The report lists every step (qps, p99, p90, verdict) to plot latency
against the rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ortbuild.gating.measure import loadgen
from ortbuild.gating.measure.engine import gate_verdict
from ortbuild.gating.measure.load_verdicts import Outcome, Run, end_of, entry, judged, scenario_plan, summary
from ortbuild.gating.measure.percentiles import Budget, Spending
from ortbuild.gating.measure.sampling import Plan
from ortbuild.project.sections import Server
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.protocol import Context


def budgets_of(srv: Server) -> list[Budget]:
    pairs = (("p90", 0.9, srv.p90_ms), ("p99", 0.99, srv.p99_ms))
    return [Budget(kind, p, float(ms)) for kind, p, ms in pairs if ms is not None]


HOLD = 0.9  # --find-peak: a rate is held when its queries complete at >= 90% of it


def at_rate(call: loadgen.Call, qps: float, srv: Server, budgets: list[Budget], plan: Plan,
            say: Callable[[str], None] = lambda _: None) -> Outcome:
    """One server run at `qps`, judged, with the retry a FAIL under load gets (`say`: said before it)."""

    def measure(spending: dict[str, Spending]) -> Run:
        return loadgen.server(call, qps, budgets, plan, spending, seed=srv.seed, workers=srv.workers)

    return judged(measure, budgets, plan, say=say)


def find_peak(run_at: Callable[[float], Outcome], start: float, precision: float,
              say: Callable[[str], None] = lambda _: None) -> dict[str, object]:
    """The highest rate whose run PASSes and is held (its queries completed at no less than HOLD of the offered
    rate: a budget far above the run's length would otherwise pass any rate, the queue growing unseen), by
    bracketing from `start` and bisecting to `precision`."""
    tried: list[dict[str, object]] = []
    lo: float | None = None
    hi: float | None = None

    def step(qps: float) -> bool:
        say(f"--find-peak: step {len(tried) + 1} of at most {loadgen.MAX_PEAK_STEPS}: a server run at {qps:.0f} QPS"
            + (f" (the last, {tried[-1]['qps']:.0f} QPS: {tried[-1]['verdict']}"
               f"{'' if tried[-1]['held'] else ', not held'})" if tried else ""))
        outcome = run_at(qps)
        s = summary(outcome.final.values)
        v = outcome.verdict()
        completed = outcome.final.facts.get("completed_qps")
        held = isinstance(completed, int | float) and completed >= HOLD * qps
        tried.append({"qps": round(qps, 3), "achieved_qps": outcome.final.facts.get("achieved_qps"),
                      "completed_qps": completed, "held": held, "p90_ms": s.get("p90_ms"), "p99_ms": s.get("p99_ms"),
                      "verdict": v if v is not None else "-"})
        return v is Verdict.PASS and held

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


def _ms(x: object) -> str:
    return f"{x:.3g}" if isinstance(x, int | float) else "-"


def failure_lines(job: str, name: str, qps: float, outcome: Outcome, budgets: list[Budget]) -> list[str]:
    out = []
    for b in budgets:
        v = outcome.verdicts[b.kind]
        if v.verdict is Verdict.FAIL:
            out.append(f"server: {job} {b.kind} ({name}) at {qps:g} QPS {v.observed:.3f} ms (at least "
                       f"{v.lower:.3f} ms with {v.confidence:.0%} confidence) > budget {b.limit:g} ms "
                       f"({v.exceeding} of {v.samples} queries above it, latency from scheduled arrival)")
    return out


def budget_of(srv: Server) -> dict[str, object]:
    return {"qps": srv.qps, **{b.kind + "_ms": b.limit for b in budgets_of(srv)}}


def gate(ctx: Context) -> tuple[Verdict | Literal["-"], dict[str, object], list[str]]:
    gates = ctx.job.settings.gates
    if gates is None:
        return "-", {}, []
    lat = gates.latency
    runs = [(i, ds, srv) for i, ds in enumerate(ctx.golden.sets)
            if (srv := lat.scenario("server", ds.name)) is not None]
    if not runs:  # no table for this scenario, the target's or this model's data sets'
        return loadgen.no_data_set(lat, "server")
    model = ctx.open()
    entries: list[dict[str, object]] = []
    lines: list[str] = []
    found: list[Verdict | None] = []
    for i, ds, srv in runs:
        budgets = budgets_of(srv)
        plan = scenario_plan(lat.confidence, srv.min_seconds, srv.min_queries, lat.retry_wait_seconds, ctx.quick)

        def run(feed: dict[str, Any] = ds.inputs) -> object:
            return model.run(feed)

        single = loadgen.warm(run, lat.warmup_runs)
        check, call = loadgen.checked(ctx, i, run)
        ctx.progress(ctx.job.name, said_before(ds.name, float(srv.qps), budgets, plan, single, srv.workers))
        outcome = at_rate(call, float(srv.qps), srv, budgets, plan,
                          say=ctx.teller(f"server on {ds.name}"))
        e = {**entry(ds.name, outcome), **summary(outcome.final.values),
             "single_stream_p50_ms": round(single[len(single) // 2], 4)}
        lines += failure_lines(ctx.job.name, ds.name, float(srv.qps), outcome, budgets)
        found.append(outcome.verdict())
        if ctx.find_peak:
            if budgets:
                def at(q: float, call: loadgen.Call = call, srv: Server = srv, budgets: list[Budget] = budgets,
                       plan: Plan = plan) -> Outcome:
                    return at_rate(call, q, srv, budgets, plan)

                e["peak"] = find_peak(at, 1e3 / single[len(single) // 2], srv.peak_precision,
                                      lambda text: ctx.progress(ctx.job.name, text))
            else:
                e["peak"] = {"qps": None, "note": "no p99_ms or p90_ms: nothing to search the peak against"}
        # outputs under load: the peak search's runs (the highest loads) are checked too, after them
        found.append(loadgen.judge_outputs(check, ctx.job.name, e, lines))
        entries.append(e)
    srv = runs[0][2]  # the summary and the figures: the first judged data set's
    plan = scenario_plan(lat.confidence, srv.min_seconds, srv.min_queries, lat.retry_wait_seconds, ctx.quick)
    limits = {b.kind + "_ms": b.limit for b in budgets_of(srv)}
    first = entries[0]
    said = ", ".join(f"{k.removesuffix('_ms')} {_ms(first.get(k))}/{v:g} ms" for k, v in limits.items()) or \
        f"p99 {_ms(first.get('p99_ms'))} ms"
    said += f" at {srv.qps:g} QPS"
    peak = first.get("peak")
    if isinstance(peak, dict) and isinstance(peak.get("qps"), int | float):
        said += f", peak {peak['qps']:.0f} QPS"
    verdict, section = loadgen.section(
        gate_verdict(found), entries, said,
        budget_of(lat.server) if lat.server is not None else {},
        per_data_set={ds.name: budget_of(s) for _, ds, s in runs},
        qps=srv.qps, budgets=limits, seed=srv.seed, confidence=plan.confidence,
        min_seconds=plan.min_seconds, min_queries=plan.min_queries, quick=ctx.quick)
    return verdict, section, lines


def said_before(name: str, qps: float, budgets: list[Budget], plan: Plan, single: list[float],
                workers: int) -> str:
    """The line said before the queries at `qps`: what each budget needs and about how long, at the rate or at the
    pace of the single-stream runs (`single`, ms) over the workers, whichever is slower."""
    run_s = single[len(single) // 2] / 1e3 if single else 0.0
    pool = workers or loadgen.cpus()
    end = max(end_of(budgets, plan), math.ceil(qps * plan.min_seconds))

    def seconds_for(n: int) -> float:
        return max(plan.min_seconds, n / qps, n * run_s / pool)

    return loadgen.plan_line(f"server on {name} (Poisson arrivals at {qps:g} QPS, {run_s * 1e3:.3g} ms a run)",
                             budgets, plan, end, seconds_for)


def html(section: dict[str, object]) -> list[str]:
    """The server gate's part of report.html: each data set's percentiles at the rate, and where `--find-peak`
    searched, the peak and a plot of p99 (and p90) latency against the offered QPS, each step coloured by its
    verdict (the budget a dashed line)."""
    from html import escape as e

    verdict = str(section.get("verdict", "-"))
    given = section.get("budget")
    target: dict[str, object] = given if isinstance(given, dict) else {}
    own = target.get("data_sets")
    per_data_set: dict[str, object] = own if isinstance(own, dict) else {}
    out = [f"<h3>server: <span class={e(verdict)}>{e(verdict)}</span></h3>",
           f"<p>{e(str(section.get('summary', '')))}; Poisson arrivals, seed {e(str(section.get('seed')))}, latency "
           f"from scheduled arrival; confidence {e(str(section.get('confidence')))}</p>"]
    sets = section.get("data_sets")
    for d in sets if isinstance(sets, list) else []:
        out.append(f"<p>{e(str(d.get('name')))}: p50 {e(str(d.get('p50_ms')))} ms, p90 {e(str(d.get('p90_ms')))} ms, "
                   f"p99 {e(str(d.get('p99_ms')))} ms over {e(str(d.get('judged', '?')))} "
                   f"queries ({e(str(d.get('achieved_qps', '?')))} QPS achieved) {e(str(d.get('note', '')))}</p>")
        peak = d.get("peak")
        if isinstance(peak, dict) and isinstance(peak.get("tried"), list) and peak["tried"]:
            out.append(f"<p>--find-peak: highest passing rate <b>{e(str(peak.get('qps')))} QPS</b> "
                       f"{e(str(peak.get('note', '')))}</p>")
            mine = per_data_set.get(str(d.get("name")), target)  # its own budget, else the target's
            limits = {k: v for k, v in mine.items() if k.endswith("_ms")} if isinstance(mine, dict) else {}
            out.append(_plot(peak["tried"], limits))
    return out


def _plot(tried: list[dict[str, object]], budgets: dict[str, object]) -> str:
    """An inline SVG of latency (p99 dots, p90 rings) against offered QPS, a dashed line per budget."""
    pts = [(float(str(t["qps"])), t.get("p99_ms"), t.get("p90_ms"), str(t.get("verdict"))) for t in tried]
    ys = [float(v) for _, a, b, _ in pts for v in (a, b) if isinstance(v, int | float)]
    ys += [float(v) for v in budgets.values() if isinstance(v, int | float)]
    w, h, pad = 480, 200, 40
    xmax, ymax = max(p[0] for p in pts) * 1.05 or 1.0, (max(ys) if ys else 1.0) * 1.1 or 1.0

    def x(q: float) -> float:
        return pad + q / xmax * (w - 2 * pad)

    def y(ms: float) -> float:
        return h - pad + 10 - ms / ymax * (h - pad - 10)

    colour = {str(Verdict.PASS): "#2a8a2a", str(Verdict.FAIL): "#c03030"}
    parts = [f'<svg width="{w}" height="{h}" role="img" aria-label="latency against offered QPS">',
             f'<line x1="{pad}" y1="{h - pad + 10}" x2="{w - pad}" y2="{h - pad + 10}" stroke="#888"/>',
             f'<text x="{w - pad}" y="{h - 8}" text-anchor="end" font-size="11">QPS (max {xmax / 1.05:.4g})</text>',
             f'<text x="4" y="12" font-size="11">ms (max {ymax / 1.1:.4g})</text>']
    for kind, limit in budgets.items():
        if isinstance(limit, int | float):
            parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y(limit):.1f}" y2="{y(limit):.1f}" stroke="#c03030" '
                         f'stroke-dasharray="4 3"/><text x="{pad + 2}" y="{y(limit) - 3:.1f}" font-size="10">'
                         f'{kind} budget {limit:g}</text>')
    for q, p99, p90, v in pts:
        c = colour.get(v, "#c9a000")
        if isinstance(p99, int | float):
            parts.append(f'<circle cx="{x(q):.1f}" cy="{y(p99):.1f}" r="4" fill="{c}"><title>{q:g} QPS: p99 {p99} ms, '
                         f'{v}</title></circle>')
        if isinstance(p90, int | float):
            parts.append(f'<circle cx="{x(q):.1f}" cy="{y(p90):.1f}" r="4" fill="none" stroke="{c}"/>')
    parts.append(f'<text x="{w - pad}" y="12" text-anchor="end" font-size="10">filled: p99, ring: p90; green PASS, '
                 'red FAIL, amber undecided or not held</text>')
    return "".join(parts) + "</svg>"
