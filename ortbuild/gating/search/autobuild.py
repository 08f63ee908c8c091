"""Build to the gates: after a build, the jobs whose target says `precision_search = "auto"` and whose lock entry is
missing or out of date are judged by their accuracy gate; a failing one (or one whose outputs broke: NaN, constant)
gets the precision search (search/explain.py), its answer is written to targets.lock and the job is rebuilt with it,
so what the build ships passes. One search per root cause: jobs of the same model whose precision step is the same
(precision, its options, fusion, calibration, rule) try the first search's answer before searching themselves.
A job that passes as declared gets an entry too (nothing laid over), so the next build does not judge it again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence

from ortbuild.errors import GateFailed, OrtbuildError, OutputsBroken, first_line
from ortbuild.gating.record import TestResult
from ortbuild.gating.records import ExplainDoc
from ortbuild.gating.runner import Tester
from ortbuild.gating.search import bisect, explain, explain_render
from ortbuild.gating.search.base import Budget, Clock, Found, JobSearch, Locking, Say, Search
from ortbuild.gating.search.bisect import changed_lists, describe_set
from ortbuild.gating.search.fastest import FastestSearch
from ortbuild.gating.search.gensearch import GenerativeSearch
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.project import lockfile
from ortbuild.project.declare import plain
from ortbuild.project.kinds import Kind
from ortbuild.project.plan import Job
from ortbuild.status import JobFinished, JobStatus, PhaseStarted, Verdict


def wants_search(job: Job) -> bool:
    """`auto` on a precision the search applies to, or `candidates`, and no up-to-date search or choice in the lock
    (a tuning alone is not one)."""
    return bool({"search", "choice"} & set(lockfile.missing(job, job.locked)))


def refinable(job: Job, budget: Budget) -> bool:
    """The job's up-to-date search was stopped by a smaller budget than `budget` (`minimal = false`): a build
    with this one searches again (the lock keeps the old answer unless the new search finds one)."""
    found = job.locked.search if job.locked is not None else {}
    if found.get("minimal") is not False:
        return False
    seconds, rebuilds = found.get("budget_seconds"), found.get("budget_rebuilds")
    more_seconds = isinstance(seconds, int | float) and budget.seconds > seconds
    more_rebuilds = isinstance(rebuilds, int) and (budget.rebuilds is None or budget.rebuilds > rebuilds)
    return more_seconds or more_rebuilds


KEEP_SHARE = 0.2  # of a search's seconds, at most, kept for the answer's rebuild into dist/ and its gate

# the op types ORT's quantizers and converters reduce: an already-reduced source keeps them as it stores them
REDUCIBLE = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "LSTM", "GRU", "Attention",
                       "EmbedLayerNormalization"})


def source_quantization(job: Job) -> tuple[list[str], str] | None:
    """For a source that is already quantized or fp16 (its weights mostly int8/int4/fp16, or quantized ops):
    its nodes the precision step would reduce again, every graph's (kept in float, the step leaves the source's
    own quantization as it is), and why it is reduced; None for a float source."""
    import onnx

    from ortbuild.pipeline.steps import accounting

    if job.settings.rule.knob is None:
        return None
    model = onnx.load(str(job.model.path), load_external_data=False)
    reason = accounting.already_reduced(model)
    if reason is None:
        return None
    nodes = [n.name for g in accounting.graphs(model.graph) for n in g.node if n.name and n.op_type in REDUCIBLE]
    return (list(dict.fromkeys(nodes)), reason) if nodes else None


def root_cause(job: Job) -> str:
    """What decides the precision step's output and its judgement: jobs that share it share a search."""
    s = job.settings
    opts = s.typed_precision_options()
    gates = s.gates
    return json.dumps({"model": job.model.name, "precision": s.precision,
                       "options": plain(opts) if opts is not None else None, "fusion": plain(s.fusion),
                       "accuracy": plain(gates.accuracy) if gates is not None else None}, sort_keys=True,
                      default=str)


