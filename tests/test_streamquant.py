"""steps/streamquant.py: ORT's quantizers, run on the graph without its weights, write exactly what they write
with the weights in memory."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from ortbuild.pipeline.steps import precision, streamquant
from ortbuild.project.data import load_samples
from tests import bigmodels

MODELS = Path(__file__).parent.parent / "models"


def _external(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir()
    out = out_dir / "model.onnx"
    onnx.save_model(onnx.load(str(src)), str(out), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)
    return out


def _quantize(pre: Path, out: Path, static: dict[str, Any] | None, per_channel: bool) -> None:
    """ORT's quantize_dynamic, or quantize_static with `static`'s samples, format and calibration method."""
    common: dict[str, Any] = {"per_channel": per_channel, "reduce_range": True, "weight_type": QuantType.QInt8,
                              "use_external_data_format": True}
    if static is None:
        quantize_dynamic(str(pre), str(out), **common)
    else:
        quantize_static(str(pre), str(out), precision._Reader(static["samples"]), quant_format=static["format"],
                        calibrate_method=static["method"], activation_type=QuantType.QUInt8, **common)


def _ort(src: Path, out_dir: Path, static: dict[str, Any] | None, per_channel: bool) -> Path:
    """What precision.py does for a model without external data: quant_pre_process, then the quantizer."""
    out_dir.mkdir()
    pre, out = out_dir / "pre.onnx", out_dir / "q.onnx"
    kw = {"save_as_external_data": True, "external_data_location": "pre.onnx.data"}
    # as precision.py does: ORT's symbolic shape inference, on failure, dumps the model and its weights
    # (sym_shape_infer_temp.onnx, <uuid>.data) into the current directory
    with contextlib.chdir(out_dir):
        try:
            quant_pre_process(str(src.resolve()), str(pre.resolve()), **kw)
        except Exception:
            quant_pre_process(str(src.resolve()), str(pre.resolve()), skip_symbolic_shape=True, **kw)
    _quantize(pre, out, static, per_channel)
    return out


def _streamed(src: Path, out_dir: Path, static: dict[str, Any] | None, per_channel: bool) -> Path:
    """The same quantizer inside streamquant.weightless; every ONNX load in it must leave the weights out."""
    out_dir.mkdir()
    pre, out = streamquant.preprocess(src, out_dir / "pre.onnx", []), out_dir / "q.onnx"
    removed: list[bool] = []
    loads: list[bool] = []
    real_load = onnx.load

    def load(f: Any, *args: Any, **kwargs: Any) -> onnx.ModelProto:
        loads.append(kwargs.get("load_external_data", True))
        return real_load(f, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx, "load", load)
        mp.setattr(onnx, "load_model", load)
        with streamquant.weightless(pre.parent, consume=lambda: removed.append(True)):
            _quantize(pre, out, static, per_channel)
    assert loads and not any(loads)
    assert removed == [True]
    return out


CASES: list[tuple[str, dict[str, Any] | None]] = [
    *((name, None) for name in ("tiny_cnn", "tiny_transformer", "tiny_lstm", "mlp")),
    ("tiny_cnn", {"format": QuantFormat.QDQ, "method": CalibrationMethod.MinMax}),
    ("tiny_cnn", {"format": QuantFormat.QOperator, "method": CalibrationMethod.MinMax}),
    ("tiny_cnn", {"format": QuantFormat.QDQ, "method": CalibrationMethod.Entropy}),
    ("tiny_lstm", {"format": QuantFormat.QDQ, "method": CalibrationMethod.Percentile}),
    ("mlp", {"format": QuantFormat.QDQ, "method": CalibrationMethod.MinMax}),
]


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("name,static", CASES, ids=[
    f"{n}-dynamic" if s is None else f"{n}-{s['format'].name}-{s['method'].name}" for n, s in CASES])
def test_without_the_weights_in_memory_ort_s_quantizers_write_what_they_write_with_them(
        tmp_path: Path, name: str, static: dict[str, Any] | None, per_channel: bool) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    if name == "mlp":
        src = bigmodels.mlp(tmp_path / "src", layers=3, width=256)
        calib = src.parent / "inputs.npz"
    else:
        src = _external(MODELS / f"{name}.onnx", tmp_path / "src")
        calib = MODELS / f"{name}.calib.npz"
    if static is not None:
        inputs = [i.name for i in onnx.load(str(src), load_external_data=False).graph.input]
        static = {**static, "samples": load_samples(calib, inputs)}
    ours = onnx.load(str(_streamed(src, tmp_path / "streamed", static, per_channel)))
    theirs = onnx.load(str(_ort(src, tmp_path / "ort", static, per_channel)))

    assert [n.SerializeToString() for n in ours.graph.node] == [n.SerializeToString() for n in theirs.graph.node]
    assert any(n.op_type in ("MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "QuantizeLinear",
                             "QLinearConv") for n in ours.graph.node)
    ours_t = {t.name: numpy_helper.to_array(t) for t in ours.graph.initializer}
    theirs_t = {t.name: numpy_helper.to_array(t) for t in theirs.graph.initializer}
    assert ours_t.keys() == theirs_t.keys()
    for key, value in theirs_t.items():
        assert ours_t[key].dtype == value.dtype and np.array_equal(ours_t[key], value), key
    assert list(ours.opset_import) == list(theirs.opset_import)
    assert [o.SerializeToString() for o in ours.graph.output] == [o.SerializeToString() for o in theirs.graph.output]


def test_weights_are_read_when_asked_and_the_model_stays_weightless(tmp_path: Path) -> None:
    src = bigmodels.mlp(tmp_path / "src", layers=2, width=128)
    model = onnx.load(str(src), load_external_data=False)
    w0 = next(t for t in model.graph.initializer if t.name == "W0")
    with streamquant.weights_on_demand(src.parent):
        array = onnx.numpy_helper.to_array(w0)
    assert array.shape == (128, 128)
    assert np.array_equal(array, numpy_helper.to_array(next(
        t for t in onnx.load(str(src)).graph.initializer if t.name == "W0")))
    assert not w0.HasField("raw_data") and w0.data_location == onnx.TensorProto.EXTERNAL
    with pytest.raises(onnx.checker.ValidationError):  # outside the block, ONNX's own to_array is back
        onnx.numpy_helper.to_array(w0)


def test_save_writes_weights_as_external_data_copying_the_untouched_ones_from_their_file(tmp_path: Path) -> None:
    src = bigmodels.mlp(tmp_path / "src", layers=2, width=128)
    model = onnx.load(str(src), load_external_data=False)
    model.graph.initializer.append(numpy_helper.from_array(np.arange(512, dtype=np.float32), "held"))
    last = max(model.graph.initializer, key=lambda t: ExternalDataInfo(t).offset or -1)
    kept = [e for e in last.external_data if e.key != "length"]  # no length: its data runs to the file's end
    del last.external_data[:]
    last.external_data.extend(kept)
    (tmp_path / "out").mkdir()
    out = streamquant.save(model, tmp_path / "out" / "m.onnx", src.parent)
    graph = onnx.load(str(out), load_external_data=False).graph
    assert {e.value for t in graph.initializer for e in t.external_data if e.key == "location"} == {"m.onnx.data"}
    loaded = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(src)).graph.initializer}
    assert np.array_equal(loaded["held"], np.arange(512, dtype=np.float32))
    for key, value in original.items():
        assert np.array_equal(loaded[key], value), key
