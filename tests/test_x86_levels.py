"""x86-64 levels as platforms (ortbuild.machine.X86_LEVELS, ortbuild.emulation): a target at a level is gated natively
on a CPU of that level, under qemu-user's model of it on a newer one (timing SKIPPED), and SKIPPED on an older one or
where qemu cannot run the level's instructions (AVX-512).

The golden gate under emulation needs Debian's qemu-user-static (CI installs it: ORTBUILD_REQUIRE_EMULATION=1 makes
its absence a failure)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ortbuild import emulation, machine
from ortbuild.errors import ConfigError
from ortbuild.project import config
from tests.conftest import REPO

V2 = machine.x86_level_named("x86-64-v2").flags
V3 = machine.x86_level_named("x86-64-v3").flags
V4 = machine.x86_level_named("x86-64-v4").flags
VNNI = machine.x86_level_named("x86-64-v4-vnni").flags


def test_a_cpu_is_at_the_newest_level_whose_flags_it_has() -> None:
    # flags of real CPUs' /proc/cpuinfo, cut to what the levels look at (plus noise they ignore)
    epyc_rome = V3 | {"sse", "sse2", "sha_ni", "clzero"}            # AMD EPYC 7002: AVX2, no AVX-512
    assert machine.x86_level(epyc_rome, "x86_64") == machine.x86_level_named("x86-64-v3")
    assert machine.x86_level(V3 - {"movbe"}, "x86_64") == machine.x86_level_named("x86-64-v2")  # all flags or none
    assert machine.x86_level(V4 | {"avx_vnni"}, "x86_64") == machine.x86_level_named("x86-64-v4")  # AVX-VNNI: not 512
    assert machine.x86_level(VNNI | {"amx_int8"}, "x86_64") == machine.x86_level_named("x86-64-v4-vnni")
    assert machine.x86_level(frozenset({"sse2"}), "x86_64") is None         # older than v2
    assert machine.x86_level(VNNI, "aarch64") is None                      # not x86-64
    assert machine.fingerprint()["x86_level"] == (lv.name if (lv := machine.x86_level()) else None)


@pytest.mark.parametrize(("host", "target", "emulated", "why"), [
    (V3, "x86-64-v3", False, ""),                                   # natively: every gate
    (VNNI, "x86-64-v3", True, ""),                                  # under qemu's Haswell model
    (VNNI, "x86-64-v2", True, ""),
    (V3, "x86-64-v4", True, "older than x86-64-v4"),                # an older CPU: SKIPPED, saying so
    (V2, "x86-64-v3", True, "older than x86-64-v3"),
    (VNNI, "x86-64-v4", True, "qemu-user cannot emulate x86-64-v4"),  # TCG has no AVX-512
    (VNNI, "x86-64-v4-vnni", False, ""),
])
def test_where_a_level_target_runs(monkeypatch: pytest.MonkeyPatch, host: frozenset[str], target: str,
                                   emulated: bool, why: str) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: host)
    monkeypatch.setattr(emulation, "host", lambda: "linux-x86_64")
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # qemu-user installed
    monkeypatch.delenv(emulation.SWITCH_VAR, raising=False)
    assert emulation.emulated(target) is emulated
    got = emulation.unavailable(target, ["onnxruntime==1.31.1"]) if emulated else ""
    assert (why in got) if why else got == "", got
    assert emulation.ready(target, [])  # nothing to set up: this environment's own Python, under qemu


def test_a_level_target_on_another_machine_or_without_qemu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cpu_flags", lambda: VNNI)
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(emulation, "host", lambda: "linux-x86_64")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(emulation.SWITCH_VAR, raising=False)
    assert "apt-get install qemu-user-static" in emulation.unavailable("x86-64-v3", [])
    monkeypatch.setenv(emulation.SWITCH_VAR, "off")
    assert "ORTBUILD_EMULATION=off" in emulation.unavailable("x86-64-v3", [])
    monkeypatch.setattr(emulation, "host", lambda: "linux-aarch64")
    monkeypatch.setattr(machine.platform, "machine", lambda: "aarch64")
    assert emulation.emulated("x86-64-v3")
    assert "this is a linux-aarch64 machine" in emulation.unavailable("x86-64-v3", [])


def test_a_level_target_is_portable(make_project: Callable[..., Path]) -> None:
    base = """
        [targets.avx2]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        platform = "x86-64-v3"
    """
    with pytest.raises(ConfigError) as err:  # `all` lays NCHWc blocks out for the build CPU's SIMD width
        config.load(make_project(base))
    assert err.value.where == "targets.avx2.optimization" and "NCHWc" in err.value.message
    with pytest.raises(ConfigError) as err:
        config.load(make_project(base.replace("x86-64-v3", "x86-64-v5") + 'optimization = "extended"\n'))
    assert err.value.where == "targets.avx2.platform" and "x86-64-v4" in err.value.message
    t = config.load(make_project(base + 'optimization = "extended"\n')).targets["avx2"]
    assert (t.platform, t.platform_rule.x86_level) == ("x86-64-v3", "x86-64-v3")


LSTM_V3 = """
    [targets.avx2]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    platform = "x86-64-v3"
    optimization = "extended"
    precision = "int8-dynamic"
    quantization = { per_channel = true, reduce_range = REDUCE, op_types = ["MatMul", "Gemm", "LSTM", "Gather"] }
    latency = { p90_ms = 50 }