class PrecisionSearch(JobSearch):
    """Build to the gates for an ONNX model: its accuracy gate judges the build; a failing one (or broken outputs)
    gets the precision bisection (explain.Explainer, in a scratch dist, this search's budget), and its answer is
    rebuilt into dist/ through targets.lock (base.Locking) and judged again."""

    def __init__(self, locking: Locking, tester: Tester, budget: Budget, progress: Say) -> None:
        super().__init__(locking, tester, budget, progress)
        self.answers: dict[str, tuple[str, list[str], list[str]]] = {}  # root cause -> (job, nodes, op types)
        self.gate_seconds: dict[str, float] = {}  # job -> what its accuracy gate took (the search keeps it for the end)
        self.failed: dict[str, tuple[str, ExplainDoc]] = {}  # root cause -> (job, its search) that found none

    def search(self, job: Job, given: JobResult) -> Found[JobResult]:
        """The job's final result: as built where it passes (or cannot be judged here, or its build failed
        otherwise), else as repaired, or failed with the search's table."""
        clock = self.budget.start()
        r = given
        if job.locked is not None and refinable(job, self.budget) and r.status.usable:
            return self._refine(job, r, clock)
        if r.status in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
            res = TestResult(job.target.name, job.model.name, job.settings.precision)
            self.progress(job.name, PhaseStarted("precision_search = \"auto\": the accuracy gate of the build"))
            try:
                t0 = time.monotonic()
                self.tester.accuracy_gate(job, res)
                self.gate_seconds[job.name] = time.monotonic() - t0
            except OrtbuildError as e:  # not judged here (e.g. no emulation for its platform): `test` says why
                r.notes.append(f"precision_search: the accuracy gate could not run here, nothing searched: "
                               f"{first_line(e)}")
                return clock.found(r, found=False, cut_short=False)
            if res.accuracy == Verdict.PASS:
                self.locking.passes(job, r, res.worst)
                return clock.found(r, found=True, cut_short=False)
            why = f"accuracy gate FAIL ({res.worst})"
        elif r.status == JobStatus.FAILED and isinstance(r.error, OutputsBroken):
            res = TestResult(job.target.name, job.model.name, job.settings.precision, accuracy=Verdict.FAIL,
                             worst=r.error.message)
            why = f"broken outputs ({r.error.message})"
        else:
            return clock.found(r, found=False, cut_short=False)
        return self._repair(job, r, res, why, clock)

    def _refine(self, job: Job, built: JobResult, clock: Clock) -> Found[JobResult]:
        """A search its budget stopped, searched again from the declared settings with this larger budget: its
        answer replaces the entry's; where it finds none, the entry and the artifact as built stand."""
        assert job.locked is not None
        old = job.locked.search
        why = str(old.get("failed_with", "accuracy gate FAIL"))
        res = TestResult(job.target.name, job.model.name, job.settings.precision, accuracy=Verdict.FAIL, worst=why)
        self.progress(job.name, PhaseStarted(f"precision_search: the entry's search was stopped by its budget "
                                             f"({old.get('budget_seconds', 0):g} s): searching again with "
                                             f"{self.budget.seconds:g} s"))
        declared = dataclasses.replace(lockfile.declared(job), locked=job.locked)
        return self._repair(declared, built, res, why, clock, fallback=built)

    def _repair(self, job: Job, failed: JobResult, res: TestResult, why: str, clock: Clock,
                fallback: JobResult | None = None) -> Found[JobResult]:
        """The search, its answer rebuilt into dist/ and locked; `fallback`: what stands where it finds none (a
        refinement's passing build), else the job fails with the search's table."""
        key = root_cause(job)
        if key in self.failed and fallback is None:  # the same root cause found nothing within the budget: not searched
            other, doc = self.failed[key]
            self.progress(job.name, f"precision_search: {why}; not searched: {other}'s search, of the same model and "
                                    "precision step, found no passing set")
            return clock.found(self._failed(job, failed, {"status": "not found", "reason": f"the search of {other} "
                                            f"(the same model and precision step) found none: {doc.get('reason', '')}"},
                                            why), found=False, cut_short=False)
        if key in self.answers and fallback is None:  # the same root cause: that search's answer first (one rebuild)
            other, nodes, op_types = self.answers[key]
            self.progress(job.name, PhaseStarted(f"precision_search: {why}; trying the answer of {other}'s search"))
            built = self._rebuild(job, nodes, op_types, {"reused_from": other}, clock)
            if built is not None:
                return clock.found(built, found=True, cut_short=False)
        own = source_quantization(job) if fallback is None else None
        if own is not None:  # an already-reduced source: its own quantization first (one rebuild), then the search
            nodes, reason = own
            self.progress(job.name, PhaseStarted(f"precision_search: {why}; the source is already reduced ({reason}): "
                                                 "trying its own quantization"))
            built = self._rebuild(job, nodes, [], {"failed_with": why, "source_quantization": reason}, clock,
                                  kept=f"the source's own quantization ({len(nodes)} node(s) as it stores them)")
            if built is not None:
                return clock.found(built, found=True, cut_short=False)
        self.progress(job.name, PhaseStarted(f"precision_search: {why}; searching"))
        ex = explain.Explainer(self.locking.builder, self.tester, self.budget, progress=self.progress,
                               final_gate=False)
        # the answer's rebuild into dist/ and its gate come after the search, inside the budget: kept from it (as
        # long as the build and the gate of the job took, the first gate computing the golden data too: at most
        # KEEP_SHARE of the budget)
        keep = min(failed.seconds + self.gate_seconds.get(job.name, 0.0), KEEP_SHARE * self.budget.seconds)
        searching = Budget(clock.rebuilds_left(), max(0.0, clock.left() - keep)).start()
        try:
            found = ex.search(job, res, searching)
            doc, cut_short = found.answer, found.cut_short
            clock.rebuilt(found.rebuilds)
        except OrtbuildError as e:
            doc, cut_short = {"status": JobStatus.FAILED.value, "reason": e.message}, False
        if doc.get("status") != "found" and fallback is not None:
            fallback.notes.append(f"precision_search: searching again found no set that passes within the budget "
                                  f"({doc.get('reason', '')}): the entry stands")
            self.progress(job.name, JobFinished(fallback.status, fallback.notes[-1]))
            return clock.found(fallback, found=True, cut_short=cut_short)
        if doc.get("status") != "found":
            self.failed[key] = (job.name, doc)
            return clock.found(self._failed(job, failed, doc, why), found=False, cut_short=cut_short)
        nodes, op_types = list(doc.get("nodes", [])), list(doc.get("op_types", []))
        self.answers[key] = (job.name, nodes, op_types)
        evidence: dict[str, object] = {"rebuilds": int(doc.get("rebuilds", 0)),
                                       "seconds": round(clock.spent(), 1), "failed_with": why,
                                       # a search its budget stopped found a set that passes, maybe not the
                                       # fewest nodes: a later build with a larger budget searches again (refine)
                                       "minimal": not cut_short, "budget_seconds": self.budget.seconds}
        if self.budget.rebuilds is not None:
            evidence["budget_rebuilds"] = self.budget.rebuilds
        if cut_short:
            evidence["stopped"] = str(doc.get("stopped") or doc.get("reason", ""))
        trials = doc.get("trials", [])
        passing = [t for t in trials if t["passed"] and (t["nodes"], t["op_types"]) == (nodes, op_types)]
        if passing:
            evidence["worst"] = passing[-1]["worst"]
        built = self._rebuild(job, nodes, op_types, evidence, clock)
        if built is None and fallback is not None:
            return clock.found(fallback, found=True, cut_short=cut_short)
        if built is None:  # it passed in the search's scratch build and fails here: say so, ship nothing
            return clock.found(self._failed(job, failed, {"status": "not found", "reason": "the search's answer did "
                                            "not pass when rebuilt into dist/"}, why), found=False, cut_short=cut_short)
        return clock.found(built, found=True, cut_short=cut_short)

    def _rebuild(self, job: Job, nodes: list[str], op_types: list[str], evidence: dict[str, object],
                 clock: Clock, kept: str = "") -> JobResult | None:
        """Build the job with the answer into dist/ (through the lock, as later builds will) and judge it: its
        result when it passes (the lock written), else None (the lock left as it was)."""
        knob = job.settings.rule.knob
        assert knob is not None
        settings = bisect.settings_with(job.settings, knob, nodes, op_types)
        applies: dict[str, dict[str, object]] = {
            knob.table: dict(changed_lists(lockfile.declared(job).settings, knob, settings))}
        kept = kept or describe_set(nodes, op_types)
        entry = self.locking.entry(job).merged(applies, search={"kept": kept, **evidence})
        locked, result, res = self.locking.judged(job, entry, self.tester)
        clock.rebuilt()
        if res.accuracy != Verdict.PASS:
            return None
        source = f" (the answer of {evidence['reused_from']}'s search)" if "reused_from" in evidence else ""
        if evidence.get("minimal") is False:
            source += (f"; NOT minimal: {evidence.get('stopped', 'the budget stopped the search')}, a build with a "
                       "larger --explain-seconds/--explain-rebuilds searches again for fewer")
        what = f"shipped {kept}" if "source_quantization" in evidence else f"kept {kept} in float"
        self.locking.keep(locked, result, entry.merged({}, search={**entry.search, "worst": res.worst}),
                          f"precision_search: {what}{source}: accuracy PASS ({res.worst})")
        return result

    def _failed(self, job: Job, failed: JobResult, doc: ExplainDoc, why: str) -> JobResult:
        """The job fails with the search's table: nothing that fails its gate is shipped as passing."""
        lines = explain_render.render(job.name, doc)
        hint = ("the nodes it changed were renamed by the quantizer's pre-processing, so none can be named: "
                "quantization = { preprocess = false } keeps their names (the table lists them)"
                if doc.get("renamed") and not doc.get("trials") else
                "raise --explain-rebuilds/--explain-seconds, loosen the accuracy rule, or pick another precision for "
                "this target")
        return self.fail(job, failed, GateFailed(f"{job.name}: precision_search = \"auto\" found no set kept in float "
                                                 f"that passes ({why}): {doc.get('reason', '')}\n" + "\n".join(lines),
                                                 hint))


