"""Known-good starting points of int8-static (`quantization.recipe`, docs/targets.md#int8-static-of-transformers):
what the precision step leaves in float before any search, by the kind of graph it quantizes.

One recipe today, `transformer`, for graphs with attention (a Softmax beside a MatMul of two activations, or ONNX
Runtime's fused attention ops), after NNCF's transformer preset (its ignored op types, attention kept apart) and
measured on paraphrase-MiniLM-L3-v2 (docs/benchmarks.md): ORT's `quantize_static` with its defaults quantizes every
op it supports, the outputs of the MatMuls included, and the per-tensor scale of a MatMul's output before the
residual Add (where one token's activations are 20x the others') costs the embedding most of its accuracy (cosine
0.84; 0.93 with MatMuls only). The recipe:
- quantizes the MatMul and Gemm nodes only (unless `op_types` says which), as NNCF's preset ignores the elementwise
  and normalisation ops;
- leaves their outputs in float (ORT's `OpTypesToExcludeOutputQuantization`): the next op reads the float result;
- keeps the attention's MatMuls of two activations (query x key, probabilities x value) in float.
Weights stay as `per_channel` and `weight_type` say (per-channel symmetric int8 by default, as NNCF's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

VERSION = 1  # in the build key of every int8-static job (buildkey.key_parts): a changed recipe rebuilds them
# ONNX Runtime's fused attention ops (its transformer optimizer's output, `fusion.model_type`)
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                           "PackedMultiHeadAttention", "DecoderMaskedMultiHeadAttention", "SparseAttention"})
QUANTIZED = ("MatMul", "Gemm")


@dataclass(frozen=True)
class Recipe:
    """What a recipe asks of ORT's quantize_static, and the note the build records."""

    name: str
    op_types: tuple[str, ...]
    exclude_nodes: tuple[str, ...]
    extra_options: Mapping[str, object] = field(default_factory=dict)
    note: str = ""


def transformer(graph: onnx.GraphProto, op_types: tuple[str, ...]) -> Recipe | None:
    """The transformer recipe for a graph with attention (None for other graphs). `op_types`: the target's
    `quantization.op_types` (kept where set)."""
    consts = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    pairs = [n for n in graph.node if n.op_type == "MatMul" and len(n.input) == 2
             and n.input[0] not in consts and n.input[1] not in consts]
    fused = any(n.op_type in ATTENTION_OPS for n in graph.node)
    if not fused and not (pairs and any(n.op_type == "Softmax" for n in graph.node)):
        return None
    named = tuple(n.name for n in pairs if n.name)
    unnamed = len(pairs) - len(named)
    note = (f"int8-static's transformer recipe (quantization.recipe = \"auto\"): "
            f"{'/'.join(op_types or QUANTIZED)} quantized, their outputs left in float"
            + (f", the attention's {len(named)} MatMul(s) of two activations kept in float" if named else "")
            + (f" ({unnamed} unnamed one(s) quantized: ORT excludes nodes by name)" if unnamed else ""))
    return Recipe("transformer", op_types or QUANTIZED, named,
                  {"OpTypesToExcludeOutputQuantization": list(QUANTIZED)}, note)
