"""End to end on Silero's voice-activity detector, as the `silero-vad` wheel ships it: one If on the sample
rate whose two branches hold every weight (Conv and LSTM, in Constant nodes, LSTM weights behind Slice/Concat).

The nox `tests` session installs silero-vad==6.2.3 with --no-deps, only for its model file (sha256-pinned).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from ortbuild.artifact import manifest_types
from tests.conftest import here_runtime, run_cli
from tests.realmodels import installed

pytestmark = pytest.mark.e2e

PACKAGE = "silero-vad"
MODEL = "silero_vad/data/silero_vad.onnx"
SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"


def _model() -> Path:
    return installed(PACKAGE, MODEL, SHA256)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vad")
    rng = np.random.default_rng(0)
    t = np.arange(512 * 8) / 16000
    voiced = sum(np.sin(2 * np.pi * f * t) / (k + 1) for k, f in enumerate([140, 280, 420, 560, 700]))
    audio = 0.3 * voiced * np.clip(np.sin(2 * np.pi * 4 * t), 0, None) + 0.005 * rng.standard_normal(t.size)
    np.savez(root / "vad.inputs.npz", input=audio.astype(np.float32).reshape(8, 512),
             state=np.zeros((2, 8, 128), np.float32), sr=np.array(16000, np.int64))
    (root / "targets.toml").write_text(f"""
[project]
name = "vad"
version = "1"

[models.vad]
path = "{_model()}"
inputs = "vad.inputs.npz"

[targets.fp32]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "fp32"

[targets.int8]
extends = "fp32"
precision = "int8-dynamic"

[targets.int8-conv]
extends = "fp32"
precision = "int8-dynamic"
quantization = {{ op_types = ["Conv"] }}

[targets.int8-matmul]
extends = "fp32"
precision = "int8-dynamic"
quantization = {{ op_types = ["MatMul"] }}
""")
    return root


def _manifest(root: Path, target: str) -> manifest_types.Manifest:
    return manifest_types.Manifest.from_json((root / "dist" / target / "vad" / manifest_types.MANIFEST).read_bytes())


def test_fp32_stays_the_size_of_its_source(project: Path) -> None:
    r = run_cli("test", "-c", str(project / "targets.toml"), "-t", "fp32", "--no-explain")
    assert r.returncode == 0, r.stdout + r.stderr
    m = _manifest(project, "fp32")
    assert m.artifact.size_ratio <= 1.05, m.artifact.size_ratio  # folding inside the If branches is undone
    assert m.optimization.inflation is not None and "disabled" in m.optimization.inflation["action"]


def test_int8_dynamic_quantizes_the_conv_and_lstm_weights_inside_the_branches(project: Path) -> None:
    r = run_cli("build", "-c", str(project / "targets.toml"), "-t", "int8")
    assert r.returncode == 0, r.stderr
    changed = _manifest(project, "int8").precision.changed
    assert changed is not None
    assert changed["ops"]["DynamicQuantizeLSTM"] == 4 and changed["ops"]["ConvInteger"] == 12, changed
    assert changed["subgraph_ops"] >= 16 and changed["converted"] > 0.9
    assert _manifest(project, "int8").artifact.size_ratio < 0.5


def test_int8_that_quantizes_nothing_fails_at_build_time_with_the_reason(project: Path) -> None:
    r = run_cli("build", "-c", str(project / "targets.toml"), "-t", "int8-matmul")
    assert r.returncode == 6, r.stderr
    assert "converted 0.0% of the float weights" in r.stderr
    assert "read by: Conv" in r.stderr and "LSTM" in r.stderr
    assert "leaves them out" in r.stderr


def test_the_share_converted_is_not_skewed_by_folded_weights(project: Path) -> None:
    """Pre-processing folds the LSTM weights (Slice/Concat of Constants) and so grows the float bytes; quantizing
    the Convs alone still counts as converting their share of the weights."""
    r = run_cli("build", "-c", str(project / "targets.toml"), "-t", "int8-conv")
    assert r.returncode == 0, r.stderr
    changed = _manifest(project, "int8-conv").precision.changed
    assert changed is not None and changed["ops"]["ConvInteger"] == 12 and "DynamicQuantizeLSTM" not in changed["ops"]
    assert 0.2 < changed["converted"] < 0.6, changed


def test_the_search_keeps_nodes_inside_the_branches_in_float_and_the_override_passes(project: Path,
                                                                                      tmp_path: Path) -> None:
    """int8-dynamic fails the default rule (cosine 0.99) on the state output; every node it changed sits inside
    the If branches. The search (default bounds) finds nodes there to keep in float, the branch the golden inputs
    do not run (8 kHz) left out, and the pasted override passes with most weights still int8."""
    for name in ("targets.toml", "vad.inputs.npz"):
        shutil.copy(project / name, tmp_path / name)
    cfg = tmp_path / "targets.toml"
    r = run_cli("test", "-c", str(cfg), "-t", "int8")
    assert r.returncode == 9, r.stdout[-3000:] + r.stderr[-3000:]
    assert "explain int8/vad: found" in r.stdout, r.stdout[-3000:]
    doc = json.loads((tmp_path / "dist" / "int8" / "vad" / "test-report.json").read_text())["result"]["explain"]
    assert doc["rebuilds"] <= 16 and doc["result"]["accuracy"] == "PASS", doc
    kept = doc["nodes"]
    assert kept and all(n.startswith("If_0_then_branch__") for n in kept), kept  # 16 kHz: the then branch runs
    block = re.search(r"paste into targets.toml:\n\n(\[\[targets\.int8\.overrides\]\]\n.*?\n)\n", r.stdout, re.S)
    assert block is not None, r.stdout[-3000:]
    cfg.write_text(cfg.read_text() + "\n" + block.group(1))
    r = run_cli("test", "-c", str(cfg), "-t", "int8", "--no-explain")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = manifest_types.Manifest.from_json((tmp_path / "dist" / "int8" / "vad" / manifest_types.MANIFEST).read_bytes())
    changed = m.precision.changed
    assert changed is not None and changed["converted"] > 0.5, changed  # most weights stay int8


def test_precision_search_auto_ships_an_int8_that_passes_the_default_rule(project: Path, tmp_path: Path) -> None:
    """The same search in the build: `precision_search = "auto"` on int8-dynamic, nothing written by hand."""
    text = (project / "targets.toml").read_text().replace(
        '[targets.int8]\nextends = "fp32"\nprecision = "int8-dynamic"\n',
        '[targets.int8]\nextends = "fp32"\nprecision = "int8-dynamic"\nprecision_search = "auto"\n')
    config = tmp_path / "targets.toml"
    config.write_text(text.replace('inputs = "vad.inputs.npz"', f'inputs = "{project / "vad.inputs.npz"}"'))
    r = run_cli("build", "-c", str(config), "-t", "int8")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "precision_search: kept" in r.stdout and "accuracy PASS" in r.stdout, r.stdout
    r = run_cli("test", "-c", str(config), "-t", "int8", "--no-explain", "--locked")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = manifest_types.Manifest.from_json((tmp_path / "dist" / "int8" / "vad" / manifest_types.MANIFEST).read_bytes())
    assert m.locked is not None and m.precision.changed is not None and m.precision.changed["converted"] > 0.5
