"""Build to the gates: after a build, the jobs whose target says `precision_search = "auto"` and whose lock entry is
missing or out of date are judged by their accuracy gate; a failing one (or one whose outputs broke: NaN, constant)
gets the precision search (gating/explain.py), its answer is written to targets.lock and the job is rebuilt with it,
so what the build ships passes. One search per root cause: jobs of the same model whose precision step is the same
(precision, its options, fusion, calibration, rule) try the first search's answer before searching themselves.
A job that passes as declared gets an entry too (nothing laid over), so the next build does not judge it again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence

from ortbuild.errors import GateFailed, OrtbuildError, OutputsBroken, first_line
from ortbuild.gating.record import TestResult
from ortbuild.gating.records import ExplainDoc
from ortbuild.gating.runner import PASS, Tester
from ortbuild.gating.search import explain
from ortbuild.gating.search.bisect import changed_lists, describe_set
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.project import lockfile
from ortbuild.project.declare import plain
from ortbuild.project.plan import Job
from ortbuild.status import Event, JobFinished, JobStatus, PhaseStarted, Verdict


def wants_search(job: Job) -> bool:
    """`auto` on a precision the search applies to, and no up-to-date search in the lock (a tuning alone is not one)."""
    return "search" in lockfile.missing(job, job.locked)


def root_cause(job: Job) -> str:
    """What decides the precision step's output and its judgement: jobs that share it share a search."""
    s = job.settings
    opts = s.typed_precision_options()
    gates = s.gates
    return json.dumps({"model": job.model.name, "precision": s.precision,
                       "options": plain(opts) if opts is not None else None, "fusion": plain(s.fusion),
                       "accuracy": plain(gates.accuracy) if gates is not None else None}, sort_keys=True,
                      default=str)


