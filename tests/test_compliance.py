"""Outputs under load (ortbuild.gating.measure.compliance, MLPerf TEST01): which timed requests are checked, that their
outputs are kept outside the timed region, that a difference within the accuracy rule passes and one beyond
it fails with the request and the difference, and end to end: a model whose output depends on how often its
session ran (a seeded RandomUniformLike: ONNX Runtime's kernel keeps its generator between runs) passes the
accuracy gate but FAILs the latency gate's compliance part (exit 9), while the example models pass it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from ortbuild.gating.measure import compliance, percentiles
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.records import Rule
from ortbuild.status import Verdict
from tests.conftest import model_table, run_cli
from tests.test_latency import FakeClock

FP32: Rule = {"rtol": 1e-4, "atol": 1e-5}
Y = np.arange(6, dtype=np.float32).reshape(2, 3)
EXPECTED: dict[str, object] = {"y": Y, "label": np.array([3], dtype=np.int64)}


def _outputs(shift: float = 0.0, label: int = 3) -> dict[str, object]:
    return {"y": Y + np.float32(shift), "label": np.array([label], dtype=np.int64)}


def _checker(every: int = 4, seed: int = compliance.SEED, max_kept: int = compliance.MAX_KEPT) -> compliance.Checker:
    return compliance.Checker({"d0": EXPECTED}, lambda name: FP32, every, seed, max_kept)


def test_every_kth_request_from_a_seeded_offset_is_checked() -> None:
    assert compliance.every_for(20) == 4 and compliance.every_for(250) == 10 and compliance.every_for(3) == 1
    a, b = _checker(), _checker()
    assert a.offset == b.offset and 0 <= a.offset < 4  # the same requests every run
    for _ in range(40):
        a.record(a.number(), _outputs())
    assert [k.request for k in a.kept] == [i for i in range(40) if i % 4 == a.offset] and a.requests == 40
    verdict, doc, lines = a.verdict("cpu/m")
    assert verdict == Verdict.PASS and lines == []
    assert doc == {"checked": 10, "requests": 40, "every": 4, "seed": compliance.SEED, "mismatches": [],
                   "mismatched": 0, "verdict": "PASS"}
    assert _checker().verdict()[0] == Verdict.SKIPPED  # nothing timed, nothing checked


def test_a_difference_within_the_rule_passes_one_beyond_fails_with_the_request_and_the_difference() -> None:
    chk = _checker(every=1)
    chk.record(chk.number(), _outputs(shift=1e-6))  # a non-deterministic but valid EP: within rtol/atol
    chk.record(chk.number(), _outputs(shift=0.5))
    chk.record(chk.number(), _outputs(label=4))
    verdict, doc, lines = chk.verdict("cpu/m")
    assert verdict == Verdict.FAIL and doc["checked"] == 3 and doc["mismatched"] == 2
    assert [(m["request"], m["output"]) for m in doc["mismatches"]] == [(1, "y"), (2, "label")]
    assert "elementwise 6 of 6 elements" in doc["mismatches"][0]["difference"][0]
    assert "expected 3, actual 4" in doc["mismatches"][1]["difference"][0]
    assert lines[0].startswith("compliance: cpu/m 2 output(s) of 3 checked request(s) differ") and "(requests 1, 2)" \
        in lines[0]
    assert lines[1].startswith("  request 1: output 'y' (d0): elementwise") and any("|diff| 0.5" in x for x in lines)
    merged = compliance.Checker.merge([doc, _checker().verdict()[1]])
    assert merged["verdict"] == "FAIL" and merged["mismatched"] == 2 and merged["checked"] == 3


def test_outputs_are_kept_outside_the_timed_region_and_compared_after() -> None:
    # each run takes 1 ms; recording an output "takes" a whole second of the fake clock: were it timed, the
    # samples would show it. After 30 runs the session drifts: the checked requests from then on mismatch.
    clock = FakeClock()
    runs = {"n": 0}

    def call() -> Mapping[str, object]:
        clock.t += 1e-3
        runs["n"] += 1
        return _outputs(shift=1.0 if runs["n"] > 30 else 0.0)
    chk = _checker(every=5)
    seen = chk.observer()

    def slow_seen(out: object) -> None:
        clock.t += 1.0
        seen(out)
    a = latency.sample({"a": call}, "a", percentiles.budgets_of({0.9: 2.0}), latency.Plan(min_seconds=0), clock=clock,
                       read=lambda: 1.0, seen={"a": slow_seen})
    assert max(a.series["a"].samples) < 1.01 and a.verdicts["p90"].verdict == latency.PASS
    verdict, doc, _ = chk.verdict("j")
    n = len(a.series["a"].samples)
    assert doc["requests"] == n and doc["checked"] == len([i for i in range(n) if i % 5 == chk.offset])
    assert verdict == Verdict.FAIL and {m["request"] for m in doc["mismatches"]} == {
        i for i in range(30, n) if i % 5 == chk.offset} - set(range(30 + 5 * compliance.MAX_REPORTED, n))


def test_memory_is_bounded_and_wrapped_calls_from_threads_are_numbered_once() -> None:
    chk = _checker(every=1, max_kept=5)
    call = chk.wrap(lambda: _outputs(), "d0")
    threads = [threading.Thread(target=lambda: [call() for _ in range(50)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert chk.requests == chk.chosen == 400 and len(chk.kept) == 5
    assert len({k.request for k in chk.kept}) == 5 and max(k.request for k in chk.kept) >= 5  # not just the first 5
    assert chk.verdict()[0] == Verdict.PASS


# ------------------------------------------------------------------------------------------- end to end

def drifting_model(folder: Path) -> None:
    """y = x + RandomUniformLike(x) from a fixed seed: a fresh session's first run is always the same (the golden
    data and the accuracy run agree), every later run draws new numbers."""
    graph = h.make_graph([h.make_node("RandomUniformLike", ["x"], ["noise"], seed=7.0, name="noise"),
                          h.make_node("Add", ["x", "noise"], ["y"], name="add")], "drift",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "drift.onnx"))
    np.savez(folder / "drift.inputs.npz", x=np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.runtime
def test_a_model_whose_output_changes_between_runs_fails_compliance_and_the_examples_pass(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    drifting_model(tmp_path)
    path = make_project("""
        [targets.cpu]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { p90_ms = 1000 }
        """, models=("tiny_cnn", "tiny_transformer", "tiny_lstm", "breast_cancer_gb"))
    path.write_text(path.read_text().replace("[targets.cpu]", '[models.drift]\npath = "drift.onnx"\n'
                                             'inputs = "drift.inputs.npz"\n\n[targets.cpu]'))
    assert model_table("tiny_cnn") in path.read_text()
    proc = run_cli("test", "-c", str(path), "--json")
    assert proc.returncode == 9, proc.stderr[-3000:]
    results = {r["model"]: r for r in json.loads(proc.stdout)["results"]}
    drift = results.pop("drift")
    assert drift["accuracy"] == "PASS" and drift["latency_verdict"] == "FAIL" and drift["status"] == "FAIL"
    doc = drift["latency"]["compliance"]
    assert doc["verdict"] == "FAIL" and doc["mismatched"] == doc["checked"] >= compliance.AT_LEAST
    first = doc["mismatches"][0]
    assert first["output"] == "y" and first["data_set"] == "test_data_set_0"
    assert len({m["request"] % doc["every"] for m in doc["mismatches"]}) == 1  # every k-th request, one offset
    assert drift["latency"]["data_sets"][0]["compliance"]["verdict"] == "FAIL"
    assert drift["latency"]["verdicts"][0]["verdict"] == "PASS"  # the timing itself met its budget
    failures = "\n".join(drift["failures"])
    assert f"compliance: cpu/drift {doc['mismatched']} output(s)" in failures
    assert f"request {first['request']}: output 'y' (test_data_set_0): elementwise" in failures
    report = json.loads((tmp_path / "dist" / "cpu" / "drift" / "test-report.json").read_text())
    assert report["result"]["latency"]["compliance"] == doc
    for model, r in results.items():  # the example models: every checked output as in the accuracy run
        c = r["latency"]["compliance"]
        assert r["status"] == "PASS" and c["verdict"] == "PASS" and c["checked"] >= compliance.AT_LEAST, (model, c)
        assert c["mismatches"] == [] and c["requests"] == sum(d["samples"] for d in r["latency"]["data_sets"])
    page = (tmp_path / "dist" / "report.html").read_text()  # the report says it where the latency section is
    assert "timed requests checked" in page and f"request {first['request']} (test_data_set_0, output y)" in page
