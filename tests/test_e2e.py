"""End to end on real models a PyPI package ships: PaddleOCR's text classifier and detector.

The nox `tests` session installs rapidocr-onnxruntime==1.4.4 (--no-deps, only for its model files);
nothing is committed and nothing comes from a model hub. The files are sha256-pinned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import here_runtime, run_cli
from tests.realmodels import installed

pytestmark = pytest.mark.e2e

PACKAGE = "rapidocr-onnxruntime"
PINNED = {
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    "ch_PP-OCRv4_det_infer.onnx": "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
}
LINES = ["Invoice 2026-11 total 418.20", "ONNX Runtime on every target", "Golden outputs, budgets",
         "Release 0.1.0 shipped today", "Reproducible artifact bundles", "The quick brown fox jumps",
         "Latency p99 under 20 ms", "Edge, mobile and servers", "Model 7 of 12 compiled"]


def _real_model(name: str) -> Path:
    return installed(PACKAGE, name, PINNED[name])


def _render(text: str, height: int, width: int, seed: int) -> np.ndarray:
    """Dark text on a light, slightly uneven background, normalised the way PaddleOCR does."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), tuple(int(x) for x in rng.integers(200, 255, 3)))
    font = ImageFont.load_default(size=max(12, height // 3))
    ImageDraw.Draw(img).text((4 + seed % 7, height // 4), text, fill=(20, 20, 30), font=font)
    arr = np.asarray(img, np.float32) / 255.0
    return ((arr - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ocr")
    for name, (h, w) in {"cls": (48, 192), "det": (96, 320)}.items():
        batch = [_render(LINES[i], h, w, i) for i in range(len(LINES))]
        np.savez(root / f"{name}.inputs.npz", x=np.concatenate(batch[:2]))
        np.savez(root / f"{name}.calib.npz", x=np.concatenate(batch[2:]))
        np.savez(root / f"{name}.const.npz", x=np.zeros_like(np.concatenate(batch[2:])))  # constant: ruins int8
    cls, det = _real_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"), _real_model("ch_PP-OCRv4_det_infer.onnx")
    (root / "targets.toml").write_text(f"""
[project]
name = "ocr"
version = "1"

[models.cls]
path = "{cls}"
inputs = "cls.inputs.npz"
calibration = "cls.calib.npz"

[models.det]
path = "{det}"
inputs = "det.inputs.npz"
calibration = "det.calib.npz"

[targets.fp32]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
models = ["cls", "det"]
latency = {{ min_seconds = 0.2 }}

[targets.int8]
extends = "fp32"
precision = "int8-static"
quantization = {{ op_types = ["Conv", "MatMul"] }}
# the detector's task metric: its probability map agrees within 0.1 on all but 1% of the pixels; cosine
# measured 0.98+ on an AVX-512 VNNI Xeon and 0.972-0.973 on an AVX2-only AMD EPYC (u8s8 and s8s8 alike)
accuracy.outputs."sigmoid_0.tmp_0" = {{ cosine = 0.97, atol = 0.1, rtol = 0.0, mismatch_fraction = 0.01 }}

[targets.fp16]
extends = "fp32"
precision = "fp16"
optimization = "basic"

[models.det_const]
path = "{det}"
inputs = "det.inputs.npz"
calibration = "det.const.npz"

[targets.int8-const]
extends = "int8"
models = ["det_const"]
""")
    proc = run_cli("build", "-c", str(root / "targets.toml"), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def _manifest(root: Path, target: str, model: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((root / "dist" / target / model / "manifest.json").read_text())
    return doc


def test_inputs_are_realistic_for_the_detector(project: Path) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(_real_model("ch_PP-OCRv4_det_infer.onnx")), providers=["CPUExecutionProvider"])
    prob = sess.run(None, {"x": np.load(project / "det.inputs.npz")["x"]})[0]
    assert prob.shape == (2, 1, 96, 320) and (prob > 0.3).mean() > 0.01  # text found, not an empty map


@pytest.mark.parametrize("model", ["cls", "det"])
def test_every_precision_builds_reloads_and_runs(project: Path, model: str) -> None:
    sizes = {}
    for target in ("fp32", "int8", "fp16"):
        doc = _manifest(project, target, model)
        assert doc["status"] == "complete"
        golden = doc["golden_run"]
        assert isinstance(golden, dict) and golden["outputs"][0]["shape"][0] == 2
        art = doc["artifact"]
        assert isinstance(art, dict)
        sizes[target] = art["size_ratio"]
    assert sizes["int8"] < 0.45 and 0.4 < sizes["fp16"] < 0.6, sizes


def test_opset_11_paddle_graphs_are_upgraded_for_quantization(project: Path) -> None:
    doc = _manifest(project, "int8", "cls")
    assert any("opset 11 to 13" in n for n in doc["notes"])  # type: ignore[attr-defined]
    assert doc["precision"]["options"]["calibration_samples"] == 7  # type: ignore[index]


@pytest.fixture(scope="module")
def tested(project: Path) -> dict[str, dict[str, Any]]:
    # --no-explain: the failing int8-const would start a precision search (test_e2e_vad.py covers the search)
    proc = run_cli("test", "-c", str(project / "targets.toml"), "--json", "-t", "int8", "-t", "int8-const",
                   "--no-explain")
    assert proc.returncode == 9, proc.stderr[-3000:]  # the constant-calibrated artifact must fail
    return {f"{r['target']}/{r['model']}": r for r in json.loads(proc.stdout)["results"]}


def test_int8_detector_fails_elementwise_but_passes_its_task_metric(tested: dict[str, dict[str, Any]]) -> None:
    r = tested["int8/det"]
    assert r["status"] == "PASS", r["failures"]
    out = r["outputs"][0]
    assert [c["metric"] for c in out["checks"]] == ["nonfinite", "elementwise", "cosine"]
    assert out["stats"]["cosine"] >= 0.97 and 0 < out["stats"]["mismatch_fraction"] <= 0.01
    # far beyond fp32's rule (atol 1e-5 + rtol 1e-4): elementwise at fp32 tolerances it would fail
    assert out["stats"]["max_abs"] > 0.1 and out["stats"]["p99_abs"] > 1e-3


def test_int8_calibrated_on_constant_data_fails(tested: dict[str, dict[str, Any]]) -> None:
    r = tested["int8-const/det_const"]
    assert r["status"] == "FAIL" and r["accuracy"] == "FAIL"
    text = "\n".join(r["failures"])
    # the task metric separates the two calibrations: 9% of the pixels off here vs under 1% (cosine does not:
    # 0.975 for this one on an AVX2-only CPU, 0.972 for the realistic calibration)
    assert "output 'sigmoid_0.tmp_0' (test_data_set_0): elementwise" in text
    assert "smallest tolerance that would pass" in text
