"""The fusion step ([targets.X.fusion] on): ONNX Runtime's transformer optimizer, before the precision step.

`onnxruntime.transformers.optimizer.optimize_model(path, model_type, num_heads, hidden_size, opt_level=0)` rewrites
attention, layer norms, GELU and embeddings into `com.microsoft` ops (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization, ...). opt_level 0 runs its Python fusions only: ORT's own graph optimizations run later in
the optimize step, at the target's level (and the optimizer's levels 1+ import torch).

- The fused ops' output types are written into the graph (`value_info`, element types only, from ORT's symbolic
  shape inference, as the optimizer's own `convert_float_to_float16` does): onnx's shape inference does not know
  contrib ops, and ORT's quantizer then fails on a fused graph ("Unable to find data type for weight_name"). With
  them, the precision step's fp16 converter and quantizers take the fused graph unchanged.
- A model type that fuses nothing keeps the source (a note says so); a portable build skips fusion (a note says
  so): its artifact holds standard ONNX ops only.
- The optimizer loads the whole model into memory; with external data the fused model is written with external
  data (`use_external_data_format`), and its types are inferred on the graph without its weights. Every file it
  writes (its temp dir, shape inference's dump on failure) stays inside the job's private temp dir.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortbuild.artifact import manifest_types
from ortbuild.project.config import Fusion, Settings
from ortbuild.project.precisions import Quantizer

# The com.microsoft op types ONNX Runtime's transformer optimizer writes: with fusion on, op-type options
# (quantization.op_types, fp16.op_block_list) may name them (e.g. "EmbedLayerNormalization" for its quantized form)
FUSED_OP_TYPES = frozenset({
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "EmbedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
    "GemmFastGelu", "QuickGelu", "BiasSplitGelu", "BiasAdd", "GroupNorm", "SkipGroupNorm", "NhwcConv",
    "RotaryEmbedding"})
# what the fusions write, by what holds the weights (for the notes on quantization.op_types)
WEIGHT_HOLDERS = {"Attention": "the Q/K/V MatMul weights", "EmbedLayerNormalization": "the embedding tables (Gather)"}


@dataclass(frozen=True)
class FusionResult:
    path: Path                       # the fused model (in the private temp dir), or the source when not applied
    model: onnx.ModelProto           # its graph (tensors' data not loaded when it has external data)
    model_type: str
    num_heads: int
    hidden_size: int
    applied: bool
    fused_ops: dict[str, int]        # op type -> nodes the optimizer added
    nodes_before: int
    nodes_after: int
    reason: str = ""                 # why it was not applied
    notes: list[str] = field(default_factory=list)

    def manifest_section(self) -> manifest_types.Fusion:
        """The manifest's `fusion` record."""
        return manifest_types.Fusion(model_type=self.model_type, num_heads=self.num_heads, hidden_size=self.hidden_size,
                               applied=self.applied, fused_ops=dict(self.fused_ops), nodes_before=self.nodes_before,
                               nodes_after=self.nodes_after, reason=self.reason)


# standard ONNX ops some fusions write (a LayerNormalization from ReduceMean/Sub/Pow/Sqrt/Div, ...)
STANDARD_FUSED = frozenset({"LayerNormalization", "Gelu"})


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """Nodes per op type of the main graph (the optimizer fuses the main graph only) that a fusion writes:
    com.microsoft ops and STANDARD_FUSED (not the Casts and Reshapes it adds around them)."""
    return Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft" or n.op_type in STANDARD_FUSED)


def fused_ops(before: Counter[str], after: Counter[str]) -> dict[str, int]:
    """The op types the fusion added nodes of, and how many: {"Attention": 3, "SkipLayerNormalization": 6}."""
    return {op: after[op] - before[op] for op in sorted(after) if after[op] > before[op]}


def summary(fused: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in fused.items()) or "nothing"


def skipped(model: onnx.ModelProto, opts: Fusion, source: Path, reason: str) -> FusionResult:
    """Fusion not applied (a portable build): the source goes on to the precision step."""
    n = len(model.graph.node)
    return FusionResult(source, model, opts.model_type, opts.num_heads, opts.hidden_size, False, {}, n, n, reason,
                        [f"fusion '{opts.model_type}' not applied: {reason}"])


class _Collect(logging.Handler):
    """The optimizer's warnings ("Attention (or MultiHeadAttention) not fused", ...), for the notes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())[:200]
        if text not in self.messages:
            self.messages.append(text)


def unknown_here(model_type: str) -> str | None:
    """Why the installed ONNX Runtime's optimizer lacks `model_type` (the key's choices are those of onnxruntime
    1.31.1; another flavor or version may offer fewer), or None."""
    import onnxruntime
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    if model_type in MODEL_TYPES:
        return None
    return (f"the transformer optimizer of onnxruntime {onnxruntime.__version__} in this target's runtime has no "
            f"model type '{model_type}' (it has: {', '.join(MODEL_TYPES)})")


def run(source: Path, model: onnx.ModelProto, opts: Fusion, work: Path, *, external: bool = False) -> FusionResult:
    """Fuse the model at `source` (`model`: its graph as the check step read it, weights loaded or not).
    external: write the fused model's weights as external data (`fused.onnx.data`)."""
    root = logging.getLogger()
    collect = _Collect()
    handlers, root.handlers = root.handlers, [collect]  # the optimizer's warnings go to the notes, not stderr
    tmp = tempfile.tempdir
    tempfile.tempdir = str(work.resolve())  # optimize_model makes a TemporaryDirectory even at opt_level 0
    try:
        with contextlib.chdir(work):  # symbolic shape inference dumps the model into the current dir on failure
            return _run(source.resolve(), model, opts, work.resolve(), external, collect)
    finally:
        tempfile.tempdir = tmp
        root.handlers = handlers


