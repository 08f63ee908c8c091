"""A model is its graph file plus its external-data files: found, hashed, and refused when unsafe."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
import pytest

from ortbuild import modelfiles
from ortbuild.errors import ConfigError
from tests.bigmodels import mlp
from tests.conftest import MODELS


def test_a_model_with_external_data_is_its_graph_and_its_data_file(tmp_path: Path) -> None:
    path = mlp(tmp_path / "m", layers=2, width=64)
    files = modelfiles.of(path)
    data = tmp_path / "m" / "model.onnx.data"
    assert [f.location for f in files.files] == ["", "model.onnx.data"]
    assert files.external[0].sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    assert files.size == path.stat().st_size + data.stat().st_size
    assert files.weights_size == data.stat().st_size
    assert files.digests() == {"source": hashlib.sha256(path.read_bytes()).hexdigest(),
                               "source:model.onnx.data": files.external[0].sha256}


def test_a_model_without_external_data_is_one_file() -> None:
    files = modelfiles.of(MODELS / "tiny_cnn.onnx")
    assert files.external == () and files.weights_size == files.size == (MODELS / "tiny_cnn.onnx").stat().st_size
    assert list(files.digests()) == ["source"]


def test_the_marker_is_found_across_a_chunk_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = mlp(tmp_path / "m", layers=1, width=32)
    text = path.read_bytes()
    at = text.index(b"location")
    monkeypatch.setattr(modelfiles, "_CHUNK", at + 3)  # "loc" ends one chunk, "ation" starts the next
    assert modelfiles.of(path).has_external_data
    assert modelfiles._hash(path, b"location") == (hashlib.sha256(text).hexdigest(), len(text), True)


def _retarget(path: Path, location: str) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save_model(model, str(path))


@pytest.mark.parametrize("location,message", [
    ("../outside.data", "must be a relative path inside the model's folder"),
    ("/etc/passwd", "must be a relative path inside the model's folder"),
    ("gone.data", "the model's external data file 'gone.data' is missing"),
])
def test_unsafe_or_missing_external_data_is_a_config_error(tmp_path: Path, location: str, message: str) -> None:
    path = mlp(tmp_path / "m", layers=1, width=32)
    _retarget(path, location)
    with pytest.raises(ConfigError) as e:
        modelfiles.of(path, where="models.m.path")
    assert message in e.value.message and str(path) in e.value.message and "[models.m.path]" in e.value.message


def test_a_data_file_shorter_than_its_tensors_is_a_config_error_naming_the_tensor(tmp_path: Path) -> None:
    path = mlp(tmp_path / "m", layers=2, width=32)
    data = path.parent / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-1])
    with pytest.raises(ConfigError) as e:
        modelfiles.of(path, where="models.m.path")
    assert "tensor 'b1' needs bytes" in e.value.message and "'model.onnx.data', which holds" in e.value.message
    assert str(path) in e.value.message and "copy or export the .onnx file and its .data files" in e.value.hint


def test_needs_external_data_at_protobufs_limit() -> None:
    assert not modelfiles.needs_external_data(1 << 30)
    assert modelfiles.needs_external_data(int(2.5 * (1 << 30)))
