"""The latency gate: single-stream latency of every golden data set through the generated loader (one session
per artifact), each against its budgets, the target's or its own `data_sets.NAME` table over them, absolute
percentiles and `faster_than` another target, with the outputs under load checked against the golden run's
(ortbuild.gating.measure.sampling: the sampling engine; ortbuild.gating.measure.compliance)."""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import TYPE_CHECKING

from ortbuild import paths
from ortbuild.errors import ConfigError
from ortbuild.gating import timing_records
from ortbuild.gating.protocol import NOT_RUN, Context, Gate, Judged
from ortbuild.status import JobStatus, Verdict

if TYPE_CHECKING:
    from pathlib import Path

    from ortbuild.artifact import golden
    from ortbuild.gating.measure import percentiles, sampling
    from ortbuild.project.plan import Job


def target_data_sets(ctx: Context, job: Job, g: golden.Golden) -> list[str]:
    """The golden data set names of every model of the job's target (this model's from its golden data)."""
    from ortbuild.project import data

    names = [d.name for d in g.sets]
    for m in job.target.models:
        inputs = ctx.project.models[m].inputs
        try:
            found = [d.name for d in data.datasets(inputs)] if inputs.is_dir() else ["test_data_set_0"]
        except ConfigError:  # that model's own test reports its broken inputs
            found = []
        names += [n for n in found if n not in names]
    return names


def check_data_sets(ctx: Context) -> None:
    """`latency.data_sets` names golden data sets of the target's models (its budgets and its load scenarios
    alike): checked before any gate, since a name given only for a scenario is read by that gate alone."""
    from ortbuild.project.checker import did_you_mean

    gates = ctx.job.settings.gates
    if gates is None or not gates.latency.data_sets:
        return
    known = target_data_sets(ctx, ctx.job, ctx.golden)
    for name in gates.latency.data_sets:  # a table may name another model's data set, not a typo
        if name not in known:
            raise ConfigError(str(ctx.project.file), f"targets.{ctx.job.target.name}.latency.data_sets.{name}",
                              f"no model of this target has a golden data set '{name}'{did_you_mean(name, known)}",
                              f"the data sets are: {', '.join(known)} (an .npz of inputs is test_data_set_0; an "
                              "inputs directory holds one test_data_set_N/ per shape)")


def run(ctx: Context) -> Judged:
    """Every golden data set timed (one session per artifact), each against its budgets. The section is the
    first data set's (as reports have always read it), with `data_sets` listing each."""
    import math

    from ortbuild.artifact import loaders
    from ortbuild.gating.measure import percentiles, sampling
    from ortbuild.gating.measure.compliance import Checker

    job, module, g, built, gates = ctx.job, ctx.module, ctx.golden, ctx.built, ctx.gates
    assert module is not None
    ran = {ds.name: out for ds, out in zip(g.sets, ctx.outputs, strict=True)}  # compliance: the golden run's
    lat = gates.latency
    opens: dict[str, tuple[ModuleType, Path]] = {job.target.name: (module, ctx.folder)}
    ft = lat.faster_than
    ref_problem = None
    if ft is not None:
        ref_target = ctx.project.targets[ft.target]
        ref_build = built.get(f"{ft.target}/{job.model.name}")
        if ref_build is None or ref_build.status in (JobStatus.FAILED, JobStatus.SKIPPED, JobStatus.PORTABLE):
            why = ref_build.reason if ref_build is not None else "not built"
            ref_problem = (f"{ft.target} cannot run here ({why}); "
                           f"relative budgets compare targets of one runtime ({ref_target.runtime_text})")
        else:
            rfolder = paths.inside(ctx.dist, ft.target, job.model.name)
            opens[ft.target] = (loaders.import_python_loader(loaders.python_path(rfolder, job.model.name)), rfolder)
    sessions = {}
    session_ms: dict[str, float] = {}
    for name, (mod, where) in opens.items():  # verify + decrypt + InferenceSession, timed apart
        t0 = time.perf_counter()
        sessions[name] = mod.load(key=ctx.secret, folder=where)
        session_ms[name] = (time.perf_counter() - t0) * 1e3
    plan = sampling.plan_of(lat.confidence, lat.min_samples, lat.min_seconds, lat.retry_wait_seconds, ctx.quick)
    mine = job.target.name
    threads = job.settings.session.intra_op_num_threads
    entries: list[timing_records.DataSetLatency] = []
    lines: list[str] = []
    verdicts: list[str] = []  # of every budget of every data set
    for ds in g.sets:
        relative = (ft.target, ft.ratio) if ft is not None and ref_problem is None else (None, 0.0)
        budgets = percentiles.budgets_of(lat.budgets(ds.name), *relative)
        calls = {name: (lambda s=s, feed=ds.inputs: s.run(feed)) for name, s in sessions.items()}
        warmed = sampling.warm_up(calls, lat.warmup_runs, math.inf if budgets else sampling.BRIEF_SECONDS)
        ctx.progress(job.name, sampling.said_before(ds.name, budgets, plan, warmed))
        check = Checker.for_latency(ran[ds.name], ds.name, lambda o: gates.accuracy_rule(job.settings.precision, o),
                                    plan.min_samples or sampling.FIRST_LOOK)
        outcome = sampling.gate(calls, mine, budgets, plan, seen={mine: check.observer()},
                                say=ctx.teller(f"latency on {ds.name}"))
        entry = data_set_entry(job.name, mine, ds.name, outcome, budgets, session_ms, warmed.first_ms, lines)
        check.judge(job.name, entry, lines)
        if ft is not None and ref_problem:
            entry["relative"] = {"target": ft.target, "ratio": ft.ratio, "verdict": Verdict.SKIPPED,
                                 "note": ref_problem}
        verdicts += [v["verdict"] for v in entry["verdicts"]]
        if "observed_ratio" in entry.get("relative", {}):
            verdicts.append(entry["relative"]["verdict"])
        entries.append(entry)
    notes = [(f"{e['name']}: " if len(entries) > 1 else "") + e["note"] for e in entries if e.get("note")]
    out: timing_records.LatencyDoc = {**entries[0], "data_set": entries[0]["name"], "data_sets": entries,
                                      "threads": threads or f"ORT default ({os.cpu_count()} CPUs)",
                                      "confidence": plan.confidence, "quick": ctx.quick}
    del out["name"]
    out["compliance"] = Checker.merge([e["compliance"] for e in entries])
    out.pop("note", None)
    if notes:
        out["note"] = "; ".join(notes)
    verdict = (Verdict.FAIL if lines else Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in verdicts
               else Verdict.PASS if verdicts else NOT_RUN)
    return Judged(verdict, dict(out), lines)


