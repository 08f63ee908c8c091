"""Session tuning of one built job (`ortbuild tune`, `tune = true`): measure through the generated Python loader
(search/tune_search.py: the candidates, the paired measurement, the greedy search), write the lock entry, rebuild.

Tuner (a base.Search over a built job, given its fp32 reference) measures: the artifact as built, opened with the
declared session options and with each candidate's (the loader's load(session=...)), every golden data set, the
accuracy gate judging each faster candidate; its Budget's seconds bound the search.
record() writes what it found to targets.lock (`applies.session`: the changed options only; `tune`: the speed-up,
its interval and confidence, what was tried; an up-to-date entry's precision-search part is kept) and rebuilds
the job with the entry applied, so the shipped artifact carries the tuned options in its manifest and loaders.
tune_for_build() does both for the build flow (a target with `tune = true`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ortbuild import installed, paths
from ortbuild.artifact import loaders, manifest, manifest_types
from ortbuild.errors import GateFailed, OrtbuildError, first_line, from_loader
from ortbuild.gating.measure import emulated, load
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.record import TestResult
from ortbuild.gating.runner import Tester
from ortbuild.gating.search.base import Budget, Found, Say
from ortbuild.gating.search.layerwise import joined, samples
from ortbuild.gating.search.tune_search import (
    MIN_SECONDS,
    NOT_TRIED,
    RETRY_WAIT_SECONDS,
    Comparison,
    Session,
    Tuning,
    compare,
    declared_session,
    search,
    worst,
)
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.project import config, lock_entry, lockfile
from ortbuild.project.kinds import kind_rule
from ortbuild.project.plan import Job
from ortbuild.status import JobStatus, PhaseStarted, Verdict

QUIET_WAIT_SECONDS = 10.0    # before a job's search, at most: for the load to fall
VERSUS_SHARE = 0.15          # of the seconds left after the declared gate, the fp32 note's (a reduced precision's)


def wants_tune(job: Job) -> bool:
    """`tune = true`, and no up-to-date tuning in the lock (a precision search alone is not one)."""
    return "tune" in lockfile.missing(job, job.locked)


def cannot_tune(job: Job, built: JobResult | None) -> str | None:
    """Why the job cannot be tuned here (None: it can)."""
    if (why := kind_rule(job.model.kind).not_covered) is not None:
        return why
    if built is None or built.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
        status = "not built" if built is None else f"{built.status}" + (f": {built.reason}" if built.reason else "")
        return f"its build is {status}"
    if emulated.emulated(job.target):
        return f"{job.target.platform} is emulated here: timings would say nothing about the device"
    return None


def fp32_reference(project: config.Project, job: Job) -> Job | None:
    """An fp32 target of the same model that runs here, for a reduced precision's speed note (None: none)."""
    if job.settings.precision == "fp32":
        return None
    for t in project.targets.values():
        s = t.settings.get(job.model.name)
        if s is not None and t.name != job.target.name and s.precision == "fp32" and \
                installed.runtime_problem(t) is None and not emulated.emulated(t):
            return Job(t, job.model, s)
    return None


RUN_SHARE = 1 / 40  # of the budget, what one timed run of a data set may take: a longer one is timed on a slice


def fitted(session: Any, feeds: list[dict[str, Any]], seconds: float) -> tuple[list[dict[str, Any]], list[str]]:
    """The data sets to time on: each whole where one run takes at most RUN_SHARE of `seconds`, else its first
    samples (along a batch axis every input shares), as many as fit; and what to say of those sliced."""
    out, notes = [], []
    for feed in feeds:
        t0 = time.monotonic()
        session.run(feed)
        whole = time.monotonic() - t0
        each = samples(feed)
        if whole <= seconds * RUN_SHARE or len(each) == 1:
            out.append(feed)
            continue
        k = max(1, min(len(each), int(seconds * RUN_SHARE / (whole / len(each)))))
        part = joined(each[:k])
        try:
            session.run(part)
        except Exception:
            out.append(feed)
            continue
        out.append(part)
        notes.append(f"timed on the first {k} of {len(each)} golden samples: one run of all of them takes "
                     f"{whole:.1f} s, more than {RUN_SHARE:.1%} of the {seconds:g} s budget")
    return out, notes


class Sessions:
    """Opens the artifact through its loader with given session options (a LoaderError as ortbuild's error)."""

    def __init__(self, module: ModuleType, folder: Path, secret: bytes | None, where: str) -> None:
        self.module, self.folder, self.secret, self.where = module, folder, secret, where

    def open(self, session: Session) -> Any:
        try:
            return self.module.load(key=self.secret, folder=self.folder, session=session)
        except self.module.LoaderError as e:
            raise from_loader(e, self.where) from None


def plan_of(job: Job) -> latency.Plan:
    gates = job.settings.gates
    assert gates is not None
    return latency.Plan(gates.latency.confidence, 0, MIN_SECONDS, RETRY_WAIT_SECONDS)


