"""The test record: one artifact's verdicts and what each gate measured, as `ortbuild test` writes it
(dist/<target>/<model>/test-report.json's `result`, a row of dist/report.json) and as everything that reads those
back uses it: the text and HTML reports, the summary, the release index, the noxfile.

`as_json` gives the document (records.ResultDoc: every field in order, then `gates` and `failed_gates`);
`from_json` reads one back, an older ortbuild's included (a key it lacks takes its default; a value of the wrong
kind is refused with the key named). Every gate hands the record the same shape (`record`: its verdict, section
and failure lines, ortbuild.gating.protocol.Judged); the record keeps the first five gates' under the document's
historic fields (HISTORIC), every other gate's section in `sections` under its name.
Stdlib only (the noxfile reads records in nox's own interpreter).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal, cast

from ortbuild.errors import GateFailed
from ortbuild.gating import records, timing_records
from ortbuild.gating.gates import registry
from ortbuild.gating.protocol import NOT_RUN, Judged
from ortbuild.project.kinds import KINDS, Kind, spelled
from ortbuild.status import Verdict, final_exit

# The document's historic fields of the first five gates (its format, not a gate's code): the field of its
# verdict, and the field its section is (None: the section's keys are fields themselves)
HISTORIC: dict[str, tuple[str, str | None]] = {
    "accuracy": ("accuracy", None),
    "size": ("size_verdict", "size"),
    "latency": ("latency_verdict", "latency"),
    "cold_start": ("cold_start_verdict", "startup"),
    "memory": ("memory_verdict", "startup"),
}
VERDICT_FIELDS = ("status", *(field for field, _ in HISTORIC.values()))


def doc_kind(doc: Mapping[str, object]) -> Kind:
    """The kind of model a record's document is about (as the kind's rule spells it: "generative": true)."""
    return next(k for k in KINDS if spelled(k) == ("generative", bool(doc.get("generative", False))))


def _verdict(text: object) -> Verdict | Literal["-"]:
    return Verdict(text) if isinstance(text, str) and text in set(Verdict) else NOT_RUN


@dataclass
class TestResult:
    __test__: ClassVar[bool] = False   # not a pytest test class

    target: str
    model: str
    precision: str
    status: Verdict = Verdict.PASS
    reason: str = ""
    accuracy: Verdict | Literal["-"] = NOT_RUN
    worst: str = "-"
    outputs: list[records.OutputDoc] = field(default_factory=list)
    golden: records.GoldenDoc = field(default_factory=records.GoldenDoc)
    latency: timing_records.LatencyDoc = field(default_factory=timing_records.LatencyDoc)
    latency_verdict: Verdict | Literal["-"] = NOT_RUN
    size: records.SizeDoc = field(default_factory=records.SizeDoc)
    size_verdict: Verdict | Literal["-"] = NOT_RUN
    # cold start and peak memory, measured in fresh processes through the loader (ortbuild.gating.measure.startup)
    startup: timing_records.StartupDoc = field(default_factory=timing_records.StartupDoc)
    cold_start_verdict: Verdict | Literal["-"] = NOT_RUN
    memory_verdict: Verdict | Literal["-"] = NOT_RUN
    failures: list[str] = field(default_factory=list)   # the failure report's lines
    reproduce: str = ""
    explain: records.ExplainDoc = field(default_factory=records.ExplainDoc)  # `--explain`: the precision search
    build_key: str = ""
    artifact_sha256: str = ""        # the artifact these verdicts are about (release refuses stale verdicts)
    quick: bool = False              # --quick: 90% confidence timings while iterating; release refuses them
    judged: list[str] = field(default_factory=lambda: list(registry.NAMES))  # --gates: release needs them all
    speed: list[timing_records.SpeedDoc] = field(default_factory=list)  # slower than what it derives from (speed)
    platform: dict[str, object] = field(default_factory=dict)  # an emulated platform's run (ortbuild.emulation)
    build: records.BuildDoc = field(default_factory=records.BuildDoc)  # a failed build: its step and log (builds)
    exit_code: int = 0
    gates_key: str = ""              # what it judged by (gates.gates_key): release refuses budgets changed since
    # the other gates' sections by gate name, each with its `verdict`; in the document only when one ran
    sections: dict[str, dict[str, object]] = field(default_factory=dict)
    kind: Kind = "onnx"              # the kind of model: it takes the gates of its kind; the document spells it
                                     # as its rule does ("generative": true), only when the flag is set

    def fail(self, lines: list[str], code: int = GateFailed.exit_code) -> None:
        self.failures += lines
        self.exit_code = final_exit((self.exit_code, code))  # the first failure's code stands

    def __bool__(self) -> bool:
        """Whether the gates passed (an INCONCLUSIVE or SKIPPED verdict is no failure: --strict and `require`
        decide about those)."""
        return bool(self.status)

    def record(self, gate: str, judged: Judged) -> None:
        """What one gate found: its verdict and section kept under its name (a first gate's under its historic
        fields; a section is kept when the gate measured something or judged), its failure lines failed."""
        verdict, section, lines = judged
        if gate in HISTORIC:
            verdict_field, section_field = HISTORIC[gate]
            setattr(self, verdict_field, verdict)
            if section_field is None:
                for key, value in section.items():
                    setattr(self, key, value)
            elif section:
                setattr(self, section_field, section)
        elif verdict != NOT_RUN or section:  # measured without a budget: reported, verdict "-"
            self.sections[gate] = {**section, "verdict": verdict}
        if lines:
            self.fail(lines)

    def section(self, gate: str) -> Mapping[str, object]:
        """What one gate measured (a first gate's from its historic field; {} where it has none)."""
        if gate in HISTORIC:
            section_field = HISTORIC[gate][1]
            return cast(Mapping[str, object], getattr(self, section_field)) if section_field else {}
        return self.sections.get(gate, {})

    def verdict(self, gate: str) -> str:
        """One gate's verdict ("-": it did not run)."""
        if gate in HISTORIC:
            return str(getattr(self, HISTORIC[gate][0]))
        return str(self.sections.get(gate, {}).get("verdict", NOT_RUN))

    def set_verdict(self, gate: str, verdict: Verdict | Literal["-"]) -> None:
        if gate in HISTORIC:
            setattr(self, HISTORIC[gate][0], verdict)
        else:
            self.sections.setdefault(gate, {})["verdict"] = verdict

    def gates(self) -> dict[str, str]:
        """Each gate's verdict, by name ("-": it did not run)."""
        return {name: self.verdict(name) for name in registry.NAMES}

    def failed_gates(self) -> list[str]:
        """The gates that failed, by name (a build failure or a required target that cannot run is none of
        them: `reason` says why)."""
        return [name for name, v in self.gates().items() if v == Verdict.FAIL]

    def as_json(self) -> records.ResultDoc:
        """Every field in order (asdict: a deep copy, nothing shared with this result; `sections` only when a
        newer gate filled one), then `gates` and `failed_gates`; records.ResultDoc names the same fields
        (tests/test_report.py)."""
        doc = asdict(self)
        spelling, flag = spelled(doc.pop("kind"))
        doc[spelling] = flag
        for key in ("sections", spelling):
            if not doc[key]:
                del doc[key]
        return cast(records.ResultDoc, {**doc, "gates": self.gates(), "failed_gates": self.failed_gates()})

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> TestResult:
        """A record as `as_json` wrote it (test-report.json's `result`, a report.json row), an older ortbuild's
        too: a missing key takes its default, a verdict that is none is "-", and a value of another kind than
        the field's is a ValueError naming the key. Nothing is shared with `doc`."""
        defaults = cls("", "", "")
        kw: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            if f.name == "kind":
                kw["kind"] = doc_kind(doc)
                continue
            if f.name not in doc:
                continue
            value, default = doc[f.name], getattr(defaults, f.name)
            if f.name in VERDICT_FIELDS:
                value = _verdict(value)
            elif not isinstance(value, type(default)) or (isinstance(value, bool) and not isinstance(default, bool)):
                raise ValueError(f"'{f.name}' is of type {type(value).__name__}, not {type(default).__name__}")
            kw[f.name] = copy.deepcopy(value)
        record = dataclasses.replace(defaults, **kw)  # type: ignore[arg-type]  # each value's kind checked above
        given = doc.get("gates")
        for name, verdict in (given.items() if isinstance(given, Mapping) else ()):  # a verdict only `gates` holds
            name = str(name)
            if name in registry.BY_NAME and _verdict(verdict) != NOT_RUN and (
                    HISTORIC[name][0] not in doc if name in HISTORIC else name not in record.sections):
                record.set_verdict(name, _verdict(verdict))
        return record
