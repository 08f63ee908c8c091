"""What `ortbuild init` reads off a model without running it: its graph (no external data), golden inputs generated
from its input signature, and which nodes its weights feed (whether int8-dynamic or int4-weight suits it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild import modelfiles
from ortbuild.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import onnx

SEED = 0  # generated golden inputs are the same on every run
MAX_INPUT_BYTES = 64 << 20  # one generated input: golden data, not a benchmark set (--dim can ask for anything)
# Ops whose weights int8-dynamic quantizes well: ORT quantizes activations at run time, which suits MatMul-heavy
# graphs (transformers, MLPs, recurrent nets); Conv-heavy graphs lose accuracy and speed that way and want
# int8-static with calibration data (real samples), which init cannot make up.
DYNAMIC_OPS = frozenset({"MatMul", "Gemm", "Gather", "LSTM", "GRU", "Attention", "EmbedLayerNormalization"})
INT4_OPS = frozenset({"MatMul"})  # the weights int4-weight converts (MatMulNBits)
HINT = "give real golden inputs: `ortbuild init --inputs MODEL=FILE.npz` (an .npz keyed by input name)"


def graph(model: Path) -> onnx.GraphProto:
    """The model's main graph, its external data left unread (a ConfigError naming the file if it is none)."""
    return modelfiles.load_graph(model).graph


def _dim(dim: onnx.TensorShapeProto.Dimension, position: int, rank: int, is_float: bool,
         dims: Mapping[str, int]) -> int:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return int(dim.dim_value)
    if dim.dim_param in dims:
        return dims[dim.dim_param]
    if position == 0:
        return 1  # a batch
    if is_float and rank == 4 and position >= 2:
        return 224  # an image's height and width
    return 16  # a sequence


def generated_inputs(model: Path, g: onnx.GraphProto, dims: Mapping[str, int]) \
        -> tuple[dict[str, np.ndarray], list[str]]:
    """Golden inputs from the graph's input signature: floats uniform in [0, 1), integers 0 (masks 1), booleans
    true; symbolic dims from `dims`, else batch 1, image 224, sequence 16. Returns them and how dims were set."""
    import numpy as np
    import onnx
    from onnx import helper

    weights = {i.name for i in g.initializer}
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {}
    chosen: list[str] = []
    for value in g.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        where = f"input '{value.name}'"
        if not value.type.HasField("tensor_type") or tensor.elem_type in (onnx.TensorProto.STRING,
                                                                          onnx.TensorProto.UNDEFINED):
            raise ConfigError(str(model), where, "is not a numeric tensor: init cannot make golden data for it", HINT)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if dtype.kind not in "fiub":  # bfloat16, float8, int4: no numpy type the golden files can hold
            raise ConfigError(str(model), where, f"is {onnx.TensorProto.DataType.Name(tensor.elem_type)}, which "
                              "init cannot generate", HINT)
        rank = len(tensor.shape.dim)
        shape = [_dim(d, i, rank, dtype.kind == "f", dims) for i, d in enumerate(tensor.shape.dim)]
        chosen += [f"{d.dim_param or '?'}={s}" for d, s in zip(tensor.shape.dim, shape, strict=True)
                   if not (d.HasField("dim_value") and d.dim_value > 0)]
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if size > MAX_INPUT_BYTES:
            raise ConfigError(str(model), where, f"would be {size / 2**20:.0f} MiB with shape {shape} (at most "
                              f"{MAX_INPUT_BYTES >> 20} MiB is generated)", "set smaller dims with --dim NAME=N")
        if dtype.kind == "f":
            out[value.name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind == "b":
            out[value.name] = np.ones(shape, dtype=dtype)
        else:
            out[value.name] = np.full(shape, 1 if "mask" in value.name.lower() else 0, dtype=dtype)
    return out, sorted(set(chosen))


def weight_share(g: onnx.GraphProto, ops: frozenset[str]) -> float | None:
    """The share of the graph's weight bytes that feed `ops` nodes (subgraphs included); None: it has none."""
    import onnx

    by_op: dict[bool, int] = {True: 0, False: 0}

    def walk(sub: onnx.GraphProto, weights: dict[str, int]) -> None:
        weights = {**weights, **{t.name: modelfiles.nbytes(t) for t in sub.initializer}}
        for node in sub.node:
            if node.op_type == "Constant":  # exporters keep some weights there (int8-dynamic lifts them)
                for a in node.attribute:
                    if a.name == "value":
                        weights[node.output[0]] = modelfiles.nbytes(a.t)
            for name in node.input:
                if name in weights:
                    by_op[node.op_type in ops] += weights.pop(name)
            for attr in node.attribute:
                if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    for body in [attr.g, *attr.graphs]:
                        walk(body, weights)

    walk(g, {})
    total = by_op[True] + by_op[False]
    return by_op[True] / total if total else None
