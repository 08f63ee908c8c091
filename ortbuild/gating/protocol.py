"""The gate protocol: what a gate is (`Gate`), what it is given (`Context`) and what it returns (`Judged`).

Every gate of `ortbuild test` is one `Gate` in its own module under ortbuild/gating/gates/, listed once in
ortbuild.gating.gates.registry; the runner (ortbuild.gating.runner) runs the registry's gates in order and has no
code of any one gate. A gate's `run` measures and judges one built job and returns a `Judged`: its verdict ("-":
it ran but nothing was asked of it), its section (what it measured, with `summary`, its one-line cell in the text
table, and `budget`, what a release records) and its failure lines. The record keeps every gate's section under
its name (ortbuild.gating.record: the first five gates' under their historic fields).

Stdlib only: the registry, and the record that reads its names, are read where only the stdlib is (the noxfile's
summary); a gate imports its measurement (numpy, ONNX Runtime) inside `run`, as pipeline/stages.py's steps do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from ortbuild import paths
from ortbuild.errors import from_loader
from ortbuild.project.kinds import Kind
from ortbuild.status import Event, Verdict

if TYPE_CHECKING:
    from ortbuild.artifact import golden, manifest_types
    from ortbuild.artifact.keys import SigningKey
    from ortbuild.pipeline.job import JobResult
    from ortbuild.project.config import Project
    from ortbuild.project.plan import Job
    from ortbuild.project.settings import Gates

NOT_RUN: Literal["-"] = "-"   # a gate that did not run (not asked for, not judged, or the job never got there)


class Judged(NamedTuple):
    """What a gate returns: its verdict, its section, its failure lines."""

    verdict: Verdict | Literal["-"]
    section: dict[str, object]
    lines: list[str]


class Testing(Protocol):
    """The test run a gate is part of (the runner's Tester): where, with which key, how strictly, and what to
    keep between its jobs."""

    project: Project
    dist: Path
    secret: bytes | None
    sign_key: SigningKey | None
    quick: bool                       # --quick
    find_peak: bool                   # --find-peak
    judged: tuple[str, ...]           # --gates
    config_arg: str
    cache: dict[str, object]          # what the run's gates keep between jobs (a target's output names, ...)

    def progress(self, job: str, event: Event | str) -> None: ...


@dataclass
class Context:
    """What a gate is given about one built job under test: the test run, the job, the opened loader, the golden
    data and the outputs the golden run produced (one dict per golden data set)."""

    tester: Testing
    job: Job
    module: ModuleType | None          # the generated Python loader (None: an emulated platform's target)
    golden: golden.Golden
    manifest: manifest_types.Manifest
    outputs: list[dict[str, object]]   # the golden run's outputs, per golden data set
    built: dict[str, JobResult]        # every job's build (the references of relative budgets)
    golden_doc: dict[str, object] = field(default_factory=dict)   # the record's `golden`: the data judged by
    memo: dict[str, object] = field(default_factory=dict)  # one measurement two gates share (cold start, memory)
    opened: Any = field(default=None, repr=False)  # the artifact as open() opened it with its own options, kept

    @property
    def project(self) -> Project:
        return self.tester.project

    @property
    def dist(self) -> Path:
        return self.tester.dist

    @property
    def folder(self) -> Path:
        return paths.inside(self.tester.dist, self.job.target.name, self.job.model.name)

    @property
    def secret(self) -> bytes | None:
        return self.tester.secret

    @property
    def quick(self) -> bool:
        return self.tester.quick

    @property
    def find_peak(self) -> bool:
        return self.tester.find_peak

    @property
    def gates(self) -> Gates:
        gates = self.job.settings.gates
        assert gates is not None, "a job under test has its gate settings"
        return gates

    def progress(self, job: str, text: str) -> None:
        self.tester.progress(job, text)

    def teller(self, what: str) -> Callable[[str], None]:
        """Says a phase's later lines (a retry's wait) as the job's progress, after `what` ("server on NAME")."""
        return lambda text: self.tester.progress(self.job.name, f"{what}: {text}")

    def open(self, **session: object) -> Any:  # the generated loader's Model (run, inputs, outputs)
        """The artifact opened through its generated loader (verify, decrypt, session), `session` options over
        its own. Opened with its own options, it is opened once for the gates that ask (eval and the load
        scenarios share one session, as a service does; they run one after another, after the latency gate's
        sessions are gone, so one session of a big model is held at a time)."""
        assert self.module is not None, "a timed gate runs only where the loader runs (not under emulation)"
        if not session and self.opened is not None:
            return self.opened
        kw: dict[str, object] = {"session": session} if session else {}
        try:
            model = self.module.load(key=self.secret, folder=self.folder, **kw)
        except self.module.LoaderError as e:
            raise from_loader(e, self.job.name) from None
        if not session:
            self.opened = model
        return model


ONNX: frozenset[Kind] = frozenset({"onnx"})
BOTH: frozenset[Kind] = frozenset({"onnx", "generative"})
GENERATIVE: frozenset[Kind] = frozenset({"generative"})


@dataclass(frozen=True)
class Gate:
    """One gate: its name (`--gates NAME`, the record's `gates`, `FAIL (NAME)`), what it judges in one line
    (docs/testing.md's table), how it measures and judges (`run`), whether a target asks for it (`declared`: a
    budget is set), whether it times the device (`timed`: SKIPPED under emulation, where it would time the
    emulator), the kinds of model it judges, a check of its settings made before any gate of the job runs, and
    its part of report.html (else the section's scalars are shown)."""

    name: str
    summary: str
    run: Callable[[Context], Judged]
    declared: Callable[[Gates], bool]
    timed: bool = False
    kinds: frozenset[Kind] = ONNX
    check: Callable[[Context], None] | None = None
    html: Callable[[dict[str, object]], list[str]] | None = None