def measure_pair(models: tuple[Any, Any], feeds: list[dict[str, Any]], warmup: int, plan: latency.Plan,
             deadline: float = math.inf) -> Comparison:
    """Current against candidate on every data set, paired and interleaved: the worst data set's comparison. Each
    data set's warm-up and sampling get an equal share of the time left before `deadline` (time.monotonic())."""
    current, candidate = models
    found = []
    for i, feed in enumerate(feeds):
        share = max(0.0, deadline - time.monotonic()) / (len(feeds) - i)
        calls = {"current": lambda f=feed: current.run(f), "candidate": lambda f=feed: candidate.run(f)}
        latency.warm_up(calls, warmup, share / 4)
        found.append(compare(calls, replace(plan, max_seconds=max(0.0, deadline - time.monotonic()) /
                                            (len(feeds) - i))))
    return worst(found)


class Tuner:
    """Session tuning, a base.Search over a built job (as built, its lock entry laid over) given the fp32 artifact of
    the same model to compare a reduced precision with (None: no such note). Its budget: seconds (rebuilds: none are
    made; record() rebuilds once with what it keeps). Found: the Tuning; found, where it keeps a faster setting;
    cut short, where candidates were left untried or the final measurement was not made for lack of time."""

    def __init__(self, tester: Tester, budget: Budget, progress: Say = lambda j, m: None) -> None:
        self.tester = tester
        self.budget = budget
        self.progress = progress

    def search(self, job: Job, given: Job | None) -> Found[Tuning]:
        """A declared setting that fails its accuracy gate is a GateFailed: nothing to tune."""
        tester, progress, reference = self.tester, self.progress, given
        declared_job, seconds = lockfile.declared(job), self.budget.seconds
        clock = self.budget.start()  # one deadline for all of it: the gate, the wait, every measurement, the note
        name = declared_job.name
        folder = paths.inside(tester.dist, declared_job.target.name, declared_job.model.name)
        decl = declared_session(declared_job)
        res = TestResult(declared_job.target.name, declared_job.model.name, declared_job.settings.precision)
        progress(name, PhaseStarted("tune: the accuracy gate with the declared session options"))
        t0 = time.monotonic()
        module, g, _ = tester.accuracy_gate(job, res, session=decl)
        gate_seconds = time.monotonic() - t0  # a candidate's accuracy check starts only where as much is left
        if res.accuracy != Verdict.PASS or module is None:
            raise GateFailed(f"{name}: the accuracy gate fails with the declared session options ({res.worst}): "
                             "nothing to tune", "make the artifact pass first (`ortbuild test`, precision_search = "
                                                "\"auto\"), then tune it")
        cpus = os.cpu_count() or 1
        waited = load.wait_for_quiet(min(QUIET_WAIT_SECONDS, seconds / 10, clock.left()), cpus)
        sessions = Sessions(module, folder, tester.secret, name)
        feeds, sliced = fitted(sessions.open(decl), [ds.inputs for ds in g.sets], seconds)
        gates = job.settings.gates
        assert gates is not None
        plan, warmup = plan_of(job), gates.latency.warmup_runs
        # the fp32 note's share, kept from the search: its measurement ends by the same deadline
        note_share = VERSUS_SHARE * clock.left() if reference is not None else 0.0

        def measure(current: Session, candidate: Session) -> Comparison:
            # two fresh sessions each time (also for the same options): a session's own placement in memory can make
            # it faster or slower than another with the same options, and each comparison says so in its interval
            return measure_pair((sessions.open(current), sessions.open(candidate)), feeds, warmup, plan,
                                clock.deadline - note_share)

        def accurate(session: Session) -> tuple[bool, str]:
            if clock.left() < gate_seconds:  # it would end past the deadline: the candidate is not kept
                return False, (f"not judged: its accuracy gate takes about {gate_seconds:.0f} s, "
                               f"{clock.left():.0f} s left")
            r = TestResult(declared_job.target.name, declared_job.model.name, declared_job.settings.precision)
            try:
                tester.accuracy_gate(job, r, session=session)
            except OrtbuildError as e:
                return False, first_line(e)
            return r.accuracy == Verdict.PASS, r.worst

        progress(name, PhaseStarted(f"tune: session options, greedy, at most {seconds:g} s, and the runs in flight "
                                    f"then (paired, interleaved runs at {plan.confidence:.0%} confidence); then the "
                                    "fp32 note and a rebuild with what it keeps"))
        tuning = search(decl, cpus, measure, accurate, clock.left() - note_share, clock=clock.now,
                        progress=lambda m: progress(name, m))
        tuning.notes.extend(sliced)
        if not waited["quiet"]:
            tuning.notes.append(f"the machine stayed loaded (load {waited['load']} on {cpus} CPUs) before the search: "
                                "the ratios are paired, but tune again on a quiet machine to confirm")
        if reference is not None:
            note = _versus(tester, job, module, folder, reference, tuning.tuned, feeds, warmup, plan, clock.deadline)
            tuning.notes.append(note)
            progress(name, f"tune: {note}")
        cut_short = tuning.final is None or any(t.verdict == NOT_TRIED for t in tuning.tried)
        return clock.found(tuning, found=bool(tuning.applies), cut_short=cut_short)


