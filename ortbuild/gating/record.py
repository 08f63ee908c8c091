"""The test record: one artifact's verdicts and what each gate measured, as `ortbuild test` writes it
(dist/<target>/<model>/test-report.json's `result`, a row of dist/report.json) and as everything that reads those
back uses it: the text and HTML reports, the summary, the release index, the noxfile.

`as_json` gives the document (records.ResultDoc: every field in order, then `gates` and `failed_gates`);
`from_json` reads one back, an older ortbuild's included (a key it lacks takes its default; a value of the wrong
kind is refused with the key named). A gate's verdict is read through the registry (ortbuild.gating.gates.catalog):
the first gates from their historic fields, newer ones from their section in `sections`.
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
from ortbuild.gating.gates import catalog
from ortbuild.status import Verdict, final_exit

NOT_RUN: Literal["-"] = "-"         # a gate that did not run (the target cannot run here, or it has no budget)
VERDICT_FIELDS = ("status", *(g.field for g in catalog.GATES if g.field))


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
    judged: list[str] = field(default_factory=lambda: list(catalog.NAMES))  # --gates: release needs them all
    speed: list[timing_records.SpeedDoc] = field(default_factory=list)  # slower than what it derives from (speed)
    platform: dict[str, object] = field(default_factory=dict)  # an emulated platform's run (ortbuild.emulation)
    build: records.BuildDoc = field(default_factory=records.BuildDoc)  # a failed build: its step and log (builds)
    exit_code: int = 0
    gates_key: str = ""              # what it judged by (gates.gates_key): release refuses budgets changed since
    # the newer gates' sections by gate name, each with its `verdict` (ortbuild.gating.gates.catalog); in the document
    # only when one ran
    sections: dict[str, dict[str, object]] = field(default_factory=dict)
    generative: bool = False         # a generative model: its gates are its own (catalog's kinds); in the document
                                     # only when true

    def fail(self, lines: list[str], code: int = GateFailed.exit_code) -> None:
        self.failures += lines
        self.exit_code = final_exit((self.exit_code, code))  # the first failure's code stands

    def __bool__(self) -> bool:
        """Whether the gates passed (an INCONCLUSIVE or SKIPPED verdict is no failure: --strict and `require`
        decide about those)."""
        return bool(self.status)

    def verdict(self, gate: str) -> str:
        """One gate's verdict ("-": it did not run)."""
        g = catalog.BY_NAME[gate]
        if g.field is not None:
            return str(getattr(self, g.field))
        return str(self.sections.get(gate, {}).get("verdict", NOT_RUN))

    def set_verdict(self, gate: str, verdict: Verdict | Literal["-"]) -> None:
        g = catalog.BY_NAME[gate]
        if g.field is not None:
            setattr(self, g.field, verdict)
        else:
            self.sections.setdefault(gate, {})["verdict"] = verdict

    def gates(self) -> dict[str, str]:
        """Each gate's verdict, by name ("-": it did not run)."""
        return {g.name: self.verdict(g.name) for g in catalog.GATES}

    def failed_gates(self) -> list[str]:
        """The gates that failed, by name (a build failure or a required target that cannot run is none of
        them: `reason` says why)."""
        return [name for name, v in self.gates().items() if v == Verdict.FAIL]

    def as_json(self) -> records.ResultDoc:
        """Every field in order (asdict: a deep copy, nothing shared with this result; `sections` only when a
        newer gate filled one), then `gates` and `failed_gates`; records.ResultDoc names the same fields
        (tests/test_report.py)."""
        doc = asdict(self)
        for key in ("sections", "generative"):
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
            gate = catalog.BY_NAME.get(str(name))
            if gate is not None and _verdict(verdict) != NOT_RUN and (
                    gate.field not in doc if gate.field else name not in record.sections):
                record.set_verdict(gate.name, _verdict(verdict))
        return record
