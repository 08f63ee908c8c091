"""`ortbuild test --gates NAMES` (ortbuild.gating.reports.selection): only the named gates are judged, the others
are not measured and show as not run everywhere the result is said; `ortbuild release` refuses a test that left a gate
out, naming the artifact and the command that tests it fully."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.gating.gates import registry
from ortbuild.gating.record import TestResult, doc_kind
from ortbuild.gating.reports import cells, selection
from tests.conftest import run_cli


def test_names_parse_into_the_gates_in_their_order() -> None:
    assert registry.NAMES == selection.GATES
    assert selection.parse("accuracy") == ("accuracy",)
    assert selection.parse(" latency , Accuracy,latency") == ("accuracy", "latency")
    assert selection.parse("startup") == ("cold_start", "memory")
    assert selection.parse("cold-start,size") == ("size", "cold_start")
    assert selection.parse("all") == selection.GATES
    assert selection.parse("load,eval") == ("eval", "throughput", "server", "multi_stream")
    with pytest.raises(ValueError, match=r"'accurcy' is not a gate \(did you mean 'accuracy'\?\); the gates are: "
                                         r"accuracy, size, latency, cold_start, memory, eval, throughput, server, "
                                         r"multi_stream, tokens, generation, startup, load, all"):
        selection.parse("accurcy")
    with pytest.raises(ValueError, match="a gate name is empty"):
        selection.parse("accuracy,")


def test_an_unknown_gate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from ortbuild.cli import main

    with pytest.raises(SystemExit) as e:
        main(["test", "--gates", "speed"])
    assert e.value.code == 2
    assert "argument --gates: 'speed' is not a gate" in capsys.readouterr().err


def test_what_a_result_says_of_the_gates_it_left_out() -> None:
    row = {"status": "PASS", "judged": ["accuracy"], "gates": {g: "-" for g in selection.GATES}}
    rest = ["size", "latency", "cold_start", "memory", "eval", "throughput", "server", "multi_stream"]
    assert selection.left_out(row["judged"], "onnx") == rest
    assert selection.not_judged(row["judged"], "onnx") == f"not judged (--gates accuracy): {', '.join(rest)}"
    assert cells.verdict_cell(TestResult.from_json(row)) == "PASS (--gates accuracy)"
    failed = {**row, "status": "FAIL", "judged": ["accuracy", "size"], "accuracy": "FAIL"}
    assert cells.verdict_cell(TestResult.from_json(failed)) == "FAIL (accuracy; --gates accuracy,size)"
    # a generative model's record: its own gates (and size) only
    llm = {"status": "PASS", "judged": ["accuracy"], "generative": True}
    assert selection.left_out(llm["judged"], doc_kind(llm)) == ["size", "tokens", "generation"]
    assert TestResult.from_json(llm).kind == "generative" and TestResult.from_json(llm).as_json()["generative"]
    assert "generative" not in TestResult.from_json(row).as_json() and TestResult.from_json(row).kind == "onnx"
    for full in ({"status": "PASS", "judged": list(selection.GATES)}, {"status": "PASS"}):  # {}: an older report
        judged = full.get("judged")
        assert selection.left_out(judged, "onnx") == [] and selection.not_judged(judged, "onnx") == ""
        assert cells.verdict_cell(TestResult.from_json(full)) == "PASS"


@pytest.mark.runtime
def test_accuracy_only_while_iterating_and_release_needs_every_gate(make_project: Callable[..., Path]) -> None:
    """`tight`'s latency budget cannot be met: with --gates accuracy it is not measured (nor is anything but
    accuracy) and the run passes, --strict included; release refuses both targets until a full test."""
    path = make_project("""
        [targets.ok]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        session = { intra_op_num_threads = 1 }
        latency = { p90_ms = 1000, min_seconds = 0.2 }
        size = { max_mb = 8 }

        [targets.tight]
        extends = "ok"
        latency = { p90_ms = 0.0001 }
    """)
    root = path.parent
    c = ("-c", str(path))
    proc = run_cli("test", *c, "--gates", "accuracy", "--strict", "--json", cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for r in json.loads(proc.stdout)["results"]:
        assert r["status"] == "PASS" and r["judged"] == ["accuracy"], r
        assert r["gates"] == {**dict.fromkeys(selection.GATES, "-"), "accuracy": "PASS"}
        assert r["latency"] == {} and r["size"] == {} and r["startup"] == {} and r["outputs"]
        saved = json.loads((root / "dist" / r["target"] / "tiny_cnn" / "test-report.json").read_text())
        assert saved["result"]["judged"] == ["accuracy"]
    rows = json.loads((root / "dist" / "report.json").read_text())["results"]
    assert [r["judged"] for r in rows] == [["accuracy"], ["accuracy"]]
    page = (root / "dist" / "report.html").read_text()
    assert "PASS (--gates accuracy)" in page and "not judged (--gates accuracy): size, latency" in page

    proc = run_cli("test", *c, "-t", "tight", "--gates", "accuracy", cwd=root)  # the text summary
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tight "))
    assert row.split()[-3:] == ["PASS", "(--gates", "accuracy)"] and " - " in row
    assert ("not judged (--gates accuracy): size, latency, cold_start, memory, eval, throughput, server, "
            "multi_stream; `ortbuild release` needs every gate: test again without --gates") in proc.stderr

    proc = run_cli("release", *c, "--json", "--allow-development-key", cwd=root)
    assert proc.returncode == 9, proc.stdout[-2000:] + proc.stderr[-2000:]
    refused = json.loads(proc.stdout)["refused"]
    for t in ("ok", "tight"):
        assert any(f"{t}/tiny_cnn: tested with --gates accuracy, its size, latency, cold_start, memory, eval, "
                   f"throughput, server, multi_stream gate(s) not judged: run `ortbuild test -t {t}`" in x
                   for x in refused), refused

    proc = run_cli("test", *c, "-t", "tight", "--gates", "latency", "--json", cwd=root)  # what it left out
    (r,) = json.loads(proc.stdout)["results"]
    assert proc.returncode == 9 and r["gates"]["latency"] == "FAIL" and r["accuracy"] == "-", r["gates"]
    proc = run_cli("test", *c, "-t", "ok", "--json", cwd=root)  # every gate: released
    assert proc.returncode == 0 and json.loads(proc.stdout)["results"][0]["judged"] == list(selection.GATES)
    proc = run_cli("release", *c, "-t", "ok", "--json", "--allow-development-key", cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
