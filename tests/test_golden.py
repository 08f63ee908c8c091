"""Golden data (ortbuild.artifact.golden): data that would test nothing is refused before a gate can PASS on it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortbuild.artifact import golden
from ortbuild.errors import ConfigError
from ortbuild.project import config
from tests.conftest import MODELS, REPO, run_cli

TARGET = """
[targets.cpu]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
"""


def _project(make_project: Callable[..., Path], image: np.ndarray) -> Path:
    """The tiny_cnn project, its golden inputs replaced by `image`."""
    path = make_project(TARGET)
    inputs = path.parent / "inputs.npz"
    np.savez(inputs, image=image)
    path.write_text(path.read_text().replace(str(MODELS / "tiny_cnn.inputs.npz"), str(inputs)))
    return path


def _image(nan_at: tuple[int, ...] | None = None, fill: float = 0.5) -> np.ndarray:
    x = np.full((1, 3, 32, 32), fill, np.float32)
    if nan_at is not None:
        x[nan_at] = np.nan
    return x


@pytest.mark.parametrize("image, says", [
    (_image(fill=np.nan), "data set test_data_set_0: the float inputs hold no finite value (NaN/Inf in 'image' "
                          "(3072 of 3072)): the accuracy gate would test nothing"),
    (_image(fill=np.inf), "the float inputs hold no finite value (NaN/Inf in 'image' (3072 of 3072))"),
    (_image((0, 0, 0, 0)), "data set test_data_set_0: NaN/Inf in input(s) 'image' (1 of 3072) make the reference "
                           "output(s) 'logits' NaN everywhere"),
])
def test_golden_inputs_whose_reference_is_all_nan_are_refused_naming_the_inputs_file(
        make_project: Callable[..., Path], image: np.ndarray, says: str) -> None:
    path = _project(make_project, image)
    project = config.load(path)
    model = project.models["tiny_cnn"]
    io = {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 32, 32]}],
          "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}]}
    with pytest.raises(ConfigError) as err:
        golden.golden_for(model, io, ())
    assert err.value.message.startswith(f"{path.parent / 'inputs.npz'}: [models.tiny_cnn.inputs] "), err.value.message
    assert says in err.value.message and err.value.hint and "finite values" in err.value.hint
    # through the command: a config error (exit 3) naming the file, never PASS
    proc = run_cli("test", "-c", str(path), "--no-explain")
    assert proc.returncode == ConfigError.exit_code, proc.stdout + proc.stderr
    assert says in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    report = path.parent / "dist" / "cpu" / "tiny_cnn" / "test-report.json"
    assert not report.exists() or json.loads(report.read_text())["result"]["status"] != "PASS"


def test_nan_beside_finite_values_whose_outputs_stay_partly_finite_is_kept(make_project: Callable[..., Path]) -> None:
    """The control: the reference of finite inputs has finite outputs; a NaN-holding data set is judged by what it
    does to the outputs (tests/test_data.py runs an IsNaN/IsInf model on NaN and Inf end to end)."""
    path = _project(make_project, _image())
    model = config.load(path).models["tiny_cnn"]
    feed = {"image": _image((0, 0, 0, 0))}
    partly = np.array([[np.nan, 1.0, 2.0]], np.float32)
    golden.vacuous(model, golden.Golden([golden.DataSet("test_data_set_0", feed, {"logits": partly})], "test",
                                        "user"))
    golden.vacuous(model, golden.Golden([golden.DataSet("test_data_set_0", {"image": _image()},
                                                        {"logits": np.full((1, 3), np.nan, np.float32)})],
                                        "test", "user"))  # finite inputs: a NaN reference is the model's own
    with pytest.raises(ConfigError, match="make the reference output\\(s\\) 'logits' NaN everywhere"):
        golden.vacuous(model, golden.Golden([golden.DataSet("test_data_set_0", feed,
                                                            {"logits": np.full((1, 3), np.nan, np.float32)})],
                                            "user-supplied", "user"))


# ------------------------------------------------------------------------------------------ near constant

DETECTOR = "ch_PP-OCRv4_det_infer.onnx"  # PaddleOCR's text detector (tests/test_e2e.py pins it)


def _golden(**outputs: Any) -> golden.Golden:
    return golden.Golden([golden.DataSet("test_data_set_0", {}, dict(outputs))], "test", "computed")


def test_an_output_within_fp32s_tolerance_of_a_constant_is_near_constant() -> None:
    rng = np.random.default_rng(0)
    found = golden.near_constant(_golden(
        zero=np.zeros((1, 4, 4), np.float32),                         # exactly constant
        tiny=(rng.random((1, 64)) * 1e-6).astype(np.float32),          # std ~3e-7 <= 1e-5
        big=(1000 + rng.random(64) * 1e-3).astype(np.float32),         # std ~3e-4 <= 1e-5 + 1e-4 * 1000
        signal=rng.normal(size=(1, 64)).astype(np.float32),
        small_signal=(rng.normal(size=64) * 1e-4).astype(np.float32),  # std 1e-4 > 1e-5: the gate sees it
        one=np.array([0.0], np.float32),                               # one element: not judged
        labels=np.zeros(8, np.int64)))                                 # exact outputs: not judged
    assert sorted(found) == ["big", "tiny", "zero"], found
    assert found["zero"] == "every one of its 16 values is 0"
    assert "std" in found["tiny"] and "<= the tolerance 1e-05 + 0.0001 * |mean|" in found["tiny"]


def test_every_data_set_counts_together() -> None:
    """A constant per data set that differs between them is signal (batch 1 of a class, batch 2 of another)."""
    sets = [golden.DataSet(f"test_data_set_{i}", {}, {"y": np.full((4,), float(i), np.float32)}) for i in range(2)]
    assert golden.near_constant(golden.Golden(sets, "test", "computed")) == {}
    assert list(golden.near_constant(golden.Golden(sets[:1], "test", "computed"))) == ["y"]


def test_random_noise_makes_the_detectors_golden_map_near_constant() -> None:
    from tests.realmodels import installed
    from tests.test_e2e import PACKAGE, PINNED

    det = installed(PACKAGE, DETECTOR, PINNED[DETECTOR])
    noise = {"x": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}
    values, _ = golden.compute(det, [noise])
    found = golden.near_constant(golden.Golden([golden.DataSet("test_data_set_0", noise, values[0])], "t", "computed"))
    assert list(found) == ["sigmoid_0.tmp_0"] and found["sigmoid_0.tmp_0"].startswith("50176 values in [0, ")


@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_transformer", "tiny_lstm", "breast_cancer_gb"])
def test_the_example_models_golden_outputs_are_not(name: str) -> None:
    model = config.load(REPO / "targets.toml").models[name]
    from ortbuild.pipeline.steps import check

    g = golden.golden_for(model, check.run(model.path).signature, ())
    assert golden.near_constant(g) == {}


def test_the_progress_line_counts_constant_outputs_and_names_expected_outputs_of_other_inputs() -> None:
    constant = "golden output 'y' is (near) constant (4 values in [0, 0])"
    stale = "[models.m] expected (m.expected.npz) was recorded by ortbuild init from other golden inputs"
    assert golden.warned([constant]) == "1 golden output(s) (near) constant"
    assert golden.warned([stale, constant]) == \
        "1 golden output(s) (near) constant; expected outputs recorded from other inputs"


def test_the_values_digest_is_of_the_values_not_the_files_bytes(tmp_path: Path) -> None:
    from ortbuild.project import expected

    a = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.savez(tmp_path / "a.npz", **a)
    assert expected.values_digest([("s", dict(np.load(tmp_path / "a.npz")))]) == expected.values_digest([("s", a)])
    for other in ({"x": a["x"].astype(np.float64)}, {"x": a["x"].reshape(3, 2)}, {"y": a["x"]}):
        assert expected.values_digest([("s", other)]) != expected.values_digest([("s", a)])
