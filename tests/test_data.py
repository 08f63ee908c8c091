from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from ortbuild import data
from ortbuild.errors import ConfigError
from ortbuild.steps import check

from .conftest import MODELS


def _write_dataset(root: Path, feeds: list[dict[str, np.ndarray]], named: bool = True) -> None:
    for i, feed in enumerate(feeds):
        d = root / f"test_data_set_{i}"
        d.mkdir(parents=True)
        for k, (name, arr) in enumerate(feed.items()):
            (d / f"input_{k}.pb").write_bytes(numpy_helper.from_array(arr, name if named else "").SerializeToString())


def test_npz_feed_matches_the_model_signature() -> None:
    sig = check.run(MODELS / "tiny_transformer.onnx").signature
    feed = data.load_feed(MODELS / "tiny_transformer.inputs.npz", ["input_ids", "attention_mask"])
    data.check_feed(feed, sig, "inputs.npz")
    assert feed["input_ids"].dtype == np.int64 and feed["input_ids"].shape == (4, 32)


def test_onnx_layout_directory_named_and_unnamed(tmp_path: Path) -> None:
    feed = {"image": np.ones((1, 3, 32, 32), np.float32)}
    _write_dataset(tmp_path / "named", [feed, feed])
    _write_dataset(tmp_path / "unnamed", [feed], named=False)
    assert data.load_feed(tmp_path / "named", ["image"])["image"].shape == (1, 3, 32, 32)
    assert list(data.load_feed(tmp_path / "unnamed", ["image"])) == ["image"]
    assert len(data.load_samples(tmp_path / "named", ["image"])) == 2


def test_npz_calibration_rows_become_batches_of_one() -> None:
    samples = data.load_samples(MODELS / "tiny_cnn.calib.npz", ["image"])
    assert len(samples) == 32 and samples[0]["image"].shape == (1, 3, 32, 32)


def test_mismatched_feeds_name_the_file_and_the_problem() -> None:
    sig = check.run(MODELS / "tiny_cnn.onnx").signature
    with pytest.raises(ConfigError, match=r"missing \['image'\], unexpected \['x'\]"):
        data.check_feed({"x": np.zeros((1, 3, 32, 32), np.float32)}, sig, "f.npz")
    with pytest.raises(ConfigError, match="is float64, the model wants float32"):
        data.check_feed({"image": np.zeros((1, 3, 32, 32))}, sig, "f.npz")
    with pytest.raises(ConfigError, match="wants rank 4"):
        data.check_feed({"image": np.zeros((3, 32, 32), np.float32)}, sig, "f.npz")


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_text("not a zip")
    with pytest.raises(ConfigError, match=r"is not an \.npz file \(not a zip archive\)"):
        data.load_feed(bad, ["image"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without test_data_set_N"):
        data.load_feed(tmp_path / "empty", ["image"])
    uneven = tmp_path / "uneven.npz"
    np.savez(uneven, a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    with pytest.raises(ConfigError, match="different sample counts"):
        data.load_samples(uneven, ["a", "b"])


def test_signature_keeps_symbolic_dims() -> None:
    sig = check.signature(onnx.load(str(MODELS / "tiny_lstm.onnx")))
    assert sig["inputs"] == [{"name": "series", "dtype": "float32", "shape": ["batch", "steps", 8]}]
