"""Layer-wise analysis of a precision step (`ortbuild test --explain`, steps 1 to 3): which source nodes it
changed, If/Loop/Scan bodies included, and the error each adds against fp32 on the golden inputs (main graph).
Predictions of a candidate set kept in float without a rebuild: predict.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto

from ortbuild.project import config, data, precisions
from ortbuild.project.precisions import PrecisionRule, Quantizer

if TYPE_CHECKING:
    import onnxruntime

# The operators ORT's quantizers write (QOperator, QDQ, dynamic, int4): a source node whose outputs the reduced
# graph computes through one of them, or through a weight they made integer, was quantized.
QUANT_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM", "MatMulNBits",
    "QEmbedLayerNormalization", "GatherBlockQuantized", "MatMulBnb4"})
# an op type no quantizer knows: the int8 path with it quantizes nothing (the graph the quantizer reads)
NOTHING = "ortbuild.gating.search.explain.NoSuchOp"
_INT_TYPES = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4,
                        TensorProto.INT16, TensorProto.UINT16})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


@dataclass(frozen=True)
class Prediction:
    """A candidate judged without a rebuild (predict.Proxy)."""

    passed: bool                     # the gate's rule, on the outputs so predicted
    error: float                     # the largest relative L2 error of the judged float outputs against fp32
    worst: str                       # the gate's one-line summary (compare.worst_metric)


@dataclass(frozen=True)
class Layer:
    node: str
    op_type: str
    error: float | None              # relative L2 error of its outputs against fp32 (inf: non-finite)
    added: float                     # what it adds to the largest error of its inputs
    weights: int = 0                 # bytes of the float weights it reads that the precision step converted
    note: str = ""                   # why `error` is None: "n/a (...)"
    alone: Prediction | None = None  # predicted with only this node kept in float
    ran: bool = True                 # False: inside an If/Loop/Scan body the golden inputs do not run (not searched)


def _squares(got: object, ref: object) -> tuple[float, float]:
    """The squared L2 norms of got - ref (inf: another shape, or non-finite where ref is finite) and of ref."""
    a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    ref2 = float(np.square(b).sum())
    if a.shape != b.shape or (np.isfinite(b).all() and not np.isfinite(a).all()):
        return math.inf, ref2
    return float(np.square(a - b).sum()), ref2


def _relative(diff2: float, ref2: float) -> float:
    return math.sqrt(diff2) / math.sqrt(ref2) if ref2 > 0 else math.sqrt(diff2)


def rel_error(got: object, ref: object) -> float:
    """The relative L2 error of got against ref (inf: another shape, or non-finite where ref is finite)."""
    return _relative(*_squares(got, ref))


def session_of(model: onnx.ModelProto, custom_ops: Sequence[config.CustomOps]) -> onnxruntime.InferenceSession:
    """A session on `model`: CPU provider, no optimization (the graph as written)."""
    from ortbuild import runtime

    ort = runtime.import_ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runtime.register_custom_ops(so, custom_ops)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def executed(model: onnx.ModelProto, feed: data.Feed, custom_ops: Sequence[config.CustomOps] = ()) -> set[str]:
    """The names of the nodes, bodies' included, that run on `feed` (ORT's profile of one run: CPU provider, no
    optimization): an If runs one branch, the other's nodes cannot change the outputs."""
    from ortbuild import runtime

    ort = runtime.import_ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runtime.register_custom_ops(so, custom_ops)
    with tempfile.TemporaryDirectory(prefix="ortbuild-profile-") as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "run")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, dict(feed))
        events = json.loads(Path(sess.end_profiling()).read_text())
    suffix = "_kernel_time"
    return {e["name"][:-len(suffix)] for e in events if e.get("cat") == "Node" and e["name"].endswith(suffix)}