def _versus(tester: Tester, job: Job, module: ModuleType, folder: Path, reference: Job, session: Session,
            feeds: list[dict[str, Any]], warmup: int, plan: latency.Plan, deadline: float = math.inf) -> str:
    """The note on a reduced precision's speed against the fp32 artifact of the same model (same session options,
    paired and interleaved)."""
    ref_folder = paths.inside(tester.dist, reference.target.name, reference.model.name)
    what = f"{job.settings.precision} against {reference.name} (fp32)"
    try:
        manifest.read(ref_folder)
        ref = loaders.import_python_loader(loaders.python_path(ref_folder, reference.model.name))
        theirs = Sessions(ref, ref_folder, tester.secret, reference.name).open(session)
        mine = Sessions(module, folder, tester.secret, job.name).open(session)
        c = measure_pair((theirs, mine), feeds, warmup, plan, deadline)
    except (OrtbuildError, KeyError, TypeError) as e:  # another model's inputs, an artifact not built
        return f"{what}: not measured ({first_line(e) if isinstance(e, OrtbuildError) else e})"
    return (f"{job.settings.precision} is {c.speedup:.2f}x {reference.name}'s (fp32) speed, "
            f"{c.interval().split(' ', 1)[1]} at {c.confidence:.0%} (p50 {c.p50_ms:.3f} ms vs {c.base_p50_ms:.3f} ms, "
            "same session options, interleaved)")


def record(builder: Builder, tester: Tester, lock: lockfile.Lock, declared_job: Job, tuning: Tuning) \
        -> tuple[lockfile.Lock, Job, JobResult]:
    """Write the tuning to the lock and rebuild the job with it; its accuracy gate judges the rebuilt artifact.
    An up-to-date entry's precision-search part stays. Returns the lock, the job as rebuilt, and the build result
    (a failing rebuild leaves the lock as it was and says why in the result)."""
    source, settings = builder.fingerprint(declared_job)
    old = lock.get(declared_job)
    if not tuning.applies and old is None and not declared_job.settings.tune:
        return _nothing_kept(builder, lock, declared_job, tuning)
    keep = old if old is not None and not old.stale(source, settings) else None
    applies = {t: v for t, v in lock_entry.copied(keep.applies).items() if t != "session"} if keep else {}
    entry = lock_entry.Entry(declared_job.name, source, settings, applies, dict(keep.search) if keep else {}, {},
                             dict(keep.choice) if keep else {})
    entry = entry.merged({"session": tuning.applies} if tuning.applies else {}, tune=tuning.record())
    (locked,) = lockfile.apply(builder.project, [(declared_job, entry)])
    result = builder.run_job(locked)
    if result.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
        return lock, locked, result
    res = TestResult(declared_job.target.name, declared_job.model.name, declared_job.settings.precision)
    try:
        tester.accuracy_gate(locked, res)
    except OrtbuildError as e:
        res.accuracy, res.worst = Verdict.FAIL, first_line(e)
    if res.accuracy != Verdict.PASS:
        result.status = JobStatus.FAILED
        result.error = GateFailed(f"{declared_job.name}: rebuilt with the tuned session options ({tuning.kept()}), "
                                  f"its accuracy gate fails ({res.worst}); {lock.file.name} is left as it was",
                                  "run `ortbuild test` on it; report it if the declared options pass")
        result.reason = result.error.message
        return lock, locked, result
    written, said = lockfile.record_and_say(builder.project, entry)
    lock = written or lock
    result.notes.append(f"tune: kept {tuning.kept()}" + (f", {tuning.final.interval()} against the declared "
                                                         "options" if tuning.final and not tuning.rejected
                                                         and tuning.applies else "")
                        + f"; {said}")
    return lock, locked, result


def _nothing_kept(builder: Builder, lock: lockfile.Lock, job: Job, tuning: Tuning) \
        -> tuple[lockfile.Lock, Job, JobResult]:
    """The declared options won and nothing asks for a record (no entry to update, no `tune = true` that would tune
    again without one): the lock is left as it is, the artifact as built (its build, up to date, is the result)."""
    result = builder.run_job(job)
    result.notes.append(f"tune: kept {tuning.kept()}; {lock_entry.LOCK_FILE} not written (nothing to apply)")
    return lock, job, result


def tune_for_build(builder: Builder, tester: Tester, lock: lockfile.Lock, job: Job, progress: Say, budget: Budget) \
        -> tuple[lockfile.Lock, Job, JobResult]:
    """The build flow's tuning of one built job whose target says `tune = true` (`job`: as built, its lock entry laid
    over): tune, record, rebuild. Returns the updated lock, the job as rebuilt (its entry laid over: what the gates
    then test) and the rebuild's result (its notes say what was kept). A declared setting that fails its accuracy
    gate raises GateFailed (nothing to tune); the caller decides whether that fails the job."""
    plain = lockfile.declared(job)
    reference = fp32_reference(builder.project, plain)
    if reference is not None and not (paths.inside(builder.dist, reference.target.name, reference.model.name)
                                      / manifest_types.MANIFEST).is_file():
        reference = None
    tuning = Tuner(tester, budget, progress).search(job, reference).answer
    return record(builder, tester, lock, plain, tuning)
