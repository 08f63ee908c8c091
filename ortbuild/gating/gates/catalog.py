"""The gates, as a table: `GATES`, one entry per gate of `ortbuild test`, in the order they run. A new gate joins
GATES here, and nowhere else (docs/design.md, "Adding a gate").

An entry says what the gate is called (`--gates NAME`, the `gates` of a test record, `FAIL (NAME)`), whether a
target asks for it (`declared`: a budget is set), whether it times the device (`timed`: SKIPPED under emulation,
where it would measure the emulator), and how it measures and judges (`run`, given the job's `Context`).

The first gates keep the record's historic fields (`accuracy`, `size_verdict`, `latency`, ...): their `run` fills
them itself and returns None, and their report parts are report.py's and report_html.py's. A newer gate returns
a `Judged` (verdict, section, failure lines) and keeps its section in the record's `sections` under its name;
readers need none of its code: the section's `summary` is its cell in the text table, its `budget` what a
release records, and its `html` hook (where it has one, imported when the page is rendered) its part of the
artifact's section in report.html (otherwise the section's scalar keys are shown).

Stdlib only: the registry is read where only the stdlib is (the noxfile's summary); each `run` imports its gate
module (numpy, ONNX Runtime) when it runs, as pipeline/stages.py's steps do.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ortbuild import paths
from ortbuild.errors import from_loader
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.artifact import golden, manifest
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import Tester
    from ortbuild.pipeline.job import JobResult
    from ortbuild.project.config import Project
    from ortbuild.project.plan import Job
    from ortbuild.project.settings import Gates

NOT_RUN: Literal["-"] = "-"   # a gate that did not run (not asked for, not judged, or the job never got there)
Judged = tuple[Verdict | Literal["-"], dict[str, object], list[str]]  # verdict, section, failure lines


@dataclass
class Context:
    """What a gate is given about one built job under test: the job, its record, the opened loader, the golden
    data and the outputs the accuracy run produced (one dict per golden data set)."""

    tester: Tester
    job: Job
    result: TestResult
    module: ModuleType | None          # the generated Python loader (None: an emulated platform's target)
    golden: golden.Golden
    manifest: manifest.Manifest
    outputs: list[dict[str, object]]   # the accuracy run's outputs, per golden data set
    built: dict[str, JobResult]        # every job's build (the references of relative budgets)
    done: set[str] = field(default_factory=set)  # gates whose measurement already ran (cold start + memory: one)
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


@dataclass(frozen=True)
class Gate:
    name: str
    summary: str                                   # what it judges, one line (docs/testing.md's table)
    run: Callable[[Context], Judged | None]
    declared: Callable[[Gates], bool]              # whether the target asks for it (a budget is set)
    timed: bool = False                            # measures the device: SKIPPED under emulation
    field: str | None = None                       # a first gate: the record's field holding its verdict
    html: str | None = None                        # "module:function" rendering its part of report.html
    kinds: frozenset[str] = frozenset({"onnx"})    # the kinds of model it judges: "onnx", "generative"

    def judges(self, generative: bool) -> bool:
        """Whether it judges a model of that kind (a generative model's gates are its own, and size)."""
        return ("generative" if generative else "onnx") in self.kinds


def _lazy(module: str, function: str) -> Callable[[Context], Judged | None]:
    def run(ctx: Context) -> Judged | None:
        fn: Callable[[Context], Judged | None] = getattr(importlib.import_module(module), function)
        return fn(ctx)
    return run


def _tester(method: str) -> Callable[[Context], Judged | None]:
    """A first gate, measured by the Tester's method of that name (it fills the record's historic fields)."""
    def run(ctx: Context) -> None:
        getattr(ctx.tester, method)(ctx)
    return run


BOTH, GENERATIVE = frozenset({"onnx", "generative"}), frozenset({"generative"})
GATES: tuple[Gate, ...] = (
    Gate("accuracy", "golden outputs against the source's, by the precision's rule", _tester("judge_accuracy"),
         lambda g: True, field="accuracy"),
    Gate("size", "the artifact's size against the source's and a cap", _tester("judge_size"),
         lambda g: True, field="size_verdict", kinds=BOTH),
    Gate("latency", "single-stream latency percentiles, absolute and relative", _tester("judge_latency"),
         lambda g: bool(g.latency.budgets() or g.latency.faster_than), timed=True, field="latency_verdict"),
    Gate("cold_start", "import + load + first run in fresh processes", _tester("judge_startup"),
         lambda g: "cold_start" in g.startup_budgets, timed=True, field="cold_start_verdict"),
    Gate("memory", "peak RSS of a fresh process that loads and runs the artifact", _tester("judge_startup"),
         lambda g: "memory" in g.startup_budgets, timed=True, field="memory_verdict"),
    Gate("eval", "a task metric on labelled data against the fp32 source's, within max_drop",
         _lazy("ortbuild.gating.gates.task", "gate"), lambda g: g.eval.max_drop is not None, timed=True),
    Gate("throughput", "samples per second at a batch (MLPerf Offline)", _lazy("ortbuild.gating.gates.throughput", "gate"),
         lambda g: g.latency.declares("offline"), timed=True),
    Gate("server", "latency percentiles under Poisson arrivals at a rate (MLPerf Server), --find-peak",
         _lazy("ortbuild.gating.gates.server", "gate"), lambda g: g.latency.declares("server"), timed=True,
         html="ortbuild.gating.gates.server:html"),
    Gate("multi_stream", "latency of queries of N concurrent samples (MLPerf MultiStream)",
         _lazy("ortbuild.gating.gates.multistream", "gate"), lambda g: g.latency.declares("multi_stream"), timed=True),
    Gate("tokens", "a generative model's greedy tokens, next-token logits and perplexity against the fp32 source's",
         _lazy("ortbuild.gating.gates.genai", "tokens"), lambda g: True, kinds=GENERATIVE),
    Gate("generation", "time to first token, time per output token, tokens/s and peak memory with the KV cache",
         _lazy("ortbuild.gating.gates.genai", "generation"), lambda g: g.generation.declared, timed=True,
         kinds=GENERATIVE),
)
NAMES = tuple(g.name for g in GATES)
BY_NAME = {g.name: g for g in GATES}


def html_of(gate: Gate) -> Callable[[dict[str, object]], list[str]] | None:
    """A newer gate's renderer of its section in report.html (None: the generic one)."""
    if gate.html is None:
        return None
    module, _, function = gate.html.partition(":")
    fn: Callable[[dict[str, object]], list[str]] = getattr(importlib.import_module(module), function)
    return fn
