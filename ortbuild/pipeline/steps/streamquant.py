"""int8 for models with external data: ONNX Runtime's own quantizers, fed one weight at a time.

`quant_pre_process`, `quantize_dynamic` and `quantize_static` load the whole model and copy it 2-3 times
(symbolic shape inference, a deep copy saved and reloaded for shape inference, the calibrator's augmented copy,
the result serialized whole): 3.5-4x the weights in memory, and 2x in temp space. Inside `weightless`, ORT's
functions run unchanged on the graph loaded *without* its weights:

- every weight the quantizer asks for (all of them go through `onnx.numpy_helper.to_array`) is read from its
  external-data file when asked and dropped when the quantizer is done with it;
- shape inference runs on the weightless graph (it needs shapes and types, never values);
- the calibrator's augmented graph is written alone, its data files hard-linked beside it (ORT's calibration
  session maps the same bytes);
- the result is written tensor by tensor: quantized weights from memory (a quarter of the float ones), the
  weights left in float copied from their file in chunks.

`preprocess` does what `quant_pre_process` does (symbolic shape inference, ORT's basic-level optimization, ONNX
shape inference), with ORT reading the weights from the source's folder and writing the result's weights as
external data.

What the quantizers decide and compute is ORT's: `tests/test_streamquant.py` checks that the output equals
theirs with the weights in memory (the same nodes, the same tensors), dynamic and static, QDQ and QOperator.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data

from ortbuild.modelfiles import extent, graph_tensors

_CHUNK = 1 << 20
_EXTERNAL_MIN = 1024  # tensors of this many bytes or more are written as external data (ONNX's default)
FOLDER = "session.model_external_initializers_file_folder_path"


def _external(t: onnx.TensorProto) -> bool:
    """Whether `t` points at external data not loaded (a weightless tensor)."""
    return uses_external_data(t) and not t.HasField("raw_data")


def _span(t: onnx.TensorProto, base: Path) -> tuple[Path, int, int]:
    """Where the weightless tensor `t` keeps its bytes: file under `base`, offset, length (no length in the
    model: to the file's end)."""
    location, offset, length = extent(t)
    path = base / location
    return path, offset, length if length is not None else path.stat().st_size - offset


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
    real = onnx.numpy_helper.to_array

    def to_array(tensor: onnx.TensorProto, base_dir: str = "") -> np.ndarray:
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
        for t in graph_tensors(model.graph):
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


def no_symbolic_shapes(e: Exception) -> str:
    """The build note when symbolic shape inference fails and pre-processing goes on without it."""
    from ortbuild.errors import first_line

    return (f"quant_pre_process with symbolic shapes failed ({first_line(e, 120)}); "
            "retried with skip_symbolic_shape=True")


def preprocess(src: Path, out: Path, notes: list[str]) -> Path:
    """What `quant_pre_process` does, without the weights in memory: symbolic shape inference on the weightless
    graph, ORT's basic-level optimization reading the weights from `src`'s folder (ORT writes the result with
    external data), then ONNX shape inference on the result's graph."""
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from ortbuild import runtime

    ort = runtime.import_ort()

    base = src.parent
    model = onnx.load(str(src), load_external_data=False)
    try:  # on failure it dumps the graph into the current directory: keep that in the output's (private) folder
        with weights_on_demand(base), contextlib.chdir(out.parent.resolve()):
            model = SymbolicShapeInference.infer_shapes(model, 2**31 - 1, False, False, 0)
    except Exception as e:  # as quant_pre_process's caller does: go on without symbolic shapes
        notes.append(no_symbolic_shapes(e))
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(out)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry(FOLDER, str(base))
    so.add_session_config_entry(runtime.EXTERNAL_FILE, f"{out.name}.data")
    so.add_session_config_entry(runtime.EXTERNAL_MIN, str(_EXTERNAL_MIN))
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


def _link_data(model: onnx.ModelProto, where: Path, base: Path) -> None:
    """Make the external-data files `model` names readable beside `where` (a graph ORT will load from there):
    hard links to the files under `base` (no bytes copied); a copy where the two folders are on different
    file systems."""
    from ortbuild.modelfiles import locations

    for loc in locations(model):
        dst = where.parent / loc
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(base / loc, dst)
            except OSError:
                shutil.copyfile(base / loc, dst)


@contextlib.contextmanager
def weightless(base: Path, consume: Callable[[], None] | None = None) -> Iterator[None]:
    """While inside, ONNX Runtime's `quantize_dynamic` and `quantize_static`, called as they are, work on the
    graph without its weights (`base`: the folder of the model's external data):

    - ORT's loads (`load_model_with_shape_infer`, `save_and_reload_model_with_shape_infer`) load the graph
      alone and infer shapes on it;
    - every weight is read when the quantizer asks for it (`weights_on_demand`);
    - a weightless graph ORT saves for its own sessions (the calibrator's augmented model) is written alone,
      its data files hard-linked beside it;
    - the result (`ONNXModel.save_model_to_file`) is written by `save`, tensor by tensor. `consume` removes the
      input (an intermediate): it is called once the weights left in float are in memory, before the result is
      written, so the temp space never holds both.
    """
    import sys

    from onnxruntime.quantization import base_quantizer, calibrate, onnx_quantizer
    from onnxruntime.quantization.onnx_model import ONNXModel

    quantize = sys.modules["onnxruntime.quantization.quantize"]
    real_save: Callable[..., None] = onnx.save_model

    def load(path: Path) -> onnx.ModelProto:
        return _shape_inferred(onnx.load(str(path), load_external_data=False))

    def save_model(proto: onnx.ModelProto | bytes, f: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if isinstance(proto, onnx.ModelProto) and any(_external(t) for t in graph_tensors(proto.graph)):
            _link_data(proto, Path(f), base)
            Path(f).write_bytes(proto.SerializeToString())
        else:
            real_save(proto, f, *args, **kwargs)

    def save_result(self: ONNXModel, output_path: str, use_external_data_format: bool = False) -> None:
        self.topological_sort()
        if consume is not None:
            for t in graph_tensors(self.model.graph):
                if _external(t):
                    t.CopyFrom(_read(t, base))
            consume()
        save(self.model, Path(output_path), base)

    patches: list[tuple[object, str, object]] = [
        (quantize, "load_model_with_shape_infer", load),
        (calibrate, "load_model_with_shape_infer", load),
        (quantize, "save_and_reload_model_with_shape_infer", _shape_inferred),
        (onnx_quantizer, "save_and_reload_model_with_shape_infer", _shape_inferred),
        (base_quantizer, "save_and_reload_model_with_shape_infer", _shape_inferred),
        (onnx, "save", save_model),
        (onnx, "save_model", save_model),
        (ONNXModel, "save_model_to_file", save_result),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        with weights_on_demand(base):
            yield
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)
