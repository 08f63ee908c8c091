"""int8-dynamic for models with external data: ONNX Runtime's own quantizer, fed one weight at a time.

`quant_pre_process` and `quantize_dynamic` load the whole model and copy it 2-3 times (symbolic shape
inference, a deep copy saved and reloaded for shape inference, the result serialized whole): 3.5-4x the weights
in memory. Here ORT's `ONNXQuantizer` runs unchanged on the graph loaded *without* its weights:

- every weight the quantizer asks for (all of them go through `onnx.numpy_helper.to_array`) is read from its
  external-data file when asked and dropped when the quantizer is done with it;
- shape inference runs on the weightless graph (it needs shapes and types, never values);
- pre-processing does what `quant_pre_process` does (symbolic shape inference, ORT's basic-level
  optimization, ONNX shape inference), with ORT reading the weights from the source's folder and writing the
  result's weights as external data;
- the result is written tensor by tensor: quantized weights from memory (a quarter of the float ones), the
  weights left in float copied from their file in chunks.

What the quantizer decides and computes is ORT's: `tests/test_streamquant.py` checks that the output equals
`quantize_dynamic`'s (the same nodes, the same tensors) on every model it quantizes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from ..modelfiles import _tensors

_CHUNK = 1 << 20
_EXTERNAL_MIN = 1024  # tensors of this many bytes or more are written as external data (ONNX's default)
FOLDER = "session.model_external_initializers_file_folder_path"


def _external(t: onnx.TensorProto) -> bool:
    """Whether `t` points at external data not loaded (a weightless tensor)."""
    return uses_external_data(t) and not t.HasField("raw_data")


def _span(t: onnx.TensorProto, base: Path) -> tuple[Path, int, int]:
    """Where the weightless tensor `t` keeps its bytes: file, offset, length (no length: to the file's end),
    as ONNX's own `ExternalDataInfo` parses them (negative offsets and lengths refused)."""
    info = ExternalDataInfo(t)
    path = base / info.location
    offset = info.offset or 0
    length = info.length if info.length is not None else path.stat().st_size - offset
    return path, offset, length


def _read(t: onnx.TensorProto, base: Path) -> onnx.TensorProto:
    """A copy of the weightless tensor `t` with its bytes read from its file under `base`."""
    path, offset, length = _span(t, base)
    full = onnx.TensorProto()
    full.CopyFrom(t)
    del full.external_data[:]
    full.data_location = onnx.TensorProto.DEFAULT
    with open(path, "rb") as f:
        f.seek(offset)
        full.raw_data = f.read(length)
    if len(full.raw_data) != length:
        raise ValueError(f"tensor {t.name!r}: {path.name} ends before its data")
    return full


@contextlib.contextmanager
def weights_on_demand(base: Path) -> Iterator[None]:
    """While inside, `onnx.numpy_helper.to_array` of a weightless tensor reads its bytes from under `base`
    (the folder its locations are relative to) and leaves the tensor itself weightless."""
    real: Callable[..., Any] = onnx.numpy_helper.to_array

    def to_array(tensor: onnx.TensorProto, base_dir: str = "") -> Any:
        if _external(tensor):
            return real(_read(tensor, base))
        return real(tensor, base_dir)

    onnx.numpy_helper.to_array = to_array
    try:
        yield
    finally:
        onnx.numpy_helper.to_array = real


def _shape_inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference on the weightless graph, marked as ORT's `load_model_with_shape_infer` marks it."""
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    inferred = onnx.shape_inference.infer_shapes(model)
    add_infer_metadata(inferred)
    return inferred


def save(model: onnx.ModelProto, out: Path, base: Path) -> Path:
    """Write `model` to `out` with every tensor of 1 KB or more in `out.name + '.data'`: tensors held in memory
    are written as they are, weightless ones are copied from their file under `base` in chunks."""
    data = out.with_name(f"{out.name}.data")
    with open(data, "wb") as sink:
        for t in _tensors(model.graph):
            if _external(t):
                path, start, length = _span(t, base)
                with open(path, "rb") as f:
                    f.seek(start)
                    offset, left = sink.tell(), length
                    while left:
                        chunk = f.read(min(_CHUNK, left))
                        if not chunk:
                            raise ValueError(f"tensor {t.name!r}: {path.name} ends before its data")
                        sink.write(chunk)
                        left -= len(chunk)
            elif t.HasField("raw_data") and len(t.raw_data) >= _EXTERNAL_MIN:
                offset, length = sink.tell(), len(t.raw_data)
                sink.write(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(length))):
                t.external_data.add(key=key, value=value)
            t.data_location = onnx.TensorProto.EXTERNAL
    with open(out, "wb") as f:
        f.write(model.SerializeToString())
    return out