def _exposed(model: onnx.ModelProto, names: Sequence[str], custom_ops: Sequence[config.CustomOps] = ()) \
        -> tuple[onnxruntime.InferenceSession, list[str]]:
    """A session that outputs the tensors `names` (those the graph computes), and which: CPU provider, no
    optimization."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o for n in m.graph.node for o in n.output} | {o.name for o in m.graph.output}
    present = [n for n in names if n in have]
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in present if n not in known)
    return session_of(m, custom_ops), present


def _run(session: onnxruntime.InferenceSession, present: list[str], feed: data.Feed) -> dict[str, np.ndarray]:
    values = session.run(present, dict(feed))
    return {n: v for n, v in zip(present, values, strict=True) if isinstance(v, np.ndarray) and v.dtype.kind == "f"}



def _quantizing(node: onnx.NodeProto) -> bool:
    return node.op_type in QUANT_OPS or node.op_type.startswith("QLinear")


def _np_itemsize(data_type: int) -> int:
    return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)


@dataclass(frozen=True)
class Scope:
    """One graph of a model: the main graph, or an If/Loop/Scan body with the graphs that enclose it."""

    # () for the main graph; per level: the owner node's name, its rank among the owners so named, the attribute
    # and the index in it (-1: a single graph), which ORT's converters keep
    key: tuple[tuple[str, int, str, int], ...]
    graph: onnx.GraphProto
    outer: tuple[onnx.GraphProto, ...] = ()

    @property
    def where(self) -> str:
        """The body in words: `If_0 then_branch`, nested levels joined by ` > `."""
        return " > ".join(f"{name} {attr}" + (f" {k}" if k >= 0 else "") for name, _, attr, k in self.key)

    def visible_inits(self) -> dict[str, onnx.TensorProto]:
        """The initializers a node of this graph reads by name: its own, else the nearest enclosing graph's."""
        out: dict[str, onnx.TensorProto] = {}
        for g in (*self.outer, self.graph):
            out.update({i.name: i for i in g.initializer})
        return out


def scopes(graph: onnx.GraphProto, key: tuple[tuple[str, int, str, int], ...] = (),
           outer: tuple[onnx.GraphProto, ...] = ()) -> Iterator[Scope]:
    """`graph` and every body inside it, depth first, each keyed so that a body of the source and the same body
    of the precision step's output share the key."""
    yield Scope(key, graph, outer)
    seen: dict[str, int] = {}
    for n in graph.node:
        bodies = [(a, [a.g] if a.HasField("g") else list(a.graphs)) for a in n.attribute]
        if not any(gs for _, gs in bodies):
            continue
        name = n.name or n.op_type
        rank = seen.get(name, 0)
        seen[name] = rank + 1
        for a, gs in bodies:
            for k, g in enumerate(gs):
                yield from scopes(g, (*key, (name, rank, a.name, -1 if a.HasField("g") else k)), (*outer, graph))


def scope_pairs(source: onnx.ModelProto, reduced: onnx.ModelProto) -> Iterator[tuple[Scope, Scope]]:
    """The graphs of `source` with the same graph of `reduced` (bodies the precision step dropped: none)."""
    red = {s.key: s for s in scopes(reduced.graph)}
    for s in scopes(source.graph):
        if s.key in red:
            yield s, red[s.key]