# each kind of model's build-to-the-gates search (base.Search over a job's build result)
KindSearch = Callable[[Locking, Tester, Budget, Say], Search[JobResult, JobResult]]
SEARCHES: Mapping[Kind, KindSearch] = {"onnx": PrecisionSearch, "generative": GenerativeSearch}


class AutoSearch:
    """The build-to-the-gates search of one build run (the builder's dist, under its lock): each job's by the
    search of its kind of model (SEARCHES), all of them with one Budget, each job its own start of it."""

    def __init__(self, builder: Builder, tester: Tester, budget: Budget, *, progress: Say) -> None:
        self.budget = budget
        self.locking = Locking(builder, progress)
        self.searches = {kind: make(self.locking, tester, budget, progress) for kind, make in SEARCHES.items()}
        self.fastest = FastestSearch(self.locking, tester, budget, progress)

    @property
    def locked(self) -> dict[str, Job]:
        """The jobs rebuilt with an answer (or recorded as passing), by name."""
        return self.locking.locked

    def search(self, job: Job, given: JobResult) -> Found[JobResult]:
        """Judge the job's build and repair it where it fails (with `candidates`: build to the fastest artifact that
        passes, fastest.py): its final result."""
        if job.settings.candidates:
            return self.fastest.search(job, given)
        return self.searches[job.model.kind].search(job, given)

    def run(self, jobs: Sequence[Job], done: dict[str, JobResult]) -> None:
        """Judge, search and rebuild the jobs that want it; `done` gets their final results."""
        for job in jobs:
            r = done.get(job.name)
            if r is not None and (wants_search(job) or refinable(job, self.budget)):
                done[job.name] = self.search(job, r).answer
