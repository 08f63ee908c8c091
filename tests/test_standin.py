"""Targets whose hardware is absent: the CPU stand-in of the same ONNX Runtime version (machine.stand_in), which
nox installs in place of the GPU/accelerator wheel, and what the build and the tests make of it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import machine
from ortbuild.artifact import keys
from ortbuild.pipeline.build import Builder
from ortbuild.project import config, plan
from ortbuild.status import JobStatus
from tests.conftest import REPO, here_runtime

NO_GPU = "no NVIDIA GPU here (test)"
NO_INTEL = "no Intel device here (test)"


@pytest.fixture
def absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither an NVIDIA GPU nor an Intel device, whatever this machine has."""
    monkeypatch.setitem(machine._NEEDS, "onnxruntime-gpu", lambda: NO_GPU)
    monkeypatch.setitem(machine._NEEDS, "onnxruntime-openvino", lambda: NO_INTEL)
    monkeypatch.setitem(machine._NEEDS, "onnxruntime-ep-openvino", lambda: NO_INTEL)
    monkeypatch.setitem(machine._NEEDS, "onnxruntime-genai-cuda", lambda: NO_GPU)


def test_stand_in_replaces_the_flavor_at_its_version_and_drops_absent_plugins(absent: None) -> None:
    s = machine.stand_in(["onnxruntime-gpu==1.31.1"])
    assert s is not None and s.requirements == ("onnxruntime==1.31.1",) and s.left_out == ("onnxruntime-gpu==1.31.1",)
    assert s.reason == NO_GPU
    s = machine.stand_in(["onnxruntime==1.31.1", "onnxruntime-ep-openvino==1.8.1", "onnxruntime-extensions==0.15.2"])
    assert s is not None and s.requirements == ("onnxruntime==1.31.1", "onnxruntime-extensions==0.15.2")
    assert s.left_out == ("onnxruntime-ep-openvino==1.8.1",) and s.reason == NO_INTEL
    s = machine.stand_in(["onnxruntime-openvino>=1.24,<1.25"])
    assert s is not None and s.requirements == ("onnxruntime>=1.24,<1.25",)
    assert machine.stand_in(["onnxruntime==1.31.1", "onnxruntime-extensions==0.15.2"]) is None  # nothing absent


def test_a_cuda_generative_target_gets_genai_cuda_and_the_cpu_genai_as_its_stand_in(absent: None) -> None:
    """onnxruntime-genai's CPU package cannot start CUDA: a CUDA target's venv gets onnxruntime-genai-cuda (with
    onnxruntime-gpu); where no GPU is, the CPU packages of the same versions build its portable artifact."""
    project = config.load(REPO / "targets.toml", check_files=False)
    reqs = project.targets["llm-cuda-int4"].requirements
    assert reqs[:2] == ("onnxruntime-gpu==1.31.1", "onnxruntime-genai-cuda==0.18.0")
    assert "onnxruntime-genai==0.18.0" in project.targets["llm-cpu-int4"].requirements
    s = machine.stand_in(reqs)
    assert s is not None and s.requirements[:2] == ("onnxruntime==1.31.1", "onnxruntime-genai==0.18.0")
    assert s.left_out == ("onnxruntime-gpu==1.31.1", "onnxruntime-genai-cuda==0.18.0") and s.reason == NO_GPU
    assert s.requirements[2:] == reqs[2:]  # the builder's packages, as they are


def test_hardware_present_means_no_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(machine._NEEDS, "onnxruntime-gpu", lambda: None)
    assert machine.stand_in(["onnxruntime-gpu==1.31.1"]) is None


def test_detectors_answer_on_this_machine() -> None:
    """They read /proc, /dev and /sys: each answers None (may run) or a reason naming what is missing."""
    for check, word in ((machine.nvidia_absent, "NVIDIA"), (machine.intel_absent, "Intel")):
        why = check()
        assert why is None or word in why


def _gpu_project(make_project: Callable[..., Path]) -> Path:
    version = here_runtime().split("==")[1]
    return make_project(f"""
        [targets.gpu]
        runtime = "onnxruntime-gpu=={version}"
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    """)


@pytest.mark.runtime
def test_a_stand_in_environment_builds_the_portable_artifact_with_the_reason(
        make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, absent: None) -> None:
    if not here_runtime().startswith("onnxruntime=="):
        pytest.skip("the stand-in is the CPU flavor: this venv holds another")
    path = _gpu_project(make_project)
    project = config.load(path)
    build = Builder(project, tmp_path / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None)
    # without ORTBUILD_STAND_IN (another environment's runtime): skipped, naming the nox session, as before
    monkeypatch.delenv("ORTBUILD_STAND_IN", raising=False)
    assert build.run(plan.jobs(project))[0].status == JobStatus.SKIPPED
    monkeypatch.setenv("ORTBUILD_STAND_IN", "1")
    res = build.run(plan.jobs(project))[0]
    assert res.status == JobStatus.PORTABLE, res.reason
    assert NO_GPU in res.reason and "stand-in onnxruntime==" in res.reason and res.reason.count(NO_GPU) == 1
    doc = json.loads((tmp_path / "dist" / "gpu" / "tiny_cnn" / "manifest.json").read_text())
    assert doc["status"] == "portable" and doc["versions"]["onnxruntime"]["distribution"] == "onnxruntime"
    assert NO_GPU in doc["missing_providers"]["CUDAExecutionProvider"]


@pytest.mark.runtime
def test_the_stand_in_target_test_is_skipped_and_fails_when_required(
        make_project: Callable[..., Path], tmp_path: Path) -> None:
    """The same through the CLI, in a fresh process (the detector is the real one: forced absent by env)."""
    if not here_runtime().startswith("onnxruntime=="):
        pytest.skip("the stand-in is the CPU flavor: this venv holds another")
    if machine.nvidia_absent() is None:
        pytest.skip("this machine has an NVIDIA GPU: the stand-in does not apply")
    path = _gpu_project(make_project)
    env = {**__import__("os").environ, "ORTBUILD_STAND_IN": "1"}
    run = [sys.executable, "-m", "ortbuild", "test", "-c", str(path), "--json"]
    proc = subprocess.run(run, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)["results"][0]
    assert r["status"] == "SKIPPED" and "no NVIDIA GPU here" in r["reason"] and "stand-in" in r["reason"]
    proc = subprocess.run([*run, "--require"], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 5, proc.stderr  # MissingProvider: required, and cannot run here
