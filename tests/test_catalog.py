"""The gate registry (ortbuild.gating.gates.catalog): its entries are consistent with the record, and a gate added to
GATES alone reaches every reader: the verdict cell, the text table, report.html, `--gates` and the release index."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from ortbuild.gating.gates import catalog
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import report, selection
from ortbuild.publish import release_index


def test_every_gate_has_one_name_and_a_first_gate_a_field_of_the_record() -> None:
    assert len(set(catalog.NAMES)) == len(catalog.NAMES) and selection.GATES == catalog.NAMES
    fields = {f.name for f in dataclasses.fields(TestResult)}
    assert all(g.field in fields for g in catalog.GATES if g.field is not None)
    # the others time the device (a generative model's tokens are judged on the device too, but untimed)
    assert [g.name for g in catalog.GATES if not g.timed] == ["accuracy", "size", "tokens"]


@pytest.fixture
def probe() -> Iterator[catalog.Gate]:
    """A gate registered in GATES only, as a new gate module would be."""
    gate = catalog.Gate("probe", "a test gate", lambda ctx: None, lambda g: True, timed=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(catalog, "GATES", (*catalog.GATES, gate))
        mp.setattr(catalog, "BY_NAME", {**catalog.BY_NAME, "probe": gate})
        yield gate


def test_a_gate_in_the_registry_alone_reaches_every_reader(probe: catalog.Gate) -> None:
    r = TestResult("cpu", "m", "fp32", status=report.Verdict.FAIL, accuracy=report.Verdict.PASS)
    r.sections["probe"] = {"verdict": "FAIL", "summary": "41/s < 50/s", "budget": {"min_per_second": 50},
                           "observed": 41.0}
    row = {**r.as_json(), "delta": None}
    assert report.verdict_cell(TestResult.from_json(row)) == "FAIL (probe)"
    head, [cells] = report.text_table([row], None)  # type: ignore[list-item]
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
    head, _ = report.text_table([row], None)  # type: ignore[list-item]
    assert "more gates" not in head