class Rewrites:
    """How the precision step rewrote the source graph: for each source node, the nodes of the reduced graph that
    now compute its outputs, found by walking back from them through the tensors the source does not have (a
    quantizer's own tensors: `x_quantized`, scales, `MatMul_output_0_output_quantized`). For an If/Loop/Scan
    body: that body in both models (`scope_pairs`), with the names the enclosing graphs give it."""

    def __init__(self, source: onnx.ModelProto | Scope, reduced: onnx.ModelProto | Scope) -> None:
        src = source if isinstance(source, Scope) else Scope((), source.graph)
        red = reduced if isinstance(reduced, Scope) else Scope((), reduced.graph)
        r = red.graph
        self.source_inits = src.visible_inits()
        self.source_tensors = set(self.source_inits)
        for g in (*src.outer, src.graph):
            self.source_tensors |= {i.name for i in g.input} | {o for n in g.node for o in n.output}
        self.reduced_inits = red.visible_inits()
        self.nodes = list(r.node)
        self.writer = {o: k for k, n in enumerate(self.nodes) for o in n.output if o}
        self.named = {n.name: k for k, n in enumerate(self.nodes) if n.name}

    def lineage(self, node: onnx.NodeProto) -> list[int]:
        """The reduced nodes (indices) that compute `node`'s outputs from tensors the source graph has, and the
        node of the same name, if any (a QDQ Conv keeps its name, its inputs come from DequantizeLinear)."""
        stack = [self.writer[o] for o in node.output if o in self.writer]
        if node.name in self.named:
            stack.append(self.named[node.name])
        seen: set[int] = set()
        order: list[int] = []
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            order.append(k)
            stack += [self.writer[i] for i in self.nodes[k].input if i in self.writer and i not in self.source_tensors]
        return order

    def _new_integer(self, name: str) -> bool:
        t = self.reduced_inits.get(name)
        return t is not None and t.data_type in _INT_TYPES and name not in self.source_inits

    def quantized(self, node: onnx.NodeProto) -> bool:
        """Whether the reduced graph computes `node` through a quantizer's operator or integer weight."""
        return any(_quantizing(self.nodes[k]) or any(self._new_integer(i) for i in self.nodes[k].input)
                   for k in self.lineage(node))

    def weights(self, node: onnx.NodeProto) -> int:
        """Bytes (as stored in the source) of the float initializers `node` reads that the reduced graph no longer
        holds in their source type: what keeping `node` in float keeps in float."""
        total = 0
        for i in dict.fromkeys(node.input):
            t = self.source_inits.get(i)
            if t is None or t.data_type not in _FLOAT_TYPES:
                continue
            r = self.reduced_inits.get(i)
            if r is None or r.data_type != t.data_type:
                total += math.prod(t.dims) * _np_itemsize(t.data_type)
        return total


def changed_nodes(source: onnx.ModelProto, reduced: onnx.ModelProto, precision: str | PrecisionRule,
                  opts: config.PrecisionOptions) -> list[onnx.NodeProto]:
    """The source nodes the precision step changed (and may be kept in float; `opts`: the precision's options)."""
    if precisions.rule(precision).quantizer is Quantizer.FP16:
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

        assert isinstance(opts, config.Fp16)
        blocked = set(DEFAULT_OP_BLOCK_LIST) | set(opts.op_block_list)
        return [n for s in scopes(source.graph) for n in s.graph.node  # its block lists hold inside bodies too
                if n.name and n.op_type not in blocked and n.name not in opts.node_block_list and n.op_type != "Cast"]
    assert isinstance(opts, config.Quantization | config.Int4)
    out = []
    for src, red in scope_pairs(source, reduced):  # ORT's quantizers honour exclude_nodes inside bodies too
        rw = Rewrites(src, red)
        out += [n for n in src.graph.node if n.name and n.name not in opts.exclude_nodes and rw.quantized(n)]
    return out


def samples(feed: data.Feed, model: onnx.ModelProto | None = None) -> list[data.Feed]:
    """The feed one sample at a time (its inputs sliced along their first axis), where every input has that axis
    with the same length, more than 1, and `model` (where given) leaves it free (a symbolic batch); else the feed
    whole."""
    lengths = {v.shape[0] if isinstance(v, np.ndarray) and v.ndim else -1 for v in feed.values()}
    if len(lengths) != 1 or (n := lengths.pop()) <= 1:
        return [feed]
    for i in model.graph.input if model is not None else ():
        dims = i.type.tensor_type.shape.dim
        if i.name in feed and dims and dims[0].HasField("dim_value"):  # a fixed batch: the feed runs whole
            return [feed]
    return [{k: v[i:i + 1] for k, v in feed.items()} for i in range(n)]


def joined(feeds: Sequence[data.Feed]) -> data.Feed:
    """Samples (`samples`) as one feed again."""
    return feeds[0] if len(feeds) == 1 else {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}


