"""`ortbuild profile`: ORT's profiler through the generated loader, the trace beside the artifact, the top
operators, CPU fallback, and the report's links."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import installed, runtime
from ortbuild.gating.measure import profile
from tests.conftest import run_cli


def _event(cat: str, name: str, ts: int, dur: int, **args: str) -> dict[str, object]:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X", "args": args}


def test_summary_leaves_out_the_warm_up_and_lists_cpu_fallback() -> None:
    events = [_event("Session", "model_run", 0, 1000), _event("Node", "conv_kernel_time", 10, 900, op_name="Conv",
                                                              provider="FooExecutionProvider")]
    for start in (2000, 3000):  # two counted runs: the conv on the planned provider, a Gather on the CPU
        events += [_event("Session", "model_run", start, 100),
                   _event("Node", "conv_kernel_time", start + 1, 60, op_name="Conv", provider="FooExecutionProvider"),
                   _event("Node", "conv_fence_before", start + 1, 1, op_name="Conv"),
                   _event("Node", "gather_kernel_time", start + 70, 20, op_name="Gather",
                          provider="CPUExecutionProvider")]
    s = profile.summarize(events, ["FooExecutionProvider", "CPUExecutionProvider"])
    assert (s["runs"], s["warmup_runs"], s["run_ms"]) == (2, 1, 0.1)
    assert [(r["node"], r["calls"], r["total_us"], r["share"]) for r in s["operators"]] == [
        ("conv", 2, 120, 0.6), ("gather", 2, 40, 0.2)]
    assert s["cpu_fallback"] == [{"node": "gather", "op_type": "Gather", "share": 0.2}]
    assert s["providers"]["FooExecutionProvider"] == {"nodes": 1, "total_us": 120}
    assert profile.summarize(events, ["CPUExecutionProvider"])["cpu_fallback"] == []  # CPU was the plan
    with pytest.raises(ValueError, match="no model_run"):
        profile.summarize([], ["CPUExecutionProvider"])


@pytest.mark.runtime
def test_profile_writes_the_trace_and_top_operators_through_the_loader(make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.cpu]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        optimization = "basic"
    """, models=("tiny_cnn", "tiny_lstm"))
    proc = run_cli("profile", "-c", str(path), "--runs", "7", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(r["target"], r["model"], r["status"]) for r in out["results"]] == [
        ("cpu", "tiny_cnn", "PROFILED"), ("cpu", "tiny_lstm", "PROFILED")]
    folder = path.parent / "dist" / "cpu" / "tiny_cnn"
    trace = json.loads((folder / profile.TRACE).read_text())
    assert sum(e.get("name") == "model_run" for e in trace) == 8  # the warm-up and 7 profiled runs
    summary = json.loads((folder / profile.SUMMARY).read_text())
    assert summary["runs"] == 7 and summary["warmup_runs"] == 1
    types = {r["op_type"] for r in summary["operators"]}
    assert {"Conv", "MaxPool", "Gemm"} <= types  # basic level: the CNN's own operators, by node
    assert all(r["provider"] == "CPUExecutionProvider" and r["calls"] == 7 for r in summary["operators"])
    assert 0 < sum(r["share"] for r in summary["operators"]) <= 1.0
    assert summary["cpu_fallback"] == [] and summary["build_key"]
    lstm = json.loads((path.parent / "dist" / "cpu" / "tiny_lstm" / profile.SUMMARY).read_text())
    assert "LSTM" in {r["op_type"] for r in lstm["operators"]}
    # the report links the trace and shows the top operators of each artifact
    html = (path.parent / "dist" / "report.html").read_text()
    assert "href='cpu/tiny_cnn/profile.trace.json'" in html and "<td>Conv</td>" in html
    report = json.loads((path.parent / "dist" / "report.json").read_text())
    assert {p["model"] for p in report["profiles"]} == {"tiny_cnn", "tiny_lstm"}
    # the table on stdout
    shown = run_cli("profile", "-c", str(path), "-m", "tiny_cnn", "--top", "3")
    assert shown.returncode == 0, shown.stderr
    assert "op type" in shown.stdout and "share" in shown.stdout and "profile.trace.json" in shown.stdout
    assert len([ln for ln in shown.stdout.splitlines() if re.match(r"\s+\w+\s+\S+\s+CPU\s+20\s", ln)]) == 3
    # a rebuild removes the profile of the old artifact (it described another graph)
    assert run_cli("build", "-c", str(path), "-m", "tiny_cnn", "--force").returncode == 0
    assert not (folder / profile.SUMMARY).exists() and not (folder / profile.TRACE).exists()


@pytest.mark.runtime
def test_profile_of_a_target_that_cannot_run_here_is_skipped(absent_provider_project: Path) -> None:
    proc = run_cli("profile", "-c", str(absent_provider_project), "--json")
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "SKIPPED" and "CoreMLExecutionProvider" in result["reason"]
    folder = absent_provider_project.parent / "dist" / "mac" / "tiny_cnn"
    assert json.loads((folder / profile.SUMMARY).read_text())["status"] == "SKIPPED"
    assert not (folder / profile.TRACE).exists()
    assert run_cli("profile", "-c", str(absent_provider_project), "--runs", "0").returncode == 2


@pytest.mark.runtime
def test_profile_shows_cpu_fallback_of_openvino(make_project: Callable[..., Path]) -> None:
    """onnxruntime-openvino's EP takes no ONNX-ML tree ensemble: ORT runs it on the CPU provider, silently."""
    if runtime.provider_here("OpenVINOExecutionProvider") is not None or \
            installed.installed_flavor().distribution != "onnxruntime-openvino":  # type: ignore[union-attr]
        pytest.skip("needs the onnxruntime-openvino flavor (nox -s tests-openvino)")
    path = make_project("""
        [targets.ov]
        runtime = "RUNTIME"
        providers = [{ name = "OpenVINOExecutionProvider", options = { device_type = "CPU" } }, "CPUExecutionProvider"]
        optimization = "basic"
    """, models=("breast_cancer_gb",))
    proc = run_cli("profile", "-c", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(proc.stdout)["results"]
    assert [x["op_type"] for x in result["cpu_fallback"]] == ["TreeEnsembleClassifier"]
    assert result["planned_providers"][0] == "OpenVINOExecutionProvider"
