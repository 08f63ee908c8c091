"""What the searches share: precision bisection (explain.py, `ortbuild test --explain`), build to the gates
(autobuild.py: `precision_search = "auto"`, each kind of model its own search, gensearch.py the generative one) and
session tuning (tune.py: `ortbuild tune`, `tune = true`).

- `Budget`: what a search may spend, rebuilds (None: no bound) and seconds; the CLI builds one from its flags
  (`--explain-rebuilds`/`--explain-seconds`; `--tune-seconds`, `ortbuild tune --seconds`).
- `Clock`: a budget started once, at the search's start: the seconds spent and left, the rebuilds counted.
- `Search`: the one protocol, `search(job, given) -> Found`: the job, what the search starts from (the failing
  test result, the build result, the fp32 reference), and the budget it holds; `Found`: what it found, whether the
  budget cut it short, the rebuilds and seconds spent.
- `JobSearch`: what each build-to-the-gates search holds (the lock step, the tester, its budget, progress) and how
  a job it cannot ship fails.
- `Locking`: the lock step of the build-to-the-gates searches: a job's entry in targets.lock, the job rebuilt through
  it into dist/, the entry written, the jobs so locked.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, runtime_checkable

from ortbuild.project import lock_entry, lockfile
from ortbuild.status import Event, JobFinished

if TYPE_CHECKING:
    from ortbuild.errors import OrtbuildError
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import Tester
    from ortbuild.pipeline.build import Builder
    from ortbuild.pipeline.job import JobResult
    from ortbuild.project.plan import Job

Say = Callable[[str, Event | str], None]
A = TypeVar("A", covariant=True)      # what a search finds
G = TypeVar("G", contravariant=True)  # what it starts from
T = TypeVar("T")


TUNE_SECONDS = 120.0  # the tuning search's default budget per job (`--tune-seconds`)


@dataclass(frozen=True)
class Budget:
    """What one search may spend: rebuilds (None: as many as its seconds allow) and seconds."""

    rebuilds: int | None
    seconds: float

    def start(self, now: Callable[[], float] = time.monotonic) -> Clock:
        """The budget's clock, started now."""
        return Clock(self, now)


@dataclass
class Clock:
    """A budget started once: the seconds spent and left (never negative), the rebuilds counted (`rebuilt`)."""

    budget: Budget
    now: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    rebuilds: int = 0

    def __post_init__(self) -> None:
        self.started = self.now()

    def spent(self) -> float:
        return max(0.0, self.now() - self.started)

    def left(self) -> float:
        return max(0.0, self.budget.seconds - self.spent())

    @property
    def deadline(self) -> float:
        """The end of the budget's seconds, on the clock's own time (`now`)."""
        return self.started + self.budget.seconds

    def rebuilds_left(self) -> int | None:
        return None if self.budget.rebuilds is None else max(0, self.budget.rebuilds - self.rebuilds)

    def out_of_rebuilds(self) -> bool:
        return self.budget.rebuilds is not None and self.rebuilds >= self.budget.rebuilds

    def out_of_time(self) -> bool:
        return self.spent() >= self.budget.seconds

    def exhausted(self) -> bool:
        return self.out_of_rebuilds() or self.out_of_time()

    def within(self, share: float) -> bool:
        """Less than `share` of the seconds spent (a part of the search kept to a part of the budget)."""
        return self.spent() < self.budget.seconds * share

    def rebuilt(self, n: int = 1) -> None:
        self.rebuilds += n

    def found(self, answer: T, *, found: bool, cut_short: bool) -> Found[T]:
        """The search's result, with what it spent on this clock."""
        return Found(answer, found=found, cut_short=cut_short, rebuilds=self.rebuilds, seconds=self.spent())


@dataclass(frozen=True)
class Found(Generic[A]):
    """What a search found (`answer`: its own record of it), whether that is an answer that passes (`found`),
    whether the budget ended the search before it was done (`cut_short`), and what it spent."""

    answer: A
    found: bool
    cut_short: bool
    rebuilds: int
    seconds: float


@runtime_checkable
class Search(Protocol[G, A]):
    """A bounded search on one job: its budget, started afresh for each job it searches."""

    budget: Budget

    def search(self, job: Job, given: G) -> Found[A]: ...


