"""A linux-aarch64 target's golden gate, run for real: its generated Python loader on the aarch64 onnxruntime wheel
in an arm64 Debian userland under qemu-user (ortbuild.emulation), set up on first use and cached.

Needs Debian's qemu-user-static and debootstrap (CI installs them: ORTBUILD_REQUIRE_EMULATION=1 makes their
absence a failure); the rest of the suite runs with ORTBUILD_EMULATION=off (tests/conftest.py)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortbuild import emulation, errors
from ortbuild.artifact import loaders
from ortbuild.gating.measure import emulated
from ortbuild.project import config
from tests.conftest import REPO, TEST_KEY

pytestmark = pytest.mark.e2e

TARGET = """
    [targets.arm]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    platform = "linux-aarch64"
    precision = "int8-dynamic"
    optimization = "extended"
    latency = { p90_ms = 50, cold_start_ms = 5000 }
    ACCURACY
"""


@pytest.fixture(scope="module", autouse=True)
def _qemu() -> None:
    missing = [t for t in ("qemu-aarch64-static", "debootstrap") if shutil.which(t) is None]
    if missing:
        if os.environ.get("ORTBUILD_REQUIRE_EMULATION"):
            pytest.fail(f"{' and '.join(missing)} missing (CI installs Debian's qemu-user-static and debootstrap)")
        pytest.skip(f"{' and '.join(missing)} not installed")


def _test(toml: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                             dict[str, Any]]:
    run_env = {k: v for k, v in os.environ.items() if k != emulation.SWITCH_VAR} | (env or {})
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "test", "-c", str(toml), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env=run_env)
    rows = {r["model"]: r for r in json.loads((toml.parent / "dist" / "report.json").read_text())["results"]}
    return proc, rows


def test_golden_gate_runs_on_the_aarch64_wheel_and_timing_is_skipped(make_project: Callable[..., Path]) -> None:
    toml = make_project(TARGET.replace("ACCURACY", ""), models=("tiny_transformer", "tiny_lstm"))
    proc, rows = _test(toml)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for model in ("tiny_transformer", "tiny_lstm"):
        r = rows[model]
        assert (r["status"], r["accuracy"], r["size_verdict"]) == ("PASS", "PASS", "PASS")
        # the outputs judged came from aarch64 ONNX Runtime, in the emulated userland
        assert r["platform"]["machine"] == "aarch64" and r["platform"]["onnxruntime"] == "1.31.1"
        assert r["platform"]["emulator"] == "qemu-aarch64-static -cpu neoverse-n1"
        assert (r["latency_verdict"], r["cold_start_verdict"]) == ("SKIPPED", "SKIPPED")
        assert "emulation says nothing about the device's speed" in r["reason"]
        assert "ubuntu-24.04-arm" in r["reason"]
    assert "latency, cold_start SKIPPED: emulated linux-aarch64" in proc.stdout + proc.stderr
    # budgets never measured: `require` fails them, and release refuses them (a runner of the platform measures them)
    proc, rows = _test(toml, "--require", "-m", "tiny_lstm")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "required, but its latency, cold_start gate(s) cannot run here" in rows["tiny_lstm"]["failures"][0]
    _test(toml)
    rel = subprocess.run([sys.executable, "-m", "ortbuild", "release", "-c", str(toml), "-t", "arm", "--to",
                          str(toml.parent / "rel"), "--allow-development-key"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert rel.returncode != 0 and "gate(s) were SKIPPED" in rel.stdout + rel.stderr, rel.stdout + rel.stderr
    assert "ortbuild matrix" in rel.stdout + rel.stderr and not (toml.parent / "rel" / "arm").exists()

    # the gate can fail there: a rule no int8 model meets is a FAIL (accuracy), judged on the emulated outputs
    toml.write_text(toml.read_text().replace("    ACCURACY\n", "").replace(
        'optimization = "extended"', 'optimization = "extended"\naccuracy = { cosine = 0.9999999 }'))
    proc, rows = _test(toml, "-m", "tiny_lstm")
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert rows["tiny_lstm"]["failed_gates"] == ["accuracy"] and rows["tiny_lstm"]["platform"]["machine"] == "aarch64"


def test_the_emulated_loader_refuses_tampering_and_a_wrong_key(make_project: Callable[..., Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`ortbuild test` refuses both before any gate (the build checks the key and the files); the loader under
    emulation refuses them on its own, with the same errors as natively."""
    toml = make_project(TARGET.replace("ACCURACY", ""), models=("tiny_lstm",))
    proc, _ = _test(toml)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    monkeypatch.delenv(emulation.SWITCH_VAR)
    target = config.load(toml).targets["arm"]
    folder = toml.parent / "dist" / "arm" / "tiny_lstm"
    loader = loaders.python_path(folder, "tiny_lstm")
    with np.load(REPO / "models" / "tiny_lstm.inputs.npz") as z:
        feeds = [{k: z[k] for k in z.files}]

    def run(key: bytes | None) -> list[dict[str, Any]]:
        outputs, info = emulation.run("linux-aarch64", emulated.requirements(target), loader, folder, key, feeds,
                                      "arm/tiny_lstm")
        assert info["machine"] == "aarch64"
        return outputs

    arm = run(TEST_KEY)[0]["forecast"]
    x86 = loaders.import_python_loader(loader).load(key=TEST_KEY, folder=folder).run(feeds[0])["forecast"]
    assert arm.shape == x86.shape and arm.dtype == x86.dtype
    cosine = float(np.dot(arm.ravel(), x86.ravel()) / (np.linalg.norm(arm) * np.linalg.norm(x86)))
    assert cosine > 0.999, cosine  # the same int8 artifact on two platforms' kernels: close, not necessarily equal
    with pytest.raises(errors.WrongKey, match=r"\(wrong_key\)"):
        run(bytes(32))
    with pytest.raises(errors.KeyMissing, match=r"\(key_missing\)"):
        run(None)
    enc = folder / "model.onnx.enc"
    data = bytearray(enc.read_bytes())
    data[len(data) // 2] ^= 1
    enc.write_bytes(bytes(data))
    with pytest.raises(errors.Tampered, match=r"\(tampered\)"):
        run(TEST_KEY)
    proc, rows = _test(toml)  # and `ortbuild test` refuses it too (never repaired)
    assert proc.returncode == 7 and rows["tiny_lstm"]["status"] == "FAIL", proc.stdout + proc.stderr


def test_emulation_turned_off_skips_and_require_fails(make_project: Callable[..., Path]) -> None:
    toml = make_project(TARGET.replace("ACCURACY", ""), models=("tiny_lstm",))
    proc, rows = _test(toml, env={emulation.SWITCH_VAR: "off"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows["tiny_lstm"]["status"] == "SKIPPED" and "ORTBUILD_EMULATION=off" in rows["tiny_lstm"]["reason"]
    proc, rows = _test(toml, "--require", env={emulation.SWITCH_VAR: "off"})
    assert proc.returncode == 5 and "required, but cannot run here" in proc.stdout + proc.stderr


def test_a_first_set_up_is_announced_with_its_size_on_a_plain_pipe(make_project: Callable[..., Path],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh cache (the userland linked from the shared one, so only the wheels are fetched): the set-up is said
    on the terminal with what it downloads, and the install never leaves the plain pipe 10 s without a line."""
    from tests.test_progress import MAX_GAP_S, timed_lines

    toml = make_project(TARGET.replace("ACCURACY", ""), models=("tiny_lstm",))
    target = config.load(toml).targets["arm"]
    monkeypatch.delenv(emulation.SWITCH_VAR)
    emulation.ensure("linux-aarch64", emulated.requirements(target))  # the shared userland (once)
    cache = tmp_path / "cache"
    cache.mkdir()
    for userland in emulation.cache_root().glob("linux-aarch64-*-rootfs-v*"):
        if (userland / ".ready").is_file():
            (cache / userland.name).symlink_to(userland)
    env = {k: v for k, v in os.environ.items() if k != emulation.SWITCH_VAR} | {emulation.CACHE_VAR: str(cache)}
    code, lines, end = timed_lines([sys.executable, "-m", "ortbuild", "test", "-c", str(toml)], 900, env=env)
    text = "\n".join(f"{t:6.1f} {x}" for t, x in lines)
    assert code == 0, text
    said = [x for _, x in lines]
    assert f"[arm/tiny_lstm] setting up the emulated linux-aarch64 environment (first time only; each step says " \
           f"what it downloads; cached in {cache})" in said, text
    assert any(x.startswith("[arm/tiny_lstm] installing onnxruntime==") and x.endswith(f"({emulation.WHEELS_SIZE})")
               for x in said), text
    assert not any("userland: debootstrap" in x for x in said), text  # the linked userland was reused
    stamps = [0.0, *(t for t, _ in lines), end]
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= MAX_GAP_S, text