class Errors:
    """Each tensor's relative L2 error against fp32 over the samples seen so far, kept as sums of squares: one
    sample's tensors in memory at a time, the same error as over the samples joined (rel_error)."""

    def __init__(self) -> None:
        self.diff: dict[str, float] = {}
        self.ref: dict[str, float] = {}

    def add(self, got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> None:
        for n in ref.keys() & got.keys():
            diff2, ref2 = _squares(got[n], ref[n])
            self.diff[n] = self.diff.get(n, 0.0) + diff2
            self.ref[n] = self.ref.get(n, 0.0) + ref2

    def errors(self) -> dict[str, float]:
        return {n: _relative(d, self.ref[n]) for n, d in self.diff.items()}


def layerwise(source: onnx.ModelProto, reduced: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
              feed: data.Feed | Sequence[data.Feed], custom_ops: Sequence[config.CustomOps] = (),
              more: Callable[[], bool] = lambda: True) -> list[Layer]:
    """The changed nodes' errors against fp32, most harmful first (by error added, then by error). A node inside
    an If/Loop/Scan body has no measured error (a body's tensors cannot be made outputs of the model): those come
    after the measured ones, by the weights they keep in float. `feed`: one feed, or samples run one at a time
    (memory: one sample's tensors), the first always, each next one while `more()` says so."""
    feeds = [feed] if isinstance(feed, dict) else list(feed)
    names = [o for n in source.graph.node for o in n.output if o]
    ref_session, got_session = _exposed(source, names, custom_ops), _exposed(reduced, names, custom_ops)
    acc = Errors()
    for i, f in enumerate(feeds):
        if i and not more():
            break
        acc.add(_run(*got_session, f), _run(*ref_session, f))
    err = acc.errors()
    feed = feeds[0]
    # a tensor the precision step hands to another node (QDQ folds a Relu into its Conv, which then writes the
    # Relu's output name, before the activation) is no measure of the node that wrote it in the source
    source_names = {n.name for n in source.graph.node}
    writer = {o: n.name for n in reduced.graph.node for o in n.output}
    rw = Rewrites(source, reduced)
    inside = {n.name: (s, r) for s, r in scope_pairs(source, reduced) if s.key for n in s.graph.node if n.name}
    ran = executed(source, feed, custom_ops) if any(n.name in inside for n in nodes) else set()
    if not ran & (source_names - {""}):  # a profile that names no node of the main graph is no guide: all of them run
        ran = {n.name for s, _ in scope_pairs(source, reduced) for n in s.graph.node}
    layers = []
    for n in nodes:
        if n.name in inside:
            s, r = inside[n.name]
            runs = n.name in ran
            layers.append(Layer(n.name, n.op_type, None, 0.0, Rewrites(s, r).weights(n),
                                f"n/a (inside {s.where}: " + ("not measured)" if runs else
                                                              "not run on the golden inputs, not searched)"),
                                ran=runs))
            continue
        handed = [o for o in n.output if o in writer and writer[o] in source_names and writer[o] != n.name]
        outs = [err[o] for o in n.output if o in err and o not in handed]
        e_out = max(outs) if outs else None
        note = ""
        if e_out is None:
            if handed:
                note = f"n/a (the reduced graph computes its output in {writer[handed[0]]})"
            elif not any(o in writer for o in n.output):
                note = "n/a (the reduced graph does not compute its output)"
            else:
                note = "n/a (no float output)"
        e_in = max((err[i] for i in n.input if i in err), default=0.0)
        if e_out is None:
            added = 0.0
        elif math.isinf(e_out):
            added = 0.0 if math.isinf(e_in) else math.inf
        else:
            added = max(0.0, e_out - e_in)
        layers.append(Layer(n.name, n.op_type, e_out, added, rw.weights(n), note))
    return sorted(layers, key=_layerwise_rank)


def _layerwise_rank(x: Layer) -> tuple[bool, float, float, int, str]:
    """Measured: by the error added, then the error; unmeasured, after them: by the weights kept in float; nodes
    the golden inputs do not run last."""
    return (not x.ran, -x.added, -(x.error if x.error is not None else -1.0), -x.weights if x.error is None else 0,
            x.node)


def ranked(layers: Sequence[Layer]) -> list[Layer]:
    """The search's order: the predicted candidates by the outputs' error with each kept in float alone (lowest
    first), then the others by their layer-wise error."""
    predicted = sorted((x for x in layers if x.alone is not None),
                       key=lambda x: (x.alone.error if x.alone is not None else 0.0, x.weights, x.node))
    return predicted + sorted((x for x in layers if x.alone is None), key=_layerwise_rank)


def graph_digest(model: onnx.ModelProto) -> str:
    """The identity of a precision step's output: its graph (nodes, weights, values), serialized deterministically."""
    return hashlib.sha256(model.graph.SerializeToString(deterministic=True)).hexdigest()