def _run(source: Path, model: onnx.ModelProto, opts: Fusion, work: Path, external: bool,
         collect: _Collect) -> FusionResult:
    from onnxruntime.transformers.optimizer import optimize_model

    optimizer = optimize_model(str(source), model_type=opts.model_type, num_heads=opts.num_heads,
                               hidden_size=opts.hidden_size, opt_level=0, only_onnxruntime=False)
    fused = fused_ops(op_counts(model), op_counts(optimizer.model))
    nodes_before, nodes_after = len(model.graph.node), len(optimizer.model.graph.node)
    said = "; ".join(f'"{m}"' for m in collect.messages[:3])
    said = f" (it warned: {said})" if said else ""
    if not fused:
        del optimizer
        reason = (f"the '{opts.model_type}' optimizer of ONNX Runtime fused nothing in this model: its exporter's "
                  "patterns are not ones it recognizes")
        return FusionResult(source, model, opts.model_type, opts.num_heads, opts.hidden_size, False, {},
                            nodes_before, nodes_before, reason,
                            [f"fusion '{opts.model_type}' not applied: {reason}{said}; the source is used as it is "
                             f"(set fusion = {{ model_type = \"off\" }} for this model, or try another model type)"])
    out = work / "fused.onnx"
    optimizer.save_model_to_file(str(out), use_external_data_format=external)
    del optimizer
    graph = onnx.load(str(out), load_external_data=False)  # the weights stay in their file when external
    notes = [f"fusion '{opts.model_type}' (ONNX Runtime's transformer optimizer): {nodes_before} -> "
             f"{nodes_after} nodes, fused {summary(fused)}; these com.microsoft ops tie the artifact to "
             "providers that have their kernels (manifest: optimization.tied_to)"]
    if not any("Attention" in op for op in fused):
        notes.append(f"fusion '{opts.model_type}' fused no attention: ONNX Runtime's optimizer did not recognize "
                     f"this graph's attention pattern{said}")
    ours = set(work.iterdir())
    problem = annotate_types(graph)
    for f in set(work.iterdir()) - ours:  # what shape inference dumped on failure (all the weights): not needed
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    if problem:
        notes.append(f"the fused graph's types could not all be inferred ({problem}): int8 quantization of it may "
                     "fail")
    onnx.save_model(graph, str(out))  # the graph only: external tensors keep pointing at fused.onnx.data
    return FusionResult(out, graph, opts.model_type, opts.num_heads, opts.hidden_size, True, fused,
                        nodes_before, nodes_after, "", notes)


def annotate_types(model: onnx.ModelProto) -> str | None:
    """Add the element type (no shape) of every value the graph does not type yet, from ORT's symbolic shape
    inference, which knows the contrib ops onnx's shape inference skips. Works on a graph without its weights.
    Returns why it failed, or None."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=False)
    except Exception as e:  # the converters and quantizers then run without these types, as before
        return " ".join(str(e).split())[:200] or type(e).__name__
    if inferred is None:
        return "the model's opset is below 7"
    g = model.graph
    known = {v.name for v in [*g.value_info, *g.input, *g.output]} | {t.name for t in g.initializer}
    for vi in inferred.graph.value_info:
        if vi.name in known or not vi.type.HasField("tensor_type") \
                or vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            continue
        typed = g.value_info.add()
        typed.CopyFrom(vi)
        typed.type.tensor_type.ClearField("shape")  # shapes merged by auto_merge can be wrong (onnxruntime#15521)
    return None


def precision_notes(settings: Settings, fused: dict[str, int]) -> list[str]:
    """What a fused graph changes for the precision step's options."""
    notes = []
    q = settings.quantization
    if settings.rule.quantized and q.op_types:
        for op, what in WEIGHT_HOLDERS.items():
            if op in fused and op not in q.op_types:
                notes.append(f"the fused {op} nodes hold {what}: quantization.op_types {list(q.op_types)} leaves them "
                             f"in float (add \"{op}\" to quantize them)")
    if settings.rule.quantizer is Quantizer.INT4 and "Attention" in fused:
        notes.append(f"int4-weight quantizes MatMul weights only: the fused Attention nodes keep "
                     f"{WEIGHT_HOLDERS['Attention']} in float")
    return notes


def lost_nodes(settings: Settings, model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(key, node name) of the precision options' node names that the fusion removed (fused into another node):
    the quantizers and the fp16 converter would ignore them silently."""
    names: set[str] = set()
    graphs = [model.graph]
    while graphs:  # subgraphs (If/Loop/Scan bodies) included: the check step accepted their names
        g = graphs.pop()
        for n in g.node:
            names.add(n.name)
            graphs += [a.g for a in n.attribute if a.HasField("g")] + [x for a in n.attribute for x in a.graphs]
    lists = {"quantization.exclude_nodes": settings.quantization.exclude_nodes,
             "fp16.node_block_list": settings.fp16.node_block_list,
             "int4.exclude_nodes": settings.int4.exclude_nodes}
    table = settings.rule.options_table
    return [(key, name) for key, values in lists.items() if key.startswith(f"{table}.")
            for name in values if name not in names]
