"""Shared fixtures: the repository, the example models, and small throwaway projects."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import runtime

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"


# Fixed test keys (never used outside the tests): every build and loader in the suite, subprocesses included.
TEST_KEY = bytes(range(32))
TEST_SIGNING_SEED = bytes(range(32, 64))
for _name in ("ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY_FILE"):
    os.environ.pop(_name, None)
os.environ["ORTBUILD_KEY"] = base64.b64encode(TEST_KEY).decode()
os.environ["ORTBUILD_SIGNING_KEY"] = base64.b64encode(TEST_SIGNING_SEED).decode()
# The emulated platforms' golden gate (qemu-user) is slow to set up: off unless a test turns it on
# (tests/test_emulation.py); the example's linux-aarch64 target is then SKIPPED with that reason.
os.environ["ORTBUILD_EMULATION"] = "off"


def here_runtime() -> str:
    """The pip requirement of the ORT flavor installed in this venv (so test targets are buildable here)."""
    flavor = runtime.installed_flavor()
    assert flavor is not None, "the test venv must hold one ONNX Runtime flavor"
    return f"{flavor.distribution}=={flavor.version}"


def model_table(name: str, calibration: bool = False) -> str:
    lines = [f"[models.{name}]", f'path = "{MODELS / name}.onnx"', f'inputs = "{MODELS / name}.inputs.npz"']
    if calibration:
        lines.append(f'calibration = "{MODELS / name}.calib.npz"')
    return "\n".join(lines) + "\n"


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """Write a targets.toml into tmp_path: example models by name, then target tables as TOML text."""

    def make(targets: str, models: tuple[str, ...] = ("tiny_cnn",), calibration: bool = False) -> Path:
        text = '[project]\nname = "t"\nversion = "1"\n\n'
        text += "\n".join(model_table(m, calibration) for m in models)
        text += "\n" + textwrap.dedent(targets).replace("RUNTIME", here_runtime())
        path = tmp_path / "targets.toml"
        path.write_text(text)
        return path

    return make


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ortbuild", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def absent_provider_project(make_project: Callable[..., Path]) -> Path:
    """A target whose provider the runtime does not ship here: CoreML in the Linux onnxruntime wheel."""
    flavor = runtime.installed_flavor()
    if flavor is None or flavor.distribution != "onnxruntime":
        pytest.skip("needs the onnxruntime flavor (its CoreML provider is absent on Linux)")
    return make_project("""
        [targets.mac]
        runtime = "RUNTIME"
        providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
    """)
