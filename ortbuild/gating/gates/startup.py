"""The cold start and memory gates: import + load + first run, and the peak RSS, of fresh processes that open the
artifact through its generated loader (ortbuild.gating.measure.startup). One measurement serves both gates: the
first of them to run measures for every budget the target sets and reports every failure; the other reads it."""

from __future__ import annotations

from ortbuild.gating.protocol import NOT_RUN, Context, Gate, Judged

MEASURED = "startup"   # the Context's memo of the one measurement


def _measure(ctx: Context, kind: str) -> Judged:
    from ortbuild.artifact import loaders
    from ortbuild.gating.measure import sampling, startup

    gates = ctx.gates
    budgets = {k: b for k, b in gates.startup_budgets.items() if k in ctx.tester.judged}
    if kind not in budgets:
        return Judged(NOT_RUN, {}, [])
    lines: list[str] = []
    if MEASURED not in ctx.memo:
        job = ctx.job
        ctx.progress(job.name, f"cold start and peak memory in fresh processes (looks at {startup.FIRST_LOOK}, "
                               f"then doubling, at most {startup.MAX_PROCESSES})")
        outcome = startup.measure(loaders.python_path(ctx.folder, job.model.name), ctx.folder,
                                  ctx.golden.sets[0].inputs, ctx.secret, budgets,
                                  sampling.confidence_of(gates.latency.confidence, ctx.quick))
        ctx.memo[MEASURED] = outcome
        lines = startup.failure_lines(job.name, job.target.name, outcome, budgets)
    found = ctx.memo[MEASURED]
    assert isinstance(found, startup.Outcome)
    return Judged(startup.verdict_of(found, kind), dict(startup.summary(found, budgets)), lines)


def cold_start(ctx: Context) -> Judged:
    return _measure(ctx, "cold_start")


def memory(ctx: Context) -> Judged:
    return _measure(ctx, "memory")


COLD_START = Gate("cold_start", "import + load + first run in fresh processes", cold_start,
                  lambda g: "cold_start" in g.startup_budgets, timed=True)
MEMORY = Gate("memory", "peak RSS of a fresh process that loads and runs the artifact", memory,
              lambda g: "memory" in g.startup_budgets, timed=True)
