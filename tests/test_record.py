"""The typed test record (ortbuild.gating.record): as_json and from_json agree, older reports read back, a value of
the wrong kind is refused with its key named, and a gate's verdict is found where the registry says it lives."""

from __future__ import annotations

import json

import pytest

from ortbuild.gating.gates import registry
from ortbuild.gating.protocol import Gate, Judged
from ortbuild.gating.record import TestResult
from ortbuild.status import Verdict


def test_a_record_reads_back_what_it_wrote_through_json() -> None:
    r = TestResult("cpu", "m", "int8-dynamic", accuracy=Verdict.FAIL, worst="y: cosine 0.5", size_verdict=Verdict.PASS,
                   latency={"p50_ms": 1.5, "verdicts": []}, judged=["accuracy", "size"])
    r.fail(["accuracy: cpu/m failed"])
    r.status = Verdict.FAIL
    back = TestResult.from_json(json.loads(json.dumps(r.as_json())))
    assert back == r and back.status is Verdict.FAIL and not back  # a failed record is falsy: compare with None
    assert back.failed_gates() == ["accuracy"] and back.gates()["latency"] == "-"


def test_an_older_report_takes_the_defaults_of_what_it_lacks() -> None:
    old = {"target": "cpu", "model": "m", "precision": "fp32", "status": "PASS", "accuracy": "PASS",
           "latency_verdict": "INCONCLUSIVE", "size_verdict": "PASS"}  # before startup, judged, gates, sections
    r = TestResult.from_json(old)
    assert r.judged == list(registry.NAMES) and r.sections == {} and r.startup == {}
    assert r.gates() == {**dict.fromkeys(registry.NAMES, "-"), "accuracy": "PASS", "size": "PASS",
                         "latency": "INCONCLUSIVE"}
    assert TestResult.from_json({}).target == ""  # nothing at all: an empty record, not a crash


def test_a_verdict_only_the_gates_map_holds_is_read_from_it() -> None:
    r = TestResult.from_json({"status": "FAIL", "gates": {"size": "FAIL", "nonsense": "FAIL"}})
    assert r.size_verdict is Verdict.FAIL and r.failed_gates() == ["size"]
    assert TestResult.from_json({"size_verdict": "PASS", "gates": {"size": "FAIL"}}).size_verdict is Verdict.PASS


@pytest.mark.parametrize(("key", "value", "kind"), [("failures", "boom", "str"), ("quick", 1, "int"),
                                                    ("exit_code", True, "bool"), ("latency", [], "list")])
def test_a_value_of_the_wrong_kind_is_refused_naming_its_key(key: str, value: object, kind: str) -> None:
    with pytest.raises(ValueError, match=f"'{key}' is of type {kind}"):
        TestResult.from_json({"target": "t", key: value})


def test_a_verdict_that_is_none_reads_as_not_run() -> None:
    assert TestResult.from_json({"accuracy": "MAYBE", "size_verdict": 3}).gates()["accuracy"] == "-"


def test_a_newer_gates_section_holds_its_verdict_and_enters_the_document_only_when_filled() -> None:
    gate = Gate("probe", "a test gate", lambda ctx: Judged("-", {}, []), lambda g: True)
    r = TestResult("t", "m", "fp32")
    assert "sections" not in r.as_json()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "GATES", (*registry.GATES, gate))
        mp.setattr(registry, "BY_NAME", {**registry.BY_NAME, "probe": gate})
        mp.setattr(registry, "NAMES", (*registry.NAMES, "probe"))
        assert r.gates()["probe"] == "-"
        r.set_verdict("probe", Verdict.FAIL)
        doc = r.as_json()
        assert doc["sections"] == {"probe": {"verdict": "FAIL"}}  # type: ignore[typeddict-item]
        assert doc["failed_gates"] == ["probe"] and TestResult.from_json(doc) == r
