"""What one job's pipeline works with: the prepared job (fixed once its build key is known), the results its
steps returned so far, and the JobResult the command reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ortbuild import installed, logs, modelfiles, runtime
from ortbuild.artifact import keys
from ortbuild.errors import OrtbuildError
from ortbuild.project import options
from ortbuild.project.config import Project, Provider
from ortbuild.project.plan import Job
from ortbuild.status import JobStatus

T = TypeVar("T")


@dataclass
class JobResult:
    """One job's outcome, filled in as its steps return (a failed job reports what was known by then)."""

    target: str
    model: str
    status: JobStatus
    reason: str = ""
    precision: str = ""
    level: str = ""
    artifact: str | None = None
    size: int | None = None
    source_size: int | None = None
    seconds: float = 0.0
    step: str = ""                   # the step running last: the one that failed, for a failed job
    steps: dict[str, float] = field(default_factory=dict)
    converted: float | None = None   # the share of the float weights the precision step converted
    notes: list[str] = field(default_factory=list)
    error: OrtbuildError | None = None
    debug: str = ""                  # the traceback behind a StepError (shown with --debug)
    log: logs.Captured | None = None  # what third-party tools said while it built (dist/logs/)

    def as_json(self) -> dict[str, object]:
        """The job's record (dist/logs/<target>/<model>.build.json, `build --json`): only dumped and read by key."""
        out: dict[str, object] = {k: v for k, v in self.__dict__.items() if k not in ("error", "debug", "log")}
        if self.log is not None and self.log.path is not None and self.log.lines:
            out["log"] = {"path": str(self.log.path), "lines": self.log.lines, "warnings": self.log.warnings}
        if self.error is not None:
            out["error"] = {"class": type(self.error).__name__, "exit_code": self.error.exit_code,
                            "message": self.error.message, "hint": self.error.hint}
        return out

    def __bool__(self) -> bool:
        return bool(self.status)


@dataclass(frozen=True)
class Prepared:
    """A job with everything its build key depends on, computed before any model is parsed."""

    job: Job
    project: Project
    dist: Path                                      # the output directory: every write stays below it
    out_dir: Path
    files: modelfiles.ModelFiles                    # the source model's files, hashed for the build key
    usable: list[Provider]
    missing: dict[str, str]                         # provider -> why it cannot run here (a portable build)
    flavor: installed.Flavor
    plugins: dict[str, dict[str, str]]              # key.plugin_versions(): as installed here
    libraries: list[runtime.CustomOpLibrary]        # the custom-op libraries found here
    inputs_sha: str
    key: str
    key_parts: dict[str, str]                       # digest per part of the key
    secrets: keys.Secrets                           # the encryption key only where the target encrypts
    plugin_eps: dict[str, options.PluginEP]         # the target's plugin EPs, by the provider each registers
    compile_for: Provider | None                    # the provider that compiles the model ahead of time, if any
    work: Path | None = None                        # the private temp dir of the build phase

    @property
    def tmp(self) -> Path:
        if self.work is None:
            raise RuntimeError(f"{self.job.name}: a build step ran outside the build phase's temp dir")
        return self.work

    @property
    def signing(self) -> keys.SigningKey:
        if self.secrets.signing is None:
            raise RuntimeError("Builder.check_keys() lets no job start without a signing key")
        return self.secrets.signing

    @property
    def run_on(self) -> list[Provider]:
        """A portable build is proven on the CPU of this runtime; otherwise on the target's providers."""
        return [Provider("CPUExecutionProvider")] if self.missing else self.usable


class Done:
    """The frozen results the job's steps returned so far, one per type: a step asks for what it needs."""

    def __init__(self) -> None:
        self._by_type: dict[type, object] = {}

    def add(self, result: object) -> None:
        self._by_type.pop(type(result), None)  # a newer result of a type replaces it, and comes last
        self._by_type[type(result)] = result

    def since(self, count: int) -> list[object]:
        """The results added after the first `count` (what a step returned, or handed on before it failed)."""
        return list(self._by_type.values())[count:]

    def __len__(self) -> int:
        return len(self._by_type)

    def get(self, cls: type[T]) -> T | None:
        found = self._by_type.get(cls)
        return found if isinstance(found, cls) else None

    def __getitem__(self, cls: type[T]) -> T:
        found = self.get(cls)
        if found is None:
            raise RuntimeError(f"no {cls.__name__} yet: a step ran before the step that makes it (PIPELINE order)")
        return found
