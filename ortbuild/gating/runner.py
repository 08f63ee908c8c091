"""`ortbuild test`: the release gates of every artifact, opened through its generated Python loader.

Per (target, model): golden-output accuracy (ortbuild.artifact.golden, ortbuild.gating.measure.compare), latency budgets
(ortbuild.gating.measure.sampling) and size budgets. Verdicts: PASS, FAIL, INCONCLUSIVE (latency the samples cannot decide)
or SKIPPED (the target cannot run here; with `require` that is a failure).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import cast

from ortbuild import files, logs, paths
from ortbuild.artifact import golden, loaders, manifest
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ConfigError, MissingProvider, OrtbuildError, RuntimeMismatch, from_loader
from ortbuild.gating import records, timing_records
from ortbuild.gating.gates import accept, catalog, size
from ortbuild.gating.gates import genai as genai_gates
from ortbuild.gating.gates.catalog import NOT_RUN, Context
from ortbuild.gating.measure import compare, emulated, startup
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.measure.compliance import Checker
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import builds, report
from ortbuild.gating.reports.selection import GATES, undecided_reason
from ortbuild.pipeline.job import JobResult
from ortbuild.project import data
from ortbuild.project.config import Project, did_you_mean
from ortbuild.project.declare import plain
from ortbuild.project.plan import Job
from ortbuild.project.settings import Gates
from ortbuild.status import Event, JobFinished, JobStatus, PhaseStarted, Verdict

# the verdicts under the names other modules have used (ortbuild.status.Verdict is the vocabulary)
PASS, FAIL, INCONCLUSIVE, SKIP = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.SKIPPED
REPORT = "test-report.json"
REPORT_SIG = "test-report.sig"      # Ed25519 over the exact bytes of test-report.json, by the signing key


def gates_key(gates: Gates | None, eval_set: object) -> str:
    """What a test judged by, as a digest: the job's gate settings (budgets, accuracy rules, sample plans) and its
    model's evaluation set as declared. Budgets never rebuild, so `ortbuild release` compares this with the
    configuration's now: a budget changed since the test is not what the record's verdicts judged."""
    doc = json.dumps({"gates": plain(gates), "eval": plain(eval_set)}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


class Tester:
    def __init__(self, project: Project, dist: Path, secret: bytes | None, config_arg: str,
                 progress: Callable[[str, Event | str], None], sign_key: SigningKey | None = None,
                 capture: bool = True, quick: bool = False, judged: Sequence[str] = GATES,
                 find_peak: bool = False) -> None:
        self.project = project
        self.find_peak = find_peak  # --find-peak: the server scenario's highest passing rate
        self.judged = tuple(judged)  # --gates: the others are not measured
        self.quick = quick  # --quick: latency.plan_of's quick plan
        self.capture = capture  # third-party output into dist/logs/ (ortbuild.logs); False: -v
        self.logs: list[tuple[str, logs.Captured]] = []  # (job, what its test's tools said)
        self.sign_key = sign_key  # signs the golden data into each tested artifact's manifest
        self.dist = dist
        self.secret = secret
        self.config_arg = config_arg
        self.progress = progress
        self.golden_cache: dict[str, golden.Golden] = {}
        self._outputs: dict[str, list[str]] = {}

    def reproduce(self, job: Job) -> str:
        return report.reproduce(job.target.name, job.model.name, self.config_arg, job.target.session("test"))

    def run(self, jobs: list[Job], built: dict[str, JobResult], require: bool) -> list[TestResult]:
        results = []
        for job in jobs:
            res = TestResult(job.target.name, job.model.name, job.settings.precision, reproduce=self.reproduce(job),
                             quick=self.quick, judged=list(self.judged), generative=job.model.generative)
            b = built[job.name]
            if b.status == JobStatus.FAILED:  # what the report's row of its build record says (report.collect)
                failed = builds.failure(cast(records.BuildRecord, b.as_json()))  # the record it wrote
                res.reason, res.build, res.quick = failed["reason"], failed["build"], False  # nothing was timed
                res.fail(failed["failures"], failed["exit_code"])
            elif b.status in (JobStatus.SKIPPED, JobStatus.PORTABLE):
                res.status, res.reason = Verdict.SKIPPED, b.reason
                if b.status == JobStatus.SKIPPED:  # another runtime: say which session tests it
                    res.reason = (f"runs in {job.target.runtime_text}, not in this environment: "
                                  f"nox -s \"{job.target.session('test')}\" tests it in its own virtualenv")
                if require or job.target.require:
                    code = RuntimeMismatch.exit_code if b.status == JobStatus.SKIPPED else MissingProvider.exit_code
                    res.fail([f"required, but cannot run here: {res.reason}"], code)
            elif why := emulated.cannot_run(job.target):
                res.status, res.reason = Verdict.SKIPPED, why
                if require or job.target.require:
                    res.fail([f"required, but cannot run here: {why}"], MissingProvider.exit_code)
            else:
                res.gates_key = gates_key(job.settings.gates, job.model.eval)  # what the gates judge by
                log = logs.log_path(self.dist, job.target.name, job.model.name, "test") if self.capture else None
                where = f" on {job.target.platform} (emulated)" if emulated.emulated(job.target) else ""
                self.progress(job.name, PhaseStarted(f"testing{where}"))  # a long phase: said on every stream
                try:
                    with logs.captured(log, self.dist) as cap:
                        self.gate(job, res, built)
                except OrtbuildError as e:
                    res.reason = e.message
                    res.fail([e.render().removeprefix("ortbuild: ")], e.exit_code)
                finally:
                    if log is not None:
                        self.logs.append((job.name, cap))
                skipped = [n for n, v in res.gates().items() if v == SKIP]
                if skipped and not res.failures and (require or job.target.require):
                    res.fail([f"required, but its {', '.join(skipped)} gate(s) cannot run here: {res.reason}"],
                             MissingProvider.exit_code)
            if res.failures:  # any failure line, from any gate or path, makes the verdict FAIL
                res.status = Verdict.FAIL
            said = f"{res.status}" + (f": {res.reason}" if res.reason else "")
            if res.golden.get("warnings"):  # the summary says each one in full
                said += f" (warning: {golden.warned(res.golden['warnings'])})"
            self.progress(job.name, JobFinished(res.status, said))
            if b.status != JobStatus.SKIPPED:  # never overwrite the verdict another runtime's environment wrote
                self.write_report(job, res)
            results.append(res)
        return results

    def write_report(self, job: Job, res: TestResult) -> None:
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        if folder.is_dir():
            doc = {"result": res.as_json(), "environment": latency.environment()}
            text = (json.dumps(doc, indent=2, default=str) + "\n").encode()
            if self.sign_key is not None:  # release takes verdicts only from a report the trusted key signed
                files.atomic_write(folder / REPORT_SIG, base64.b64encode(self.sign_key.sign(text)) + b"\n",
                                   root=self.dist)
            else:
                (folder / REPORT_SIG).unlink(missing_ok=True)
            files.atomic_write(folder / REPORT, text, root=self.dist)

    # ------------------------------------------------------------------------------------------ one job

    def gate(self, job: Job, res: TestResult, built: dict[str, JobResult]) -> None:
        """Every gate of the registry (ortbuild.gating.gates.catalog.GATES) on one built job, in its order: those judged
        (`--gates`); a timing gate of an emulated platform's target is SKIPPED where the target has a budget for
        it (`built`: every job's build, the references of relative budgets)."""
        generative = job.model.generative  # its own gates (ortbuild.gating.gates.genai), and size
        ctx = genai_gates.open_context(self, job, res, built) if generative else self.open(job, res, built)
        settings = job.settings.gates
        assert settings is not None
        self.check_data_sets(ctx)
        skipped = []
        for gate in catalog.GATES:
            if gate.name not in self.judged or not gate.judges(generative):
                continue
            if gate.timed and ctx.module is None:  # emulated: the timing gates say nothing about the device
                if gate.declared(settings):
                    res.set_verdict(gate.name, SKIP)
                    skipped.append(gate.name)
                continue
            judged = gate.run(ctx)
            if judged is not None:  # a newer gate: its section and failure lines
                verdict, section, lines = judged
                if verdict != NOT_RUN or section:  # measured without a budget: reported, verdict "-"
                    res.sections[gate.name] = {**section, "verdict": verdict}
                if lines:
                    res.fail(lines)
        if skipped:
            res.reason = f"{', '.join(skipped)} SKIPPED: {emulated.timing_note(job.target, res.platform)}"
        undecided: list[str] = []
        for gate in catalog.GATES:
            if res.verdict(gate.name) == INCONCLUSIVE and (note := self._undecided(res, gate.name)) not in undecided:
                undecided.append(note)
        if not res.failures and undecided:
            res.status = Verdict.INCONCLUSIVE
            res.reason = undecided_reason(res, undecided, self.config_arg, job.target.session("test"))

    @staticmethod
    def _undecided(res: TestResult, gate: str) -> str:
        """What an INCONCLUSIVE gate's note says (cold start and memory share theirs: one measurement)."""
        if gate == "latency":
            return res.latency.get("note", "latency inconclusive")
        if gate in ("cold_start", "memory"):
            return res.startup.get("note", "cold start / memory inconclusive")
        return str(res.sections.get(gate, {}).get("note", f"{gate} inconclusive"))

    def judge_startup(self, ctx: Context) -> None:
        """Cold start and peak memory in fresh processes through the loader (only with a budget for either):
        one measurement for both gates."""
        job, res = ctx.job, ctx.result
        gates = job.settings.gates
        assert gates is not None
        budgets = {k: b for k, b in gates.startup_budgets.items() if k in self.judged}
        if not budgets or "startup" in ctx.done:
            return
        ctx.done.add("startup")
        self.progress(job.name, f"cold start and peak memory in fresh processes (looks at {startup.FIRST_LOOK}, "
                                f"then doubling, at most {startup.MAX_PROCESSES})")
        outcome = startup.measure(loaders.python_path(ctx.folder, job.model.name), ctx.folder,
                                  ctx.golden.sets[0].inputs, self.secret, budgets,
                                  latency.confidence_of(gates.latency.confidence, self.quick))
        res.startup = startup.summary(outcome, budgets)
        if "cold_start" in budgets:
            res.cold_start_verdict = startup.verdict_of(outcome, "cold_start")
        if "memory" in budgets:
            res.memory_verdict = startup.verdict_of(outcome, "memory")
        lines = startup.failure_lines(job.name, job.target.name, outcome, budgets)
        if lines:
            res.fail(lines)

    def accuracy_gate(self, job: Job, res: TestResult, session: dict[str, object] | None = None) \
            -> tuple[ModuleType | None, golden.Golden, manifest.Manifest]:
        """The golden-output gate alone (the precision search and session tuning judge by it): `open`, then the
        accuracy gate where it is judged; returns the loader module (None when emulated), the golden data and the
        manifest. `session`: options over the artifact's, handed to the loader's load(session=...)."""
        ctx = self.open(job, res, {}, session)
        if "accuracy" in self.judged:
            self.judge_accuracy(ctx)
        return ctx.module, ctx.golden, ctx.manifest

    def open(self, job: Job, res: TestResult, built: dict[str, JobResult],
             session: dict[str, object] | None = None) -> Context:
        """The published artifact opened through its generated Python loader (under emulation for another
        platform's target) and run on its golden data, which is signed into its manifest: the gates' Context."""
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        m, _ = manifest.read(folder)
        res.build_key, res.artifact_sha256 = m.build_key, m.artifact.sha256
        g = self._golden_of(job, m)
        module: ModuleType | None = None
        if emulated.emulated(job.target):  # the loader verifies the artifact there, before the golden data is signed
            outputs, res.platform = emulated.golden_outputs(job, folder, self.secret, g, self.progress)
        else:
            module = loaders.import_python_loader(loaders.python_path(folder, job.model.name))
            self.progress(job.name, "golden outputs through the generated Python loader")
            try:
                model = module.load(key=self.secret, folder=folder, **({"session": session} if session else {}))
            except module.LoaderError as e:
                raise from_loader(e, f"{job.target.name}/{job.model.name}") from None
            outputs = [model.run(ds.inputs) for ds in g.sets]
        sk = self.sign_key
        golden.write(folder, g, m.io, root=self.dist, sign=None if sk is None else
                     lambda files: manifest.sign_golden(folder, files, sk.sign, sk.public_raw, root=self.dist))
        res.golden = {"made_by": g.made_by, "source": g.source, "digest": golden.digest(g),
                      "data_sets": [d.name for d in g.sets], "dir": str(folder / golden.GOLDEN_DIR)}
        warnings = golden.warnings(job.model, g)
        if warnings:  # no failure: the gate still ran, but on data that says little
            res.golden["warnings"] = warnings
        return Context(self, job, res, module, g, m, outputs, built)

    def _target_outputs(self, job: Job) -> list[str]:
        """The output names of every model of the job's target (read once per target)."""
        import onnx

        if job.target.name not in self._outputs:
            names: list[str] = []
            for m in job.target.models:
                graph = onnx.load(str(self.project.models[m].path), load_external_data=False).graph
                names += [o.name for o in graph.output if o.name not in names]
            self._outputs[job.target.name] = names
        return self._outputs[job.target.name]

    def _golden_of(self, job: Job, m: manifest.Manifest) -> golden.Golden:
        if job.model.name not in self.golden_cache:
            self.golden_cache[job.model.name] = golden.golden_for(job.model, m.io, job.settings.custom_ops)
        return self.golden_cache[job.model.name]

    def judge_accuracy(self, ctx: Context) -> None:
        job, res, outputs, g, m = ctx.job, ctx.result, ctx.outputs, ctx.golden, ctx.manifest
        gates = job.settings.gates
        assert gates is not None
        names: list[str] = [o["name"] for o in m.io["outputs"]]
        known = self._target_outputs(job)
        for name in gates.accuracy.get("outputs", {}):  # a table may name another model's output, not a typo
            if name not in known:
                raise ConfigError(str(self.project.file), f"targets.{job.target.name}.accuracy.outputs.{name}",
                                  f"no model of this target has an output '{name}'{did_you_mean(name, known)}",
                                  f"the outputs are: {', '.join(known)}")
        compared: list[tuple[compare.OutputResult, object, object]] = []  # each result, with expected and actual
        for ds, got in zip(g.sets, outputs, strict=True):
            for name in names:
                rule = gates.accuracy_rule(job.settings.precision, name)
                compared.append((compare.compare(name, ds.name, ds.expected[name], got[name], rule),
                                 ds.expected[name], got[name]))
        results = [r for r, _, _ in compared]
        res.outputs = [r.as_json() for r in results]
        res.worst = compare.worst_metric(results)
        failed = [r for r in results if not r.passed]
        res.accuracy = Verdict.FAIL if failed else Verdict.PASS
        for r in failed:
            res.fail([f"accuracy: {job.name} " + line if i == 0 else line
                      for i, line in enumerate(compare.describe_failure(r))])
        if failed and (advice := accept.advice(self.project, job, names, compared, g)):
            res.fail(advice)

    def judge_size(self, ctx: Context) -> None:
        res = ctx.result
        res.size, lines = size.judge(ctx.job, ctx.manifest)
        res.size_verdict = Verdict.FAIL if lines else Verdict.PASS
        if lines:
            res.fail(lines)

    def _target_data_sets(self, job: Job, g: golden.Golden) -> list[str]:
        """The golden data set names of every model of the job's target (this model's from its golden data)."""
        names = [d.name for d in g.sets]
        for m in job.target.models:
            inputs = self.project.models[m].inputs
            try:
                found = [d.name for d in data.datasets(inputs)] if inputs.is_dir() else ["test_data_set_0"]
            except ConfigError:  # that model's own test reports its broken inputs
                found = []
            names += [n for n in found if n not in names]
        return names

    def check_data_sets(self, ctx: Context) -> None:
        """`latency.data_sets` names golden data sets of the target's models (its budgets and its load scenarios
        alike): checked before any gate, since a name given only for a scenario is read by that gate alone."""
        gates = ctx.job.settings.gates
        if gates is None or not gates.latency.data_sets:
            return
        known = self._target_data_sets(ctx.job, ctx.golden)
        for name in gates.latency.data_sets:  # a table may name another model's data set, not a typo
            if name not in known:
                raise ConfigError(str(self.project.file), f"targets.{ctx.job.target.name}.latency.data_sets.{name}",
                                  f"no model of this target has a golden data set '{name}'{did_you_mean(name, known)}",
                                  f"the data sets are: {', '.join(known)} (an .npz of inputs is test_data_set_0; an "
                                  "inputs directory holds one test_data_set_N/ per shape)")

    def judge_latency(self, ctx: Context) -> None:
        """Every golden data set timed (one session per artifact), each against its budgets: the target's, or its
        own `data_sets.NAME` table over them. `res.latency` is the first data set's (as reports have always read
        it), with `data_sets` listing each."""
        job, res, module, g, built = ctx.job, ctx.result, ctx.module, ctx.golden, ctx.built
        assert module is not None
        ran = {ds.name: out for ds, out in zip(g.sets, ctx.outputs, strict=True)}  # compliance: the accuracy run's
        gates = job.settings.gates
        assert gates is not None
        lat = gates.latency
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        opens: dict[str, tuple[ModuleType, Path]] = {job.target.name: (module, folder)}
        ft = lat.faster_than
        ref_problem = None
        if ft is not None:
            ref_target = self.project.targets[ft.target]
            ref_build = built.get(f"{ft.target}/{job.model.name}")
            if ref_build is None or ref_build.status in (JobStatus.FAILED, JobStatus.SKIPPED, JobStatus.PORTABLE):
                why = ref_build.reason if ref_build is not None else "not built"
                ref_problem = (f"{ft.target} cannot run here ({why}); "
                               f"relative budgets compare targets of one runtime ({ref_target.runtime_text})")
            else:
                rfolder = paths.inside(self.dist, ft.target, job.model.name)
                opens[ft.target] = (loaders.import_python_loader(loaders.python_path(rfolder, job.model.name)),
                                    rfolder)
        sessions = {}
        session_ms: dict[str, float] = {}
        for name, (mod, where) in opens.items():  # verify + decrypt + InferenceSession, timed apart
            t0 = time.perf_counter()
            sessions[name] = mod.load(key=self.secret, folder=where)
            session_ms[name] = (time.perf_counter() - t0) * 1e3
        plan = latency.plan_of(lat.confidence, lat.min_samples, lat.min_seconds, lat.retry_wait_seconds, self.quick)
        mine = job.target.name
        threads = job.settings.session.intra_op_num_threads
        entries: list[timing_records.DataSetLatency] = []
        lines: list[str] = []
        verdicts: list[str] = []  # of every budget of every data set
        for ds in g.sets:
            relative = (ft.target, ft.ratio) if ft is not None and ref_problem is None else (None, 0.0)
            budgets = latency.budgets_of(lat.budgets(ds.name), *relative)
            calls = {name: (lambda s=s, feed=ds.inputs: s.run(feed)) for name, s in sessions.items()}
            warmed = latency.warm_up(calls, lat.warmup_runs, math.inf if budgets else latency.BRIEF_SECONDS)
            self.progress(job.name, latency.said_before(ds.name, budgets, plan, warmed))
            check = Checker.for_latency(ran[ds.name], ds.name,
                                        lambda o: gates.accuracy_rule(job.settings.precision, o),
                                        plan.min_samples or latency.FIRST_LOOK)
            outcome = latency.gate(calls, mine, budgets, plan, seen={mine: check.observer()},
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
                                   "confidence": plan.confidence, "quick": self.quick}
        del out["name"]
        out["compliance"] = Checker.merge([e["compliance"] for e in entries])
        out.pop("note", None)
        if notes:
            out["note"] = "; ".join(notes)
        res.latency_verdict = (Verdict.FAIL if lines else Verdict.INCONCLUSIVE if Verdict.INCONCLUSIVE in verdicts
                               else Verdict.PASS if verdicts else NOT_RUN)
        res.latency = out
        if lines:
            res.fail(lines)


def data_set_entry(job: str, mine: str, name: str, outcome: latency.Outcome, budgets: list[latency.Budget],
                   session_ms: dict[str, float], first_ms: dict[str, float],
                   lines: list[str]) -> timing_records.DataSetLatency:
    """The report of one data set's timings and verdicts (`mine`: the tested artifact's series, `job`: how
    failure lines name it); its failure lines go to `lines`."""
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
            entry["verdicts"].append({"kind": b.kind, **latency.as_json(v)})
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
                             "reference": other.summary(), **latency.as_json(v)}
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
