"""`ortbuild test` (with the precision search of failing artifacts) and `ortbuild profile`: both build what is
missing or stale first (cli.build.built). The gates, the profiler and the precision search import numpy,
onnx and ONNX Runtime: they load inside the commands, so the other commands never pay for them."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild import logs
from ortbuild.artifact import keys
from ortbuild.cli.building import built, fitting
from ortbuild.cli.options.gate import ProfileOptions, TestOptions
from ortbuild.errors import GateFailed, OrtbuildError, OutputsBroken, UsageError, first_line
from ortbuild.gating.reports import cells, report, selection, summary
from ortbuild.gating.reports.summary import table
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, plan
from ortbuild.status import JobStatus, ProfileStatus, Verdict, final_exit

if TYPE_CHECKING:
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.records import ReportDoc
    from ortbuild.gating.runner import Tester


def _peak_searchable(judged: Sequence[str], jobs: Sequence[plan.Job]) -> None:
    """--find-peak searches a server budget: a UsageError where the run judges none (not silently nothing)."""
    from ortbuild.gating.gates import server
    hint = ("--find-peak searches the highest QPS that meets a [targets.X.latency.server] budget (p99_ms or "
            "p90_ms): declare one, or drop --find-peak")
    if "server" not in judged:
        raise UsageError(f"--find-peak with {selection.flag(judged)}: the server gate is not judged", hint)
    if not any(j.settings.gates is not None and server.GATE.declared(j.settings.gates) for j in jobs):
        raise UsageError("--find-peak: no selected target has a [latency.server] table", hint)


def cmd_test(o: TestOptions) -> int:
    """Build what is missing or stale, then gate every artifact: golden outputs, latency and size budgets."""
    from ortbuild.gating import runner
    from ortbuild.gating.measure import speed
    from ortbuild.gating.search import explain_render

    sel, precision = o.selection, o.budgets.precision
    if (precision.rebuilds or 0) < 1 or precision.seconds <= 0:
        raise UsageError("--explain-rebuilds and --explain-seconds must be positive")
    baseline = report.read_baseline(o.baseline) if o.baseline else None  # a bad one fails before any build
    project = config.load(sel.config)
    jobs = plan.jobs(project, sel.target, sel.model)
    fitting(jobs, "test")
    if o.find_peak:
        _peak_searchable(o.gates, jobs)
    refs: list[plan.Job] = []  # the other side of relative latency budgets: built, not tested
    for j in jobs:
        ft = j.settings.gates.latency.faster_than if j.settings.gates else None
        if ft is not None and "latency" in o.gates and \
                not any(x.name == f"{ft.target}/{j.model.name}" for x in [*jobs, *refs]):
            other = project.targets[ft.target]
            refs.append(plan.Job(other, j.model, other.settings[j.model.name]))
    secrets = keys.read_secrets(o.keys.key_file, o.keys.signing_key_file)
    with built(o, project, [*jobs, *refs], secrets, repair=o.repair, command="test") as b, \
            Progress(quiet=sel.json, live=False, verbose=sel.verbose, what="testing") as progress:
        # the gates measure latency: no live display (its only thread, a plain stream's heartbeat, wakes when a
        # line is due)
        dist, builder, done, jobs = b.dist, b.builder, b.done, b.jobs[:len(jobs)]  # as built: targets.lock laid over
        tester = runner.Tester(project, dist, secrets.secret, sel.config, progress, secrets.signing,
                              capture=not sel.verbose, quick=o.quick, judged=o.gates, find_peak=o.find_peak)
        results = tester.run(jobs, done, o.require)
        measured = speed.check([(j, r.latency) for j, r in zip(jobs, results, strict=True)])
        for job, r, found in zip(jobs, results, measured, strict=True):
            if found:  # in its test report too
                r.speed = found
                tester.write_report(job, r)
        explained, searched = _explain(o, builder, tester, jobs, results, done, progress)
        written = report.compose(dist, report.collect(dist), baseline)
        json_path, html_path = report.save(dist, written)

    inconclusive = any(r.status == Verdict.INCONCLUSIVE for r in results)
    # the results' own codes first; INCONCLUSIVE latency fails only with --strict, and only when nothing else did
    code = final_exit(itertools.chain((r.exit_code for r in results),
                                      [GateFailed.exit_code if o.strict and inconclusive else 0]))
    if sel.json:
        print(json.dumps({"exit_code": code, "report": str(json_path), "html": str(html_path),
                          "results": [r.as_json() for r in results]}, indent=2, default=str))
        return code
    if not sel.no_summary:  # (nox's last test session prints one summary of every target instead)
        _summary(results, written.doc, done, json_path, html_path)
        caps = [*((k, b.log) for k, b in done.items() if b.log is not None), *tester.logs, *searched]
        for line in logs.footer(caps):
            print(line, file=sys.stderr)
    for r in results:
        if r.failures:
            print(f"\nFAIL {r.target}/{r.model}:", file=sys.stderr)
            for line in r.failures:
                print(f"  {line}", file=sys.stderr)
            print(f"  reproduce: {r.reproduce}", file=sys.stderr)
    if code == 0 and inconclusive:
        print("INCONCLUSIVE verdicts pass without --strict", file=sys.stderr)
    kinds = {j.model.kind for j in jobs}  # only the gates of its kind of model
    if left := selection.not_judged(list(o.gates), kinds.pop() if len(kinds) == 1 else "onnx"):
        print(f"{left}; `ortbuild release` needs every gate: test again without --gates", file=sys.stderr)
    for r in explained:
        print()
        print("\n".join(explain_render.render(f"{r.target}/{r.model}", r.explain)))
    return code


def _summary(results: Sequence[TestResult], doc: ReportDoc, done: dict[str, JobResult], json_path: Path,
             html_path: Path) -> None:
    """The table of this run's results (with the report's change for each), their reasons and notes, counts."""
    mine = [r.as_json() for r in results]
    header, rows = cells.text_table(report.this_run(doc, mine), doc["comparison"])
    print()
    print(table(rows, header))
    notes = dict.fromkeys(f"[{k}] note: {n}" for k, b in done.items() for n in b.notes
                          if any(r.target + "/" + r.model == k for r in results))
    for r in results:
        if r.status in (Verdict.SKIPPED, Verdict.INCONCLUSIVE) and r.reason:
            print(f"  [{r.target}/{r.model}] {r.status}: {r.reason}")
    for n in notes:
        print(f"  {n}")
    for line in summary.warning_lines(results):
        print(line)
    print("\n" + summary.verdict_counts([r.status for r in results], json_path, html_path))


def _explain(o: TestOptions, builder: Builder, tester: Tester, jobs: Sequence[plan.Job],
             results: Sequence[TestResult], builds: dict[str, JobResult], progress: Progress) \
        -> tuple[list[TestResult], list[tuple[str, logs.Captured]]]:
    """The precision search of every fp16/int8/int4 job whose accuracy gate failed, or whose build failed with
    broken outputs (OutputsBroken: the precision step's accuracy failure, caught at reload) (with --explain: of
    every one; --no-explain: none), recorded in its test report; and the searches' logs."""
    from ortbuild.gating.search import explain

    if o.explain is False:
        return [], []
    ex = explain.Explainer(builder, tester, o.budgets.precision,
                           progress=progress)
    done = []
    for job, r in zip(jobs, results, strict=True):
        broken = isinstance(builds[job.name].error, OutputsBroken)
        if r.precision not in explain.KNOBS or r.status == Verdict.SKIPPED or (r.accuracy == "-" and not broken):
            continue
        if o.explain is None and r.accuracy != Verdict.FAIL and not broken:
            continue
        try:
            r.explain = ex.explain(job, r)
        except OrtbuildError as e:  # the diagnosis failing changes no verdict: it is recorded and shown
            r.explain = {"status": JobStatus.FAILED.value, "reason": e.message}
        except Exception as e:
            r.explain = {"status": JobStatus.FAILED.value,
                         "reason": f"{type(e).__name__}: {first_line(e)} (the verdict stands; rerun with --debug "
                                   "for the traceback)"}
            if o.debug:
                raise
        tester.write_report(job, r)
        done.append(r)
    return done, ex.logs