class JobSearch:
    """What each build-to-the-gates search over a job's build result holds (autobuild.PrecisionSearch,
    fastest.FastestSearch, gensearch.GenerativeSearch): the build run's lock step, its tester, the budget each job
    starts afresh, and where progress goes; and how a job it cannot ship fails."""

    def __init__(self, locking: Locking, tester: Tester, budget: Budget, progress: Say) -> None:
        self.locking = locking
        self.tester = tester
        self.budget = budget
        self.progress = progress

    def fail(self, job: Job, given: JobResult, error: OrtbuildError) -> JobResult:
        """`given` as a failed job with `error` (its first line the reason), said on the progress stream."""
        from ortbuild.status import JobStatus

        out = dataclasses.replace(given, status=JobStatus.FAILED, notes=list(given.notes))
        out.error = error
        out.reason = error.message.split("\n", 1)[0]
        self.progress(job.name, JobFinished(JobStatus.FAILED, f"FAILED: {out.reason}"))
        return out


class Locking:
    """The lock step of one build run's searches (the builder's dist, under its lock): a job's entry in
    targets.lock, the job rebuilt through it, the entry written; `locked`: the jobs rebuilt with an entry (or
    recorded as passing), by name."""

    def __init__(self, builder: Builder, progress: Say) -> None:
        self.builder = builder
        self.progress = progress
        self.locked: dict[str, Job] = {}

    def entry(self, job: Job) -> lock_entry.Entry:
        """The job's entry to add to: its up-to-date one (a tuning, what it lays over the settings), else a new one
        with the declared job's digests."""
        if job.locked is not None:
            return job.locked
        return lock_entry.Entry(job.name, *self.builder.fingerprint(lockfile.declared(job)))

    def rebuild(self, job: Job, entry: lock_entry.Entry) -> tuple[Job, JobResult]:
        """The job with `entry` laid over it (as later builds will), built into dist/: that job and its build."""
        (locked,) = lockfile.apply(self.builder.project, [(lockfile.declared(job), entry)])
        return locked, self.builder.run_job(locked)

    def judged(self, job: Job, entry: lock_entry.Entry, tester: Tester) -> tuple[Job, JobResult, TestResult]:
        """rebuild(), then the rebuilt artifact's accuracy gate (a build with no artifact to judge, or a gate that
        cannot run, is a FAIL saying why): the job, its build and the gate's result."""
        from ortbuild.errors import OrtbuildError, first_line
        from ortbuild.gating.record import TestResult
        from ortbuild.status import JobStatus, Verdict

        locked, result = self.rebuild(job, entry)
        res = TestResult(job.target.name, job.model.name, locked.settings.precision)
        if result.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED, JobStatus.PORTABLE):
            res.accuracy, res.worst = Verdict.FAIL, f"build {result.status}: {result.reason}"
            return locked, result, res
        try:
            tester.accuracy_gate(locked, res)
        except OrtbuildError as e:
            res.accuracy, res.worst = Verdict.FAIL, first_line(e)
        return locked, result, res

    def write(self, entry: lock_entry.Entry) -> str:
        """Record the entry in targets.lock; what to say of it (a warning too where it cannot be written)."""
        lock, said = lockfile.record_and_say(self.builder.project, entry)
        if lock is None:
            self.progress(entry.job, f"WARNING: {said}")
        return said

    def keep(self, locked: Job, result: JobResult, entry: lock_entry.Entry, note: str) -> None:
        """A rebuild that passes: the entry written, the job locked, `note` (with what the writing said) in its
        result's notes and said on every stream."""
        self.locked[locked.name] = locked
        said = self.write(entry)
        result.notes.append(f"{note}; {said}")
        self.progress(locked.name, JobFinished(result.status, result.notes[-1]))

    def passes(self, job: Job, result: JobResult, found: str) -> None:
        """A job that passes as it is built: its entry (with what an up-to-date one already lays over it)."""
        entry = self.entry(job)
        how = "passes as declared" if not entry.applies else "passes with what targets.lock lays over it"
        entry = entry.merged({}, search={"result": f"{how} ({found})"})
        said = self.write(entry)
        result.notes.append(f"precision_search: {entry.search['result']}; {said}")
        self.progress(job.name, JobFinished(result.status, result.notes[-1]))
        self.locked[job.name] = dataclasses.replace(job, locked=entry)
