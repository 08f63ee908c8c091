"""What this environment can run. Those marked `runtime` run again in every runtime flavor's venv."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import installed, machine, runtime
from ortbuild.artifact import keys
from ortbuild.pipeline.build import Builder
from ortbuild.project import config, options, plan
from ortbuild.project.config import Provider
from ortbuild.status import JobStatus

BUILT = JobStatus.BUILT

@pytest.mark.runtime
def test_one_flavor_is_installed_and_its_cpu_provider_works() -> None:
    flavor = installed.installed_flavor()
    assert flavor is not None and flavor.distribution in options.RUNTIMES
    assert runtime.probe_provider(Provider("CPUExecutionProvider")) is None


@pytest.mark.runtime
def test_a_provider_this_flavor_lacks_is_reported() -> None:
    reason = runtime.probe_provider(Provider("QNNExecutionProvider"))
    assert reason is not None and "QNNExecutionProvider is not in onnxruntime" in reason


def test_simd_level_names_the_vector_width() -> None:
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("x86_64 only")
    assert machine.simd_level(frozenset({"avx2", "avx512f"})) == "x86_64-avx512"
    assert machine.simd_level(frozenset({"avx2", "fma"})) == "x86_64-avx2"
    assert machine.simd_level(frozenset()) == "x86_64-sse"
    fp = machine.fingerprint()
    assert fp["simd_level"] == machine.simd_level() and set(fp["isa_flags"]) <= machine.cpu_flags()


@pytest.mark.runtime
def test_primary_provider_of_this_flavor_builds_and_runs(make_project: Callable[..., Path],
                                                         tmp_path: Path) -> None:
    """The flavor's own accelerator provider where it runs here (OpenVINO), else the CPU."""
    flavor = installed.installed_flavor()
    assert flavor is not None
    primary = options.RUNTIMES[flavor.distribution][0]
    if runtime.probe_provider(Provider(primary)) is not None:
        primary = "CPUExecutionProvider"
    providers = json.dumps(list(dict.fromkeys([primary, "CPUExecutionProvider"])))
    path = make_project(f"""
        [targets.here]
        runtime = "RUNTIME"
        providers = {providers}
    """, models=("tiny_cnn", "breast_cancer_gb"))
    project = config.load(path)
    results = Builder(project, tmp_path / "dist", secrets=keys.read_secrets(),
                      progress=lambda j, m: None).run(plan.jobs(project))
    assert [r.status for r in results] == [BUILT, BUILT], [r.reason for r in results]
    doc = json.loads((tmp_path / "dist" / "here" / "tiny_cnn" / "manifest.json").read_text())
    assert doc["golden_run"]["providers"][0] == primary  # really ran on it, no silent CPU fallback
    assert doc["versions"]["onnxruntime"] == flavor.as_json()
    if primary in options.COMPILING_PROVIDERS:
        assert doc["optimization"]["applied"] == "basic" and doc["optimization"]["portable"]
