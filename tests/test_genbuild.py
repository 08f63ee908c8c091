"""genbuild.fold (ortbuild/pipeline/steps/genbuild.py): the builder's external data folded into the one graph file
onnxruntime-genai opens from memory, streamed one initializer at a time: byte for byte what onnx.save_model writes
for the model loaded with its data, and the data file gone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortbuild.pipeline.steps import genbuild


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), "w0"),
               numpy_helper.from_array(rng.integers(0, 255, size=(3000,), dtype=np.uint8), "q"),
               numpy_helper.from_array(rng.normal(size=(64,)).astype(np.float16), "b16"),
               numpy_helper.from_array(np.arange(5, dtype=np.int64), "small")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    node = helper.make_node("MatMul", ["x", "w0"], ["y"], name="/lm_head/MatMul")
    graph = helper.make_graph([node], "g", [x], [y], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="builder")
    model.metadata_props.append(onnx.StringStringEntryProto(key="k", value="v"))  # a field after the graph
    return model


def test_fold_streams_the_data_into_the_bytes_onnx_save_model_writes(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    graph = tmp_path / "model.onnx"
    onnx.save_model(_model(), str(graph), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    assert (tmp_path / "model.onnx.data").is_file()
    expected = tmp_path / "expected.onnx"
    onnx.save_model(onnx.load(str(graph), load_external_data=True), str(expected), save_as_external_data=False)
    streamed: list[bool] = []
    stream = genbuild._fold_streaming
    monkeypatch.setattr(genbuild, "_fold_streaming", lambda *a: streamed.append(stream(*a)) or streamed[-1])
    notes = genbuild.fold(graph, "t", "m")
    assert streamed == [True]  # streamed, not onnx.load's whole model in memory
    assert graph.read_bytes() == expected.read_bytes()
    assert not (tmp_path / "model.onnx.data").exists() and "weights folded into the graph" in notes[0]
    folded = onnx.load(str(graph))
    assert np.array_equal(numpy_helper.to_array(folded.graph.initializer[1]),
                          numpy_helper.to_array(_model().graph.initializer[1]))


def test_a_graph_without_external_data_is_left_as_it_is(tmp_path: Path) -> None:
    graph = tmp_path / "model.onnx"
    onnx.save_model(_model(), str(graph))
    before = graph.read_bytes()
    assert genbuild.fold(graph, "t", "m") == () and graph.read_bytes() == before