"""


def _test(toml: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != emulation.SWITCH_VAR}  # the suite turns emulation off
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "test", "-c", str(toml)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)
    rows = {r["model"]: r for r in json.loads((toml.parent / "dist" / "report.json").read_text())["results"]}
    return proc, rows


@pytest.mark.slow
def test_int8_that_saturates_on_avx2_fails_at_x86_64_v3_on_any_newer_cpu(make_project: Callable[..., Path]) -> None:
    """The LSTM with full 8-bit weights: cosine 0.9999 on AVX-512 VNNI's kernels, 0.900 on AVX2's u8s8 ones
    (vpmaddubsw saturates). A target at x86-64-v3 catches it on this machine, whatever its level (v3: natively;
    newer: under qemu's Haswell model), and passes with x86's 7-bit weights (reduce_range)."""
    here = machine.x86_level()
    levels = [lv.name for lv in machine.X86_LEVELS]
    if here is None or levels.index(here.name) < levels.index("x86-64-v3"):
        pytest.skip(f"needs an x86-64-v3 CPU or newer (this one: {here.name if here else 'not x86-64-v3'})")
    native = here.name == "x86-64-v3"
    if not native and shutil.which(emulation.X86_QEMU) is None:
        if os.environ.get("ORTBUILD_REQUIRE_EMULATION"):
            pytest.fail(f"{emulation.X86_QEMU} missing (CI installs Debian's qemu-user-static)")
        pytest.skip(f"{emulation.X86_QEMU} not installed (Debian: apt-get install qemu-user-static)")
    toml = make_project(LSTM_V3.replace("REDUCE", "false"), models=("tiny_lstm",))
    proc, rows = _test(toml)
    r = rows["tiny_lstm"]
    assert proc.returncode == 9 and r["failed_gates"] == ["accuracy"], proc.stdout + proc.stderr
    cosine = r["outputs"][0]["stats"]["cosine"]  # about 0.900: saturated, not a rounding difference
    assert cosine < 0.95 and "forecast: cosine 0.9" in r["worst"], r["worst"]
    if not native:  # judged on qemu's model of an AVX2 CPU; its timing is not this machine's
        assert r["platform"]["x86_level"] == "x86-64-v3" and "Haswell" in r["platform"]["emulator"]
        assert r["platform"]["host_x86_level"] == here.name and r["latency_verdict"] == "SKIPPED"
    toml.write_text(toml.read_text().replace("reduce_range = false", "reduce_range = true"))
    proc, rows = _test(toml)
    assert proc.returncode == 0 and rows["tiny_lstm"]["status"] == "PASS", proc.stdout + proc.stderr
