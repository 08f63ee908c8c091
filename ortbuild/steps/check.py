"""Step 1: load the source model, run the full onnx checker and shape inference, record its signature."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx


@dataclass(frozen=True)
class CheckResult:
    model: onnx.ModelProto
    sha256: str
    size: int
    signature: dict[str, Any]
    opsets: dict[str, int]
    ir_version: int


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    t = v.type.tensor_type
    try:
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    except (KeyError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(t.elem_type).lower()
    shape: list[int | str | None] | None = None
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return {"name": v.name, "dtype": dtype, "shape": shape}


def signature(model: onnx.ModelProto) -> dict[str, Any]:
    inits = {i.name for i in model.graph.initializer}
    return {
        "inputs": [_value_info(v) for v in model.graph.input if v.name not in inits],
        "outputs": [_value_info(v) for v in model.graph.output],
    }


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def run(path: Path) -> CheckResult:
    """Raises onnx's ValidationError / InferenceError for an invalid model (the build names the step)."""
    data = path.read_bytes()
    model = onnx.load_model_from_string(data)
    if model.ByteSize() > 2**31 - 1 or any(
            i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer):
        onnx.checker.check_model(str(path), full_check=True)  # the path form handles external data
        model = onnx.load(str(path))
    else:
        onnx.checker.check_model(model, full_check=True)  # full_check = strict shape inference too
    return CheckResult(model=model, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                       signature=signature(model), opsets=opsets(model), ir_version=model.ir_version)
