"""The check step: load the source model, run the full onnx checker and shape inference, record its signature.

A model with external data is checked from its path and its graph is read without the weights: the weights
are only ever read by the step that changes them (precision) and by ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from ortbuild import modelfiles, paths
from ortbuild.artifact import manifest_types
from ortbuild.errors import ConfigError
from ortbuild.project.config import Settings, did_you_mean


@dataclass(frozen=True)
class CheckResult:
    model: onnx.ModelProto           # the graph; its tensors' data not loaded when the model has external data
    files: modelfiles.ModelFiles     # the graph file and its external-data files, hashed
    sha256: str                      # of the graph file
    size: int                        # of every file of the model
    signature: modelfiles.Signature
    opsets: dict[str, int]
    ir_version: int

    def manifest_section(self, path: str) -> manifest_types.Source:
        """The manifest's `source` (`path`: as the project names it)."""
        return manifest_types.Source(path=path, sha256=self.sha256, size=self.size, ir_version=self.ir_version,
                               opsets=self.opsets, files=[f.as_json() for f in self.files.files])


def _elem(dt: int) -> str:
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(dt))
    except (KeyError, ValueError):
        return str(onnx.TensorProto.DataType.Name(dt)).lower()


def type_string(t: onnx.TypeProto) -> str:
    """seq(map(int64,tensor(float32))) and the like, for non-tensor values."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({_elem(t.tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_string(t.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({_elem(t.map_type.key_type)},{type_string(t.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_string(t.optional_type.elem_type)})"
    return str(kind)


def _value_info(v: onnx.ValueInfoProto) -> modelfiles.ValueInfo:
    if not v.type.HasField("tensor_type"):  # sequence, map, optional (classic-ML models return them)
        return {"name": v.name, "dtype": type_string(v.type), "shape": None,
                "kind": (v.type.WhichOneof("value") or "unknown").removesuffix("_type")}
    t = v.type.tensor_type
    dtype = _elem(t.elem_type)
    shape: list[int | str | None] | None = None
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return {"name": v.name, "dtype": dtype, "shape": shape}


def signature(model: onnx.ModelProto) -> modelfiles.Signature:
    inits = {i.name for i in model.graph.initializer}
    return {
        "inputs": [_value_info(v) for v in model.graph.input if v.name not in inits],
        "outputs": [_value_info(v) for v in model.graph.output],
    }


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def run(path: Path, files: modelfiles.ModelFiles | None = None) -> CheckResult:
    """Raises onnx's ValidationError / InferenceError for an invalid model (the build names the step).
    `files`: the model's files as the build key hashed them (else they are found and hashed here)."""
    problem = paths.input_problem(path, limit=paths.MAX_MODEL_BYTES)
    if problem:
        raise ConfigError(str(path), "", f"the model {problem}", "name an ONNX model file")
    files = files or modelfiles.of(path)
    if files.has_external_data:
        model = modelfiles.load_graph(path)  # ConfigError naming the path when it is no ONNX model
        onnx.checker.check_model(str(path), full_check=True)  # the path form reads no weights
    else:
        model = modelfiles.parse_graph(path.read_bytes(), path)
        onnx.checker.check_model(model, full_check=True)  # full_check = strict shape inference too
    return CheckResult(model=model, files=files, sha256=files.graph.sha256, size=files.size,
                       signature=signature(model), opsets=opsets(model), ir_version=model.ir_version)


def _node_names(model: onnx.ModelProto) -> set[str]:
    """Node names of a model, subgraphs included."""
    names: set[str] = set()

    def walk(graph: onnx.GraphProto) -> None:
        for n in graph.node:
            names.add(n.name)
            for attr in n.attribute:
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(g)

    walk(model.graph)
    return names


def settings_problems(model: onnx.ModelProto, sig: modelfiles.Signature, settings: Settings) -> list[tuple[str, str]]:
    """Names inside the settings that the tools would silently ignore: (key, message) pairs.

    ORT's quantizers and float16 converter skip unknown op types and node names without a word, and
    add_free_dimension_override_by_name ignores a dimension no input has.
    """
    node_names = _node_names(model)
    known_ops = {s.name for s in onnx.defs.get_all_schemas()}
    if settings.fusion.enabled:  # the fused graph's com.microsoft ops are op types of the precision step too
        from ortbuild.pipeline.steps.fusion import FUSED_OP_TYPES

        known_ops |= FUSED_OP_TYPES
    problems = []
    lists = {"quantization.op_types": (settings.quantization.op_types, "op"),
             "fp16.op_block_list": (settings.fp16.op_block_list, "op"),
             "quantization.exclude_nodes": (settings.quantization.exclude_nodes, "node"),
             "fp16.node_block_list": (settings.fp16.node_block_list, "node"),
             "int4.exclude_nodes": (settings.int4.exclude_nodes, "node")}
    for key, (values, kind) in lists.items():
        for v in values:
            if kind == "op" and v not in known_ops:
                problems.append((key, f"'{v}' is not an ONNX op type{did_you_mean(v, sorted(known_ops))}"))
            elif kind == "node" and v not in node_names:
                problems.append((key, f"the model has no node named '{v}'{did_you_mean(v, sorted(node_names))}"))
    dims = {d for i in sig["inputs"] for d in (i["shape"] or []) if isinstance(d, str)}
    for dim in settings.free_dimensions:
        if dim not in dims:
            shown = ", ".join(sorted(dims)) or "none"
            problems.append((f"free_dimensions.{dim}",
                             f"no input of the model has a dimension named '{dim}' (symbolic dims: {shown})"))
    return problems  # op types absent from this model are fine: one target serves many models