class AutoSearch:
    """The search of one build run (the builder's dist, under its lock)."""

    def __init__(self, builder: Builder, tester: Tester, *, max_rebuilds: int, max_seconds: float,
                 progress: Callable[[str, Event | str], None]) -> None:
        self.builder = builder
        self.tester = tester
        self.max_rebuilds = max_rebuilds
        self.max_seconds = max_seconds
        self.progress = progress
        self.answers: dict[str, tuple[str, list[str], list[str]]] = {}  # root cause -> (job, nodes, op types)
        self.failed: dict[str, tuple[str, ExplainDoc]] = {}  # root cause -> (job, its search) that found none
        self.locked: dict[str, Job] = {}  # the jobs rebuilt with an answer (or recorded as passing), by name

    def run(self, jobs: Sequence[Job], done: dict[str, JobResult]) -> None:
        """Judge, search and rebuild the jobs that want it; `done` gets their final results."""
        for job in jobs:
            r = done.get(job.name)
            if r is None or not wants_search(job):
                continue
            if job.model.generative:  # judged by its tokens gate, repaired with the builder's knobs
                if r.status in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
                    done[job.name] = self._generative(job, r)
                elif r.status == JobStatus.FAILED and isinstance(r.error, OutputsBroken):  # NaN logits at reload
                    from ortbuild.gating.search import gensearch

                    done[job.name] = gensearch.repair(self, job, r, f"broken outputs ({r.error.message})")
                continue
            if r.status in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
                res = TestResult(job.target.name, job.model.name, job.settings.precision)
                self.progress(job.name, PhaseStarted("precision_search = \"auto\": the accuracy gate of the build"))
                try:
                    self.tester.accuracy_gate(job, res)
                except OrtbuildError as e:  # not judged here (e.g. no emulation for its platform): `test` says why
                    r.notes.append(f"precision_search: the accuracy gate could not run here, nothing searched: "
                                   f"{first_line(e)}")
                    continue
                if res.accuracy == PASS:
                    self._record(job, r, res.worst)
                    continue
                why = f"accuracy gate FAIL ({res.worst})"
            elif r.status == JobStatus.FAILED and isinstance(r.error, OutputsBroken):
                res = TestResult(job.target.name, job.model.name, job.settings.precision, accuracy=Verdict.FAIL,
                                 worst=r.error.message)
                why = f"broken outputs ({r.error.message})"
            else:
                continue
            done[job.name] = self._repair(job, r, res, why)

    def _generative(self, job: Job, r: JobResult) -> JobResult:
        from ortbuild.gating.gates import genai as genai_gates
        from ortbuild.gating.search import gensearch

        self.progress(job.name, PhaseStarted("precision_search = \"auto\": the tokens gate of the build"))
        res = TestResult(job.target.name, job.model.name, job.settings.precision)
        try:
            verdict, summary = genai_gates.judge_tokens(self.tester, job, res)
        except OrtbuildError as e:
            r.notes.append(f"precision_search: the tokens gate could not run here, nothing searched: {first_line(e)}")
            return r
        if verdict == PASS:
            self._record(job, r, summary)
            return r
        return gensearch.repair(self, job, r, f"tokens gate {verdict} ({summary})")

    def _repair(self, job: Job, failed: JobResult, res: TestResult, why: str) -> JobResult:
        t0 = time.monotonic()
        key = root_cause(job)
        if key in self.failed:  # the same root cause found nothing within the budget: it is not searched again
            other, doc = self.failed[key]
            self.progress(job.name, f"precision_search: {why}; not searched: {other}'s search, of the same model and "
                                    "precision step, found no passing set")
            return self._failed(job, failed, {"status": "not found", "reason": f"the search of {other} (the same "
                                              f"model and precision step) found none: {doc.get('reason', '')}"}, why)
        if key in self.answers:  # the same root cause: try that search's answer first (one rebuild)
            other, nodes, op_types = self.answers[key]
            self.progress(job.name, PhaseStarted(f"precision_search: {why}; trying the answer of {other}'s search"))
            built = self._rebuild(job, nodes, op_types, {"reused_from": other})
            if built is not None:
                return built
        self.progress(job.name, PhaseStarted(f"precision_search: {why}; searching"))
        ex = explain.Explainer(self.builder, self.tester, max_rebuilds=self.max_rebuilds,
                               max_seconds=self.max_seconds, progress=self.progress, final_gate=False)
        try:
            doc = ex.explain(job, res)
        except OrtbuildError as e:
            doc = {"status": JobStatus.FAILED.value, "reason": e.message}
        if doc.get("status") != "found":
            self.failed[key] = (job.name, doc)
            return self._failed(job, failed, doc, why)
        nodes, op_types = list(doc.get("nodes", [])), list(doc.get("op_types", []))
        self.answers[key] = (job.name, nodes, op_types)
        evidence: dict[str, object] = {"rebuilds": int(doc.get("rebuilds", 0)),
                                       "seconds": round(time.monotonic() - t0, 1), "failed_with": why}
        trials = doc.get("trials", [])
        passing = [t for t in trials if t["passed"] and (t["nodes"], t["op_types"]) == (nodes, op_types)]
        if passing:
            evidence["worst"] = passing[-1]["worst"]
        built = self._rebuild(job, nodes, op_types, evidence)
        if built is None:  # it passed in the search's scratch build and fails here: say so, ship nothing
            return self._failed(job, failed, {"status": "not found", "reason": "the search's answer did not pass "
                                              "when rebuilt into dist/"}, why)
        return built

    def _rebuild(self, job: Job, nodes: list[str], op_types: list[str], evidence: dict[str, object]) \
            -> JobResult | None:
        """Build the job with the answer into dist/ (through the lock, as later builds will) and judge it: its
        result when it passes (the lock written), else None (the lock left as it was)."""
        knob = job.settings.rule.knob
        assert knob is not None
        settings = explain.settings_with(job.settings, knob, nodes, op_types)
        applies: dict[str, dict[str, object]] = {
            knob.table: dict(changed_lists(lockfile.declared(job).settings, knob, settings))}
        kept = describe_set(nodes, op_types)
        entry = self._entry(job).merged(applies, search={"kept": kept, **evidence})
        (locked,) = lockfile.apply(self.builder.project, [(lockfile.declared(job), entry)])
        result = self.builder.run_job(locked)
        if result.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED, JobStatus.PORTABLE):
            return None
        res = TestResult(job.target.name, job.model.name, job.settings.precision)
        try:
            self.tester.accuracy_gate(locked, res)
        except OrtbuildError as e:
            res.accuracy, res.worst = Verdict.FAIL, first_line(e)
        if res.accuracy != PASS:
            return None
        self.locked[job.name] = locked
        source = f" (the answer of {evidence['reused_from']}'s search)" if "reused_from" in evidence else ""
        said = self._write(entry.merged({}, search={**entry.search, "worst": res.worst}))
        result.notes.append(f"precision_search: kept {kept} in float{source}: accuracy PASS ({res.worst}); {said}")
        self.progress(job.name, JobFinished(result.status, result.notes[-1]))  # said on every stream
        return result

    def _entry(self, job: Job) -> lockfile.Entry:
        """The job's entry to add to: its up-to-date one (a tuning, what it lays over the settings), else a new one
        with the declared job's digests."""
        if job.locked is not None:
            return job.locked
        return lockfile.Entry(job.name, *self.builder.fingerprint(lockfile.declared(job)))

    def _write(self, entry: lockfile.Entry) -> str:
        """Record the entry in targets.lock; what to say of it (a warning too where it cannot be written)."""
        lock, said = lockfile.record_and_say(self.builder.project, entry)
        if lock is None:
            self.progress(entry.job, f"WARNING: {said}")
        return said

    def _record(self, job: Job, result: JobResult, found: str) -> None:
        """A job that passes as it is built: its entry (with what an up-to-date one already lays over it)."""
        entry = self._entry(job)
        how = "passes as declared" if not entry.applies else "passes with what targets.lock lays over it"
        entry = entry.merged({}, search={"result": f"{how} ({found})"})
        said = self._write(entry)
        result.notes.append(f"precision_search: {entry.search['result']}; {said}")
        self.progress(job.name, JobFinished(result.status, result.notes[-1]))
        self.locked[job.name] = dataclasses.replace(job, locked=entry)

    def _failed(self, job: Job, failed: JobResult, doc: ExplainDoc, why: str) -> JobResult:
        """The job fails with the search's table: nothing that fails its gate is shipped as passing."""
        lines = explain.render(job.name, doc)
        out = dataclasses.replace(failed, status=JobStatus.FAILED, notes=list(failed.notes))
        hint = ("the nodes it changed were renamed by the quantizer's pre-processing, so none can be named: "
                "quantization = { preprocess = false } keeps their names (the table lists them)"
                if doc.get("renamed") and not doc.get("trials") else
                "raise --explain-rebuilds/--explain-seconds, loosen the accuracy rule, or pick another precision for "
                "this target")
        out.error = GateFailed(f"{job.name}: precision_search = \"auto\" found no set kept in float that passes "
                               f"({why}): {doc.get('reason', '')}\n" + "\n".join(lines), hint)
        out.reason = out.error.message.split("\n", 1)[0]
        self.progress(job.name, JobFinished(JobStatus.FAILED, f"FAILED: {out.reason}"))
        return out
