"""The one status vocabulary: what a build job became, what a gate decided, what a profile did, and the one
place the exit code of a command is reduced from its results. Stdlib only (the noxfile imports it before any
venv exists).

The enums are `StrEnum`s: their values are the strings the JSON documents, reports and tables have always
carried, so `json.dumps`, f-strings and comparisons with those strings keep working; code compares members.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class JobStatus(StrEnum):
    """What `ortbuild build` made of one (target, model) job."""

    BUILT = "built"
    PORTABLE = "portable"        # built at the portable level: its providers cannot run here
    UP_TO_DATE = "up-to-date"
    PULLED = "pulled"            # the build cache held it: downloaded, verified, used (ortbuild.pipeline.cache)
    SKIPPED = "skipped"          # another runtime's environment builds it
    FAILED = "failed"

    @property
    def usable(self) -> bool:
        """An artifact is there to test, profile or release."""
        return self in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED)

    def __bool__(self) -> bool:
        return self is not JobStatus.FAILED


class Verdict(StrEnum):
    """A gate's decision (accuracy, latency, size) and a test result's overall one."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"  # latency measured under load: rerun on a quiet machine (fails with --strict)
    SKIPPED = "SKIPPED"            # the target cannot run here (with `require`, that is a failure)

    def __bool__(self) -> bool:
        return self is not Verdict.FAIL


class ArtifactState(StrEnum):
    """A manifest's `status`: everything the target asked for, or the portable part only."""

    COMPLETE = "complete"
    PORTABLE = "portable"    # its providers could not run where it was built: precision + basic level only


class ProfileStatus(StrEnum):
    PROFILED = "PROFILED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"

    def __bool__(self) -> bool:
        return self is not ProfileStatus.FAILED


class TuneStatus(StrEnum):
    """A job of `ortbuild tune`: tuned (and rebuilt with what was kept), skipped (cannot run here), failed."""

    TUNED = "TUNED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"

    def __bool__(self) -> bool:
        return self is not TuneStatus.FAILED


# ---- progress: typed events from the pipeline (and its worker processes) to the display ----

@dataclass(frozen=True)
class StepStarted:
    """A job entered a step (`[target/model] step` on a plain stream)."""

    step: str

    def text(self) -> str:
        return self.step


@dataclass(frozen=True)
class Message:
    """A line about a running job that does not end it: a note, a warning, a retry."""

    line: str

    def text(self) -> str:
        return self.line


@dataclass(frozen=True)
class PhaseStarted:
    """A long phase of a job began (a build, a gate run, a search rebuild, a set-up and its download): said on
    every stream, the quiet default included, so that a plain stream never goes long without a line."""

    phase: str

    def text(self) -> str:
        return self.phase


@dataclass(frozen=True)
class JobFinished:
    """A job ended: its status and the line that says how."""

    status: JobStatus | Verdict      # a build's, or a test's verdict
    line: str

    def text(self) -> str:
        return self.line


Event = StepStarted | Message | PhaseStarted | JobFinished


# ---- the exit code ----

def final_exit(codes: Iterable[int]) -> int:
    """A command's exit code from its results' own codes (each 0 when it succeeded): the first failure wins,
    so the code names the first problem in plan order (errors.py lists the codes)."""
    return next((c for c in codes if c), 0)