def preprocess(src: Path, out: Path, notes: list[str]) -> Path:
    """What `quant_pre_process` does, without the weights in memory: symbolic shape inference on the weightless
    graph, ORT's basic-level optimization reading the weights from `src`'s folder (ORT writes the result with
    external data), then ONNX shape inference on the result's graph."""
    import onnxruntime as ort
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from ..errors import first_line
    from .optimize import EXTERNAL_FILE, EXTERNAL_MIN

    base = src.parent
    model = onnx.load(str(src), load_external_data=False)
    try:
        with weights_on_demand(base):
            model = SymbolicShapeInference.infer_shapes(model, 2**31 - 1, False, False, 0)
    except Exception as e:  # as quant_pre_process's caller does: go on without symbolic shapes
        notes.append(f"quant_pre_process with symbolic shapes failed ({first_line(e, 120)}); "
                     "retried with skip_symbolic_shape=True")
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(out)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry(FOLDER, str(base))
    so.add_session_config_entry(EXTERNAL_FILE, f"{out.name}.data")
    so.add_session_config_entry(EXTERNAL_MIN, str(_EXTERNAL_MIN))
    serialized = model.SerializeToString()
    del model
    ort.InferenceSession(serialized, so, providers=["CPUExecutionProvider"])
    del serialized
    onnx.shape_inference.infer_shapes_path(str(out), str(out))
    graph = onnx.load(str(out), load_external_data=False)
    add_pre_process_metadata(graph)
    with open(out.with_suffix(".partial"), "wb") as f:
        f.write(graph.SerializeToString())
    os.replace(out.with_suffix(".partial"), out)
    return out


def quantize_dynamic(src: Path, out: Path, *, per_channel: bool, reduce_range: bool, weight_type: Any,
                     op_types_to_quantize: list[str] | None, nodes_to_exclude: list[str] | None,
                     consume: Callable[[], None] | None = None) -> Path:
    """ORT's `quantize_dynamic(src, out, use_external_data_format=True, ...)`, one weight in memory at a time.

    `src` is a model with external data (its files beside it); `out` gets `<name>.data` beside it.
    consume: removes `src` (an intermediate): called once the weights left in float are read into memory, before
    the result is written, so the temp space never holds both."""
    from onnxruntime.quantization import QuantType, onnx_quantizer
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import QuantizationMode, update_opset_version
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    base = src.parent
    model = _shape_inferred(onnx.load(str(src), load_external_data=False))
    model = update_opset_version(model, weight_type)
    reload = onnx_quantizer.save_and_reload_model_with_shape_infer
    onnx_quantizer.save_and_reload_model_with_shape_infer = _shape_inferred
    try:
        with weights_on_demand(base):
            quantizer = ONNXQuantizer(
                model, per_channel, reduce_range, QuantizationMode.IntegerOps, False, weight_type,
                QuantType.QUInt8, None, None, nodes_to_exclude or [],  # dynamic activations: uint8 only
                op_types_to_quantize or list(IntegerOpsRegistry.keys()), {"MatMulConstBOnly": True})
            del model
            quantizer.quantize_model()
    finally:
        onnx_quantizer.save_and_reload_model_with_shape_infer = reload
    quantizer.model.topological_sort()
    result = quantizer.model.model
    if consume is not None:
        for t in _tensors(result.graph):
            if _external(t):
                t.CopyFrom(_read(t, base))
        consume()
    return save(result, out, base)

