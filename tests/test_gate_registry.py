"""The gate registry (ortbuild.gating.gates.registry): its entries are consistent with the record, and a gate added to
GATES alone reaches every reader: the runner, the verdict cell, the text table, report.html, `--gates` and the
release index."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from ortbuild.gating import record
from ortbuild.gating.gates import registry
from ortbuild.gating.protocol import Gate, Judged
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import cells as table_cells
from ortbuild.gating.reports import report, selection
from ortbuild.publish import release_index


def test_every_gate_has_one_name_and_the_first_five_their_historic_fields_of_the_record() -> None:
    assert len(set(registry.NAMES)) == len(registry.NAMES) and selection.GATES == registry.NAMES
    fields = {f.name for f in dataclasses.fields(TestResult)}
    assert set(record.HISTORIC) == {"accuracy", "size", "latency", "cold_start", "memory"} <= set(registry.NAMES)
    assert all(v in fields and (s is None or s in fields) for v, s in record.HISTORIC.values())
    # the others time the device (a generative model's tokens are judged on the device too, but untimed)
    assert [g.name for g in registry.GATES if not g.timed] == ["accuracy", "size", "tokens"]


def test_every_gate_returns_the_one_shape_and_the_record_keeps_it_under_its_name() -> None:
    r = TestResult("cpu", "m", "fp32")
    r.record("size", Judged(report.Verdict.FAIL, {"artifact_mb": 2.0}, ["size: too big"]))
    r.record("throughput", Judged(report.Verdict.PASS, {"summary": "60/s"}, []))
    r.record("latency", Judged("-", {}, []))  # ran, nothing asked of it: no section
    assert r.size_verdict == report.Verdict.FAIL and r.size == {"artifact_mb": 2.0}  # a first gate: its fields
    assert r.sections == {"throughput": {"summary": "60/s", "verdict": report.Verdict.PASS}}
    assert r.failures == ["size: too big"] and r.failed_gates() == ["size"] and r.latency == {}
    assert r.section("size") == {"artifact_mb": 2.0} and r.section("throughput")["summary"] == "60/s"


@pytest.fixture
def probe() -> Iterator[Gate]:
    """A gate registered in GATES only, as a new gate module would be."""
    gate = Gate("probe", "a test gate", lambda ctx: Judged("-", {}, []), lambda g: True, timed=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "GATES", (*registry.GATES, gate))
        mp.setattr(registry, "BY_NAME", {**registry.BY_NAME, "probe": gate})
        mp.setattr(registry, "NAMES", (*registry.NAMES, "probe"))
        yield gate


def test_a_gate_in_the_registry_alone_reaches_every_reader(probe: Gate) -> None:
    r = TestResult("cpu", "m", "fp32", status=report.Verdict.FAIL, accuracy=report.Verdict.PASS)
    r.sections["probe"] = {"verdict": "FAIL", "summary": "41/s < 50/s", "budget": {"min_per_second": 50},
                           "observed": 41.0}
    row = {**r.as_json(), "delta": None}
    assert table_cells.verdict_cell(TestResult.from_json(row)) == "FAIL (probe)"
    head, [cells] = table_cells.text_table([row], None)  # type: ignore[list-item]
    assert cells[head.index("more gates")] == "probe 41/s < 50/s"
    page = report.render_html({"created": "now", "counts": {}, "comparison": None, "results": [row],  # type: ignore[list-item]
                               "environments": {}, "profiles": []})
    assert "<h3>probe: <span class=FAIL>FAIL</span></h3>" in page and "<th>observed</th><td>41.0</td>" in page
    assert "<th>budget</th><td>min_per_second 50</td>" in page  # a table of scalars, shown too
    index = release_index.verdicts(TestResult.from_json(row), None)
    assert index["gates"] == {"probe": {"verdict": "FAIL", "budget": {"min_per_second": 50}}}
    assert "gates" not in release_index.verdicts(TestResult("cpu", "m", "fp32"), None)  # none ran: as before


def test_the_more_gates_column_is_left_out_while_no_row_has_one() -> None:
    row = {**TestResult("cpu", "m", "fp32").as_json(), "delta": None}
    head, _ = table_cells.text_table([row], None)  # type: ignore[list-item]
    assert "more gates" not in head