def data_set_entry(job: str, mine: str, name: str, outcome: sampling.Outcome, budgets: list[percentiles.Budget],
                   session_ms: dict[str, float], first_ms: dict[str, float],
                   lines: list[str]) -> timing_records.DataSetLatency:
    """The report of one data set's timings and verdicts (`mine`: the tested artifact's series, `job`: how
    failure lines name it); its failure lines go to `lines`."""
    from ortbuild.gating.measure import sampling

    final = outcome.final
    series = final.series[mine]
    series.session_ms, series.first_run_ms = session_ms[mine], first_ms[mine]
    entry = final.entry(mine, name)
    if outcome.retry:
        entry["retry"] = outcome.retry
        entry["attempts"] = [a.as_json(mine) for a in outcome.attempts]
    notes = []
    for b in budgets:
        v = outcome.verdicts[b.kind]
        if v.verdict == Verdict.INCONCLUSIVE:
            notes.append(f"{b.kind}: {v.note}")
        if b.reference is None:
            entry["verdicts"].append({"kind": b.kind, **sampling.as_json(v)})
            if v.verdict == Verdict.FAIL:
                lines.append(f"latency: {job} {b.kind} ({name}) {v.observed:.3f} ms (at least "
                             f"{v.lower:.3f} ms with {v.confidence:.0%} confidence) > budget {b.limit:g} ms "
                             f"({v.exceeding} of {v.samples} samples above it)")
            continue
        other = final.series[b.reference]
        other.session_ms, other.first_run_ms = session_ms[b.reference], first_ms[b.reference]
        p50, other_p50 = series.summary()["p50_ms"], other.summary()["p50_ms"]
        speedup = other_p50 / p50
        entry["relative"] = {"target": b.reference, "ratio": b.limit, "observed_ratio": speedup,
                             "reference": other.summary(), **sampling.as_json(v)}
        if v.verdict == Verdict.FAIL:
            lines.append(f"latency: {job} ({name}) is {speedup:.2f}x as fast as {b.reference} (median "
                         f"{p50:.3f} ms vs {other_p50:.3f} ms, interleaved), below faster_than ratio {b.limit:g}")
    if entry["unstable"]:
        notes += entry["unstable"]
    if notes:
        entry["note"] = "; ".join(notes)
    found = {v.verdict for v in outcome.verdicts.values()}
    entry["verdict"] = (Verdict.FAIL if Verdict.FAIL in found else Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in found
                        else Verdict.PASS if found else NOT_RUN)
    return entry


GATE = Gate("latency", "single-stream latency percentiles, absolute and relative", run,
            lambda g: bool(g.latency.budgets() or g.latency.faster_than), timed=True, check=check_data_sets)
