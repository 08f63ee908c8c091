"""`ortbuild test`: the gates of the registry (ortbuild.gating.gates.registry) on every artifact, opened through
its generated Python loader, each gate's result kept in the job's record (ortbuild.gating.record). The runner has
no code of any one gate: it opens the job's Context (its golden run for an ONNX model; a generative model's gates
open it themselves), runs the gates the target's kind of model takes in the registry's order (those `--gates`
names; a timed gate SKIPPED under emulation), and decides the job's verdict: PASS, FAIL, INCONCLUSIVE (a gate the
samples cannot decide) or SKIPPED (the target cannot run here; with `require` that is a failure).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import cast

from ortbuild import files, logs, paths
from ortbuild.artifact import golden, loaders, manifest, manifest_types
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ConfigError, MissingProvider, OrtbuildError, RuntimeMismatch, from_loader
from ortbuild.gating import records
from ortbuild.gating.gates import accuracy, registry
from ortbuild.gating.measure import emulated
from ortbuild.gating.measure.sampling import environment
from ortbuild.gating.protocol import Context, Gate, Judged
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import builds, report
from ortbuild.gating.reports.selection import undecided_reason
from ortbuild.pipeline.job import JobResult
from ortbuild.project.config import Project
from ortbuild.project.declare import plain
from ortbuild.project.kinds import Kind
from ortbuild.project.plan import Job
from ortbuild.project.settings import Gates
from ortbuild.status import Event, JobFinished, JobStatus, PhaseStarted, Verdict

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
                 capture: bool = True, quick: bool = False, judged: Sequence[str] = registry.NAMES,
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
        self.cache: dict[str, object] = {}  # what the run's gates keep between jobs (protocol.Testing)

    def reproduce(self, job: Job) -> str:
        return report.reproduce(job.target.name, job.model.name, self.config_arg, job.target.session("test"))

    def run(self, jobs: list[Job], built: dict[str, JobResult], require: bool) -> list[TestResult]:
        results = []
        for job in jobs:
            res = TestResult(job.target.name, job.model.name, job.settings.precision, reproduce=self.reproduce(job),
                             quick=self.quick, judged=list(self.judged), kind=job.model.kind)
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
                skipped = [n for n, v in res.gates().items() if v == Verdict.SKIPPED]
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
            doc = {"result": res.as_json(), "environment": environment()}
            text = (json.dumps(doc, indent=2, default=str) + "\n").encode()
            if self.sign_key is not None:  # release takes verdicts only from a report the trusted key signed
                files.atomic_write(folder / REPORT_SIG, base64.b64encode(self.sign_key.sign(text)) + b"\n",
                                   root=self.dist)
            else:
                (folder / REPORT_SIG).unlink(missing_ok=True)
            files.atomic_write(folder / REPORT, text, root=self.dist)

    # ------------------------------------------------------------------------------------------ one job

    def gate(self, job: Job, res: TestResult, built: dict[str, JobResult]) -> None:
        """Every gate of the registry on one built job, in its order: those judged (`--gates`) of the model's
        kind; a timing gate of an emulated platform's target is SKIPPED where the target has a budget for it
        (`built`: every job's build, the references of relative budgets)."""
        ctx = self.context(job, res, built)
        settings = ctx.gates
        kind = job.model.kind
        gates = [g for g in registry.GATES if g.name in self.judged and kind in g.kinds]
        for check in (g.check for g in registry.GATES if kind in g.kinds):
            if check is not None:
                check(ctx)
        skipped = []
        try:
            for gate in gates:
                if gate.timed and ctx.module is None:  # emulated: the timing gates say nothing about the device
                    if gate.declared(settings):
                        res.set_verdict(gate.name, Verdict.SKIPPED)
                        skipped.append(gate.name)
                    continue
                res.record(gate.name, gate.run(ctx))
        finally:  # the golden data a gate judged by (a generative model's tokens), also where a later gate failed
            self._keep_golden(ctx, res)
        if skipped:
            res.reason = f"{', '.join(skipped)} SKIPPED: {emulated.timing_note(job.target, res.platform)}"
        undecided: list[str] = []
        for gate in registry.GATES:
            if res.verdict(gate.name) == Verdict.INCONCLUSIVE:
                note = str(res.section(gate.name).get("note", f"{gate.name} inconclusive"))
                if note not in undecided:
                    undecided.append(note)
        if not res.failures and undecided:
            res.status = Verdict.INCONCLUSIVE
            res.reason = undecided_reason(res, undecided, self.config_arg, job.target.session("test"))

    def judge_alone(self, gate: Gate, job: Job, res: TestResult, session: dict[str, object] | None = None) -> Judged:
        """One gate alone on one job, not kept in `res` but for the golden data it judged by (the generative
        search judges each candidate by the tokens gate). `session`: options over the artifact's, handed to the
        loader's load(session=...)."""
        ctx = self.context(job, res, {}, session)
        try:
            return gate.run(ctx)
        finally:
            self._keep_golden(ctx, res)

    @staticmethod
    def _keep_golden(ctx: Context, res: TestResult) -> None:
        """The record's `golden`: what a gate wrote as the job's golden data (an ONNX model's: open() sets it)."""
        if ctx.golden_doc:
            res.golden = cast(records.GoldenDoc, dict(ctx.golden_doc))

    def accuracy_gate(self, job: Job, res: TestResult, session: dict[str, object] | None = None) \
            -> tuple[ModuleType | None, golden.Golden, manifest_types.Manifest]:
        """The golden-output gate alone (the precision search and session tuning judge by it): `open`, then the
        accuracy gate where it is judged; returns the loader module (None when emulated), the golden data and the
        manifest. `session`: options over the artifact's, handed to the loader's load(session=...)."""
        ctx = self.open(job, res, {}, session)
        if accuracy.GATE.name in self.judged:
            res.record(accuracy.GATE.name, accuracy.GATE.run(ctx))
        return ctx.module, ctx.golden, ctx.manifest

    def context(self, job: Job, res: TestResult, built: dict[str, JobResult],
                session: dict[str, object] | None = None) -> Context:
        """The Context of one job, as its kind of model opens it."""
        return self.openers[job.model.kind](job, res, built, session)

    @property
    def openers(self) -> dict[Kind, Callable[[Job, TestResult, dict[str, JobResult], dict[str, object] | None],
                                             Context]]:
        return {"onnx": self.open, "generative": self.open_generative}

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
        return Context(self, job, module, g, m, outputs, built)

    def open_generative(self, job: Job, res: TestResult, built: dict[str, JobResult],
                        session: dict[str, object] | None = None) -> Context:
        """The Context of a generative artifact: its manifest and generated loader (opened by each gate that asks;
        its golden data are its prompts, which the tokens gate runs)."""
        folder = paths.inside(self.dist, job.target.name, job.model.name)
        m, _ = manifest.read(folder)
        if m.kind != job.model.kind:
            raise ConfigError(str(self.project.file), f"models.{job.model.name}.path",
                              f"{folder} holds an ONNX model's artifact, and the model is now a generative one",
                              "rebuild it: `ortbuild build`")
        res.build_key, res.artifact_sha256 = m.build_key, m.artifact.sha256
        module = loaders.import_python_loader(loaders.python_path(folder, job.model.name))
        none = golden.Golden([], "none: a generative model's golden data are its prompts (the tokens gate)", "computed")
        return Context(self, job, module, none, m, [], built)

    def _golden_of(self, job: Job, m: manifest_types.Manifest) -> golden.Golden:
        if job.model.name not in self.golden_cache:
            self.golden_cache[job.model.name] = golden.golden_for(job.model, m.io, job.settings.custom_ops)
        return self.golden_cache[job.model.name]