def cmd_profile(o: ProfileOptions) -> int:
    """Build what is missing or stale, then profile every artifact through its loader
    (ortbuild.gating.measure.profile)."""
    from ortbuild.gating.measure import profile

    if o.runs < 1 or o.top < 1:
        raise UsageError("--runs and --top must be at least 1")
    sel = o.selection
    project = config.load(sel.config)
    jobs = plan.jobs(project, sel.target, sel.model)
    fitting(jobs, "profile")
    secrets = keys.read_secrets(o.keys.key_file, o.keys.signing_key_file)
    with built(o, project, jobs, secrets, command="profile") as b, \
            Progress(quiet=sel.json, live=False, verbose=sel.verbose, what="profiling") as progress:
        dist, done = b.dist, b.done
        results = profile.profile_jobs(b.jobs, dist, secrets.secret, o.runs, done, progress)
        _, html_path = report.write(dist, report.collect(dist))
    code = final_exit(r.exit_code for r in results)
    if sel.json:
        print(json.dumps({"exit_code": code, "html": str(html_path), "results": [r.as_json() for r in results]},
                         indent=2))
        return code
    for r in results:
        print(f"\n{r.target}/{r.model}: {r.status}" + (f": {r.reason}" if r.reason else ""))
        if r.status != ProfileStatus.PROFILED:
            continue
        s = r.summary
        shares = ", ".join(f"{p.removesuffix('ExecutionProvider')} {v['nodes']} nodes "
                           f"{v['total_us'] / 1e3 / s['runs']:.3f} ms/run" for p, v in s["providers"].items())
        print(f"  {s['runs']} runs, {s['run_ms']:.3f} ms per run ({s['kernel_share']:.0%} in kernels); {shares}")
        print("  " + table(profile.table(s, o.top), profile.HEADER).replace("\n", "\n  "))
        if s["cpu_fallback"]:
            print(f"  CPU fallback: {len(s['cpu_fallback'])} node(s) ran on CPUExecutionProvider, not on "
                  f"{s['planned_providers'][0]}: " + ", ".join(f"{x['node']} ({x['op_type']}, {x['share']:.1%})"
                                                               for x in s["cpu_fallback"][:8]))
        print(f"  trace: {dist / r.target / r.model / profile.TRACE}  (chrome://tracing or ui.perfetto.dev)")
    order = (ProfileStatus.PROFILED, ProfileStatus.SKIPPED, ProfileStatus.FAILED)
    counts = {st: sum(r.status == st for r in results) for st in order}
    print("\n" + ", ".join(f"{n} {st}" for st, n in counts.items()) + f"  ->  {html_path}")
    return code
