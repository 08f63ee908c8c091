"""Precision bisection (`ortbuild test --explain`): which nodes break the accuracy of an fp16, int8 or int4
artifact, and the `[[targets.X.overrides]]` table that fixes it.

1. Candidates: the nodes the precision step actually changed. int8/int4: the nodes of the float graph the
   quantizer reads (int8: after its pre-processing) whose outputs the reduced graph now computes through
   quantized operators or quantized weights (MatMul -> MatMulInteger or MatMulNBits, a Gather over a quantized
   embedding table, QDQ pairs); nodes the pre-processing only folded away (Constant, Shape, Unsqueeze ...) are
   not candidates, and those it renamed (no name in the source, so no `exclude_nodes` entry) are reported, not
   searched. fp16: the nodes outside the block lists.
2. Layer-wise error: that float graph (fp32) and the precision step's output run side by side on the golden
   inputs with every node output exposed (CPU provider, no optimization). Each candidate gets the relative L2
   error of its outputs against fp32 and the error it adds to its inputs' error.
3. Prediction (int8, int4): each candidate is put back in float in the reduced graph (the source node in place
   of what the quantizer wrote for it), the model run on the golden inputs and judged by the gate's rule against
   fp32, without a rebuild. Candidates are ranked by the outputs' error so predicted; the fewest top-ranked ones
   predicted to pass, made smaller one node at a time on predictions, are the first set rebuilt.
4. The search rebuilds and re-tests: each candidate set runs the real build pipeline into a scratch directory
   and the real accuracy gate through the generated loader. A set whose precision step gives a graph already
   tried (the failing artifact's included) is not rebuilt. Without a passing prediction (fp16 always): op types
   first, ranked, one at a time (fp16: `op_block_list`; int8/int4: their nodes in `exclude_nodes`); if none
   passes alone, the top-ranked op types together. A passing set is then bisected to fewer nodes
   (`node_block_list` / `exclude_nodes`): halves, then one node at a time.
5. The smallest passing candidate gets the full gate (accuracy, size, latency). Its override is printed,
   checked by parsing targets.toml with it appended (the printed table yields the settings tested), and
   recorded in the test report.
Bounded by a number of rebuilds and seconds; progress per rebuild. ORT's converters are not monotonic (the
fp16 converter casts to fp16 between two blocked nodes), so every answer is one that was built and passed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from ortbuild import workspace
from ortbuild.errors import OrtbuildError
from ortbuild.gating import compare
from ortbuild.gating.gates import PASS, Tester, TestResult
from ortbuild.pipeline.build import BUILT, Builder, Progress
from ortbuild.pipeline.steps import accounting
from ortbuild.project import config, data, options
from ortbuild.project.plan import Job


@dataclass(frozen=True)
class Knob:
    """Where a precision keeps nodes in float: its options table and keys."""

    table: str
    nodes: str                       # node names kept in float
    op_types: str | None             # op types kept in float (None: op types are written as their nodes)


KNOBS = {"fp16": Knob("fp16", "node_block_list", "op_block_list"),
         "int8-dynamic": Knob("quantization", "exclude_nodes", None),
         "int8-static": Knob("quantization", "exclude_nodes", None),
         "int4-weight": Knob("int4", "exclude_nodes", None)}

# The operators ORT's quantizers write (QOperator, QDQ, dynamic, int4): a source node whose outputs the reduced
# graph computes through one of them, or through a weight they made integer, was quantized.
QUANT_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM", "MatMulNBits",
    "QEmbedLayerNormalization", "GatherBlockQuantized", "MatMulBnb4"})
# an op type no quantizer knows: the int8 path with it quantizes nothing (the graph the quantizer reads)
NOTHING = "ortbuild.gating.explain.NoSuchOp"
_INT_TYPES = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4,
                        TensorProto.INT16, TensorProto.UINT16})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})


@dataclass(frozen=True)
class Prediction:
    """A candidate judged without a rebuild (see Proxy)."""

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


def _rel(got: Any, ref: Any) -> float:
    a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape or (np.isfinite(b).all() and not np.isfinite(a).all()):
        return math.inf
    norm = float(np.linalg.norm(b.ravel()))
    diff = float(np.linalg.norm((a - b).ravel()))
    return diff / norm if norm > 0 else diff


def _session(model: onnx.ModelProto, custom_ops: Sequence[config.CustomOps]) -> Any:
    """A session on `model`: CPU provider, no optimization (the graph as written)."""
    from ortbuild import runtime

    ort = runtime.import_ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runtime.register_custom_ops(so, custom_ops)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _outputs_of(model: onnx.ModelProto, names: Sequence[str], feed: data.Feed,
                custom_ops: Sequence[config.CustomOps] = ()) -> dict[str, Any]:
    """The values of the tensors `names` (those the graph computes) on `feed`: CPU provider, no optimization."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o for n in m.graph.node for o in n.output} | {o.name for o in m.graph.output}
    present = [n for n in names if n in have]
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in present if n not in known)
    values = _session(m, custom_ops).run(present, dict(feed))
    return {n: v for n, v in zip(present, values, strict=True)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f"}


def _quantizing(node: onnx.NodeProto) -> bool:
    return node.op_type in QUANT_OPS or node.op_type.startswith("QLinear")


def _np_itemsize(data_type: int) -> int:
    return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)


class Rewrites:
    """How the precision step rewrote the source graph: for each source node, the nodes of the reduced graph that
    now compute its outputs, found by walking back from them through the tensors the source does not have (a
    quantizer's own tensors: `x_quantized`, scales, `MatMul_output_0_output_quantized`)."""

    def __init__(self, source: onnx.ModelProto, reduced: onnx.ModelProto) -> None:
        g, r = source.graph, reduced.graph
        self.source_tensors = ({i.name for i in g.input} | {i.name for i in g.initializer}
                               | {o for n in g.node for o in n.output})
        self.source_inits = {i.name: i for i in g.initializer}
        self.reduced_inits = {i.name: i for i in r.initializer}
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


def changed_nodes(source: onnx.ModelProto, reduced: onnx.ModelProto, precision: str,
                  opts: Any) -> list[onnx.NodeProto]:
    """The source nodes the precision step changed (and may be kept in float)."""
    if precision == "fp16":
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

        blocked = set(DEFAULT_OP_BLOCK_LIST) | set(opts.op_block_list)
        return [n for n in source.graph.node
                if n.name and n.op_type not in blocked and n.name not in opts.node_block_list and n.op_type != "Cast"]
    rw = Rewrites(source, reduced)
    return [n for n in source.graph.node if n.name and n.name not in opts.exclude_nodes and rw.quantized(n)]


def layerwise(source: onnx.ModelProto, reduced: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
              feed: data.Feed, custom_ops: Sequence[config.CustomOps] = ()) -> list[Layer]:
    """The changed nodes' errors against fp32, most harmful first (by error added, then by error)."""
    names = [o for n in source.graph.node for o in n.output if o]
    ref = _outputs_of(source, names, feed, custom_ops)
    got = _outputs_of(reduced, names, feed, custom_ops)
    err = {n: _rel(got[n], ref[n]) for n in names if n in got and n in ref}
    # a tensor the precision step hands to another node (QDQ folds a Relu into its Conv, which then writes the
    # Relu's output name, before the activation) is no measure of the node that wrote it in the source
    source_names = {n.name for n in source.graph.node}
    writer = {o: n.name for n in reduced.graph.node for o in n.output}
    rw = Rewrites(source, reduced)
    layers = []
    for n in nodes:
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


def _layerwise_rank(x: Layer) -> tuple[float, float, str]:
    return -x.added, -(x.error if x.error is not None else -1.0), x.node


def ranked(layers: Sequence[Layer]) -> list[Layer]:
    """The search's order: the predicted candidates by the outputs' error with each kept in float alone (lowest
    first), then the others by their layer-wise error."""
    predicted = sorted((x for x in layers if x.alone is not None),
                       key=lambda x: (x.alone.error if x.alone is not None else 0.0, x.weights, x.node))
    return predicted + sorted((x for x in layers if x.alone is None), key=_layerwise_rank)


class Proxy:
    """Predicts a candidate set without a rebuild: the precision step's output with the set's nodes put back in
    float (each node of `source`, the float graph the converter reads, in place of what the quantizer wrote for
    it, with its float weights; what no longer feeds an output is removed), run on the golden inputs (CPU provider,
    no optimization) and judged by the gate's rule against `expected` (the source model's outputs). No prediction
    (None) where a node cannot be put back (its inputs are gone from the reduced graph) or ORT refuses the graph."""

    def __init__(self, source: onnx.ModelProto, reduced: onnx.ModelProto, feed: data.Feed, expected: dict[str, Any],
                 rule: Callable[[str], dict[str, Any]], custom_ops: Sequence[config.CustomOps] = ()) -> None:
        self.reduced, self.feed, self.expected, self.rule, self.custom_ops = reduced, feed, expected, rule, custom_ops
        self.source_nodes = {n.name: n for n in source.graph.node if n.name}
        self.source_inits = {i.name: i for i in source.graph.initializer}
        self.constants = {o: n for n in source.graph.node if n.op_type == "Constant" for o in n.output}
        self.source_writer = {o: n.name for n in source.graph.node for o in n.output}
        self.outputs = [o.name for o in reduced.graph.output if o.name in expected]
        opset = {o.domain or "ai.onnx": o.version for o in reduced.opset_import}
        self.opsets = [o for o in source.opset_import if (o.domain or "ai.onnx") not in opset]
        # a node put back runs under the reduced graph's opset: where the quantizer upgraded it, no prediction
        self.usable = all(opset.get(o.domain or "ai.onnx", o.version) == o.version for o in source.opset_import)

    def model(self, keep: Sequence[str]) -> onnx.ModelProto | None:
        """The reduced graph with the nodes `keep` in float, or None where they cannot be put back."""
        if not self.usable:
            return None
        m = onnx.ModelProto()
        m.CopyFrom(self.reduced)
        g = m.graph
        nodes = list(g.node)
        writer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        inits = {i.name: i for i in g.initializer}
        drop: set[int] = set()
        extra: list[onnx.NodeProto] = []
        for name in keep:
            n = self.source_nodes.get(name)
            if n is None:
                return None
            heads = {writer[o] for o in n.output if o in writer}
            if not heads:  # the reduced graph computes none of its outputs (folded into another node)
                return None
            for i in n.input:  # an input the reduced graph computes in another source node (QDQ folds a Relu
                # into its Conv, which writes the Relu's output name before the activation) is not that tensor
                w = nodes[writer[i]].name if i in writer else None
                if w is not None and w in self.source_nodes and w != self.source_writer.get(i):
                    return None
            drop |= heads
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = f"{n.name}/kept_in_float"
            extra.append(c)
        produced = ({i.name for i in g.input} | set(inits) | {o for c in extra for o in c.output}
                    | {o for k, n in enumerate(nodes) if k not in drop for o in n.output})
        added_inits: dict[str, onnx.TensorProto] = {}
        for c in list(extra):
            for i in c.input:
                if not i or i in produced or i in added_inits:
                    if i in inits and i in self.source_inits and inits[i].data_type != self.source_inits[i].data_type:
                        return None  # the reduced graph holds another tensor under the weight's name
                    continue
                if i in self.source_inits:
                    added_inits[i] = self.source_inits[i]
                elif i in self.constants:
                    const = onnx.NodeProto()
                    const.CopyFrom(self.constants[i])
                    const.name = f"{const.name or i}/kept_in_float"
                    extra.append(const)
                    produced.update(const.output)
                else:
                    return None
        kept = [n for k, n in enumerate(nodes) if k not in drop] + extra
        del g.node[:]
        g.node.extend(kept)
        g.initializer.extend(added_inits.values())
        m.opset_import.extend(self.opsets)
        from ortbuild.pipeline.steps import precision

        try:
            precision.toposort(m)
        except ValueError:
            return None
        used = {o.name for o in g.output}
        live: list[onnx.NodeProto] = []
        for n in reversed(g.node):  # what still feeds an output (subgraph nodes are kept)
            reads = accounting.subgraph_reads(n)
            if reads or any(o in used for o in n.output):
                live.append(n)
                used |= set(n.input) | reads
        live.reverse()
        have = {i.name for i in g.input} | {i.name for i in g.initializer} | {o for n in live for o in n.output}
        if not all(i in have for n in live for i in n.input if i):
            return None
        del g.node[:]
        g.node.extend(live)
        for k in reversed([k for k, t in enumerate(g.initializer) if t.name not in used]):
            del g.initializer[k]
        return m

    def predict(self, keep: Sequence[str]) -> Prediction | None:
        m = self.model(keep)
        if m is None:
            return None
        try:
            values = _session(m, self.custom_ops).run(self.outputs, dict(self.feed))
        except Exception:  # ORT refusing the patched graph (any of its error types): no prediction
            return None
        got = dict(zip(self.outputs, values, strict=True))
        results = [compare.compare(o, "predicted", self.expected[o], got[o], self.rule(o)) for o in self.outputs]
        errors = [_rel(got[o], self.expected[o]) for o in self.outputs
                  if not self.rule(o).get("ignore") and isinstance(self.expected[o], np.ndarray)
                  and self.expected[o].dtype.kind == "f"]
        return Prediction(all(r.passed for r in results), max(errors, default=0.0), compare.worst_metric(results))


def graph_digest(model: onnx.ModelProto) -> str:
    """The identity of a precision step's output: its graph (nodes, weights, values), serialized deterministically."""
    return hashlib.sha256(model.graph.SerializeToString(deterministic=True)).hexdigest()


def settings_with(settings: config.Settings, knob: Knob, nodes: Sequence[str], op_types: Sequence[str]) \
        -> config.Settings:
    """The settings with `nodes` (and `op_types`) kept in float, added to the target's own lists."""
    opts = getattr(settings, knob.table)
    changes: dict[str, Any] = {knob.nodes: tuple(dict.fromkeys([*getattr(opts, knob.nodes), *nodes]))}
    if knob.op_types is not None and op_types:
        changes[knob.op_types] = tuple(dict.fromkeys([*getattr(opts, knob.op_types), *op_types]))
    return dataclasses.replace(settings, **{knob.table: dataclasses.replace(opts, **changes)})


def override_toml(job: Job, knob: Knob, settings: config.Settings) -> str:
    """The `[[targets.X.overrides]]` table that gives the job `settings`' knob lists (lists are replaced by an
    override, so the target's own entries are repeated)."""
    opts, base = getattr(settings, knob.table), getattr(job.settings, knob.table)
    keys = [k for k in (knob.op_types, knob.nodes) if k is not None and getattr(opts, k) != getattr(base, k)]
    items = ", ".join(f"{k} = {json.dumps(list(getattr(opts, k)))}" for k in keys)
    return (f"[[targets.{job.target.name}.overrides]]\nmodels = {json.dumps([job.model.name])}\n"
            f"{knob.table} = {{ {items} }}\n")


def check_override(project: config.Project, job: Job, text: str, expected: config.Settings) -> None:
    """Parse targets.toml with `text` appended: the model's settings must be those that were tested."""
    original = project.file.read_text(encoding="utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".ortbuild-explain-", suffix=".toml", dir=project.file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(original.rstrip("\n") + "\n\n" + text)
        parsed = config.load(tmp).targets[job.target.name].settings[job.model.name]
    finally:
        os.unlink(tmp)
    if parsed != expected:
        raise AssertionError(f"the printed override does not yield the tested settings: {parsed} != {expected}")


def _what(nodes: Sequence[str], op_types: Sequence[str]) -> str:
    return (f"op types {', '.join(op_types)}" if op_types else
            f"{len(nodes)} node(s) {', '.join(nodes[:6])}{' ...' if len(nodes) > 6 else ''}")


@dataclass
class Trial:
    nodes: list[str]
    op_types: list[str]
    passed: bool
    worst: str
    seconds: float

    def describe(self) -> str:
        return f"{_what(self.nodes, self.op_types)}: {'PASS' if self.passed else 'FAIL'} ({self.worst})"


@dataclass
class Search:
    """The bounded search over candidate sets; every trial is a rebuild and a re-test.

    graph: the digest of the precision step's output for a candidate set (graph_digest); a set whose graph was
    tried already (`graphs`, the failing artifact's included as -1) is not rebuilt and takes that verdict.
    predict: judges a set of nodes without a rebuild (Proxy.predict); with it, the first set rebuilt is the
    fewest top-ranked candidates predicted to pass."""

    trial: Callable[[list[str], list[str]], tuple[bool, str]]
    max_rebuilds: int
    max_seconds: float
    progress: Callable[[str], None]
    graph: Callable[[list[str], list[str]], str] | None = None
    predict: Callable[[list[str]], Prediction | None] | None = None
    trials: list[Trial] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)   # sets not rebuilt: the same graph as `same_as`
    graphs: dict[str, int] = field(default_factory=dict)          # digest -> index of its trial (-1: the artifact)
    predicted: dict[frozenset[str], bool] = field(default_factory=dict)
    start: float = field(default_factory=time.monotonic)
    stopped: str = ""

    def budget_left(self) -> bool:
        if len(self.trials) >= self.max_rebuilds:
            self.stopped = f"stopped after {self.max_rebuilds} rebuilds (--explain-rebuilds)"
        elif time.monotonic() - self.start >= self.max_seconds:
            self.stopped = f"stopped after {self.max_seconds:g} s (--explain-seconds)"
        return not self.stopped

    def run(self, nodes: list[str], op_types: list[str]) -> bool:
        for t in self.trials:  # a candidate is never built twice
            if (t.nodes, t.op_types) == (nodes, op_types):
                return t.passed
        for s in self.skipped:
            if (s["nodes"], s["op_types"]) == (nodes, op_types):
                return bool(s["passed"])
        digest = None
        if self.graph is not None:
            try:
                digest = self.graph(nodes, op_types)
            except Exception:  # the precision step failing for this set: the rebuild says how, as its verdict
                digest = None
        if digest is not None and digest in self.graphs:  # every rebuild changes the graph
            k = self.graphs[digest]
            passed = k >= 0 and self.trials[k].passed
            same = "the failing artifact" if k < 0 else f"rebuild {k + 1}"
            self.skipped.append({"nodes": nodes, "op_types": op_types, "same_as": same, "passed": passed})
            self.progress(f"explain: not rebuilt: {_what(nodes, op_types)}: the precision step gives the same graph "
                          f"as {same}")
            return passed
        t0 = time.monotonic()
        passed, worst = self.trial(nodes, op_types)
        t = Trial(nodes, op_types, passed, worst, round(time.monotonic() - t0, 2))
        self.trials.append(t)
        if digest is not None:
            self.graphs[digest] = len(self.trials) - 1
        self.progress(f"explain: rebuild {len(self.trials)}/{self.max_rebuilds}: {t.describe()}")
        return passed

    def _predicts_pass(self, nodes: list[str]) -> bool:
        key = frozenset(nodes)
        if key not in self.predicted:
            assert self.predict is not None
            p = self.predict(nodes)
            self.predicted[key] = p is not None and p.passed
        return self.predicted[key]

    def guess(self, order: list[str]) -> list[str] | None:
        """The fewest top-ranked nodes of `order` predicted to pass (prefixes of 1, 2, 4 ... nodes, then halving
        the gap), made smaller one node at a time, the lowest-ranked first; None where no prefix is predicted to
        pass. All of them is no answer (the model in float). Predictions only: no rebuild."""
        top = len(order) - 1
        if top < 1:
            return None
        failing, k = 0, 1
        while True:
            if not self.budget_left():
                return None
            if self._predicts_pass(order[:k]):
                break
            if k >= top:
                return None
            failing, k = k, min(2 * k, top)
        while failing + 1 < k and self.budget_left():
            mid = (failing + k) // 2
            if self._predicts_pass(order[:mid]):
                k = mid
            else:
                failing = mid
        best = order[:k]
        for n in reversed(order[:k]):
            if len(best) <= 1 or not self.budget_left():
                break
            rest = [x for x in best if x != n]
            if self._predicts_pass(rest):
                best = rest
        return best

    def search(self, layers: list[Layer], op_keys: bool) -> tuple[list[str], list[str]] | None:
        """The smallest passing (nodes, op types) found, or None. `layers` in the order of the ranking."""
        if self.predict is not None:
            guess = self.guess([x.node for x in layers if x.alone is not None])
            if guess is not None and self.budget_left() and self.run(guess, []):
                return guess, []
        position: dict[str, int] = {}
        for i, x in enumerate(layers):
            position.setdefault(x.op_type, i)
        groups = sorted(position, key=position.__getitem__)
        members = {o: [x.node for x in layers if x.op_type == o] for o in groups}

        def try_ops(ops: list[str]) -> bool:
            if op_keys:
                return self.run([], ops)
            return self.run([n for o in ops for n in members[o]], [])

        found: list[str] | None = None
        for o in groups:
            if not self.budget_left():
                break
            if try_ops([o]):
                found = [o]
                break
        if found is None and len(groups) > 1 and self.budget_left() and try_ops(groups):
            lo, hi = 1, len(groups)  # the fewest top-ranked op types that pass together
            while lo + 1 < hi and self.budget_left():
                mid = (lo + hi) // 2
                if try_ops(groups[:mid]):
                    hi = mid
                else:
                    lo = mid
            found = groups[:hi]
        if found is None:
            return None
        order = {x.node: i for i, x in enumerate(layers)}
        best = sorted((n for o in found for n in members[o]), key=order.__getitem__)
        narrowed = False
        while len(best) > 1 and self.budget_left():  # bisect the passing set
            half = len(best) // 2
            if self.run(best[:half], []):
                best, narrowed = best[:half], True
            elif self.budget_left() and self.run(best[half:], []):
                best, narrowed = best[half:], True
            else:
                break
        for n in reversed(list(best)):  # then drop single nodes, the least harmful first
            if len(best) <= 1 or not self.budget_left():
                break
            rest = [x for x in best if x != n]
            if self.run(rest, []):
                best, narrowed = rest, True
        if not narrowed and op_keys:
            return [], found  # the op types themselves: the shorter override
        return best, []


@dataclass
class Analysis:
    """The failing artifact's precision step, as the search needs it."""

    layers: list[Layer]
    source: onnx.ModelProto
    reduced: onnx.ModelProto
    feed: data.Feed
    digest: str                      # graph_digest of the precision step's output
    src: Any                         # the check step's result for the source model
    expected: dict[str, Any]         # the source model's outputs on `feed`
    renamed: list[str]               # changed nodes the source has no name for (renamed by pre-processing)


class Explainer:
    """Runs the search for failing jobs of one `ortbuild test`: scratch builds, re-tests, the final gate."""

    def __init__(self, builder: Builder, tester: Tester, *, max_rebuilds: int, max_seconds: float,
                 progress: Callable[[str, str], None]) -> None:
        self.builder = builder
        self.tester = tester
        self.max_rebuilds = max_rebuilds
        self.max_seconds = max_seconds
        self.progress = progress

    def explain(self, job: Job, res: TestResult) -> dict[str, Any]:
        knob = KNOBS.get(job.settings.precision)
        if knob is None:
            return {"status": "not applicable", "reason": f"precision {job.settings.precision}: nothing to keep in "
                                                          "float (only fp16, int8 and int4 are searched)"}
        from ortbuild import modelfiles

        weights = self.builder.model_files(job.model.path).weights_size
        if modelfiles.needs_external_data(weights):
            return {"status": "not run", "reason": f"the model holds {weights / (1 << 30):.2f} GiB of weights: the "
                    "search runs it whole with every layer exposed and rebuilds it per candidate, which a model past "
                    "protobuf's 2 GB limit does not fit; keep layers in float by hand (quantization.exclude_nodes, "
                    "int4.exclude_nodes, fp16.node_block_list) or explain a smaller model of the same architecture"}
        start = time.monotonic()
        self.progress(job.name, "explain: layer-wise error against fp32 on the golden inputs")
        an = analyse(job)
        layers = an.layers
        doc: dict[str, Any] = {"precision": job.settings.precision, "table": knob.table,
                               "layers": _layers_doc(layers), "baseline": {"accuracy": res.accuracy,
                                                                           "worst": res.worst}}
        if an.renamed:
            doc["renamed"] = an.renamed
        if res.accuracy == PASS:
            doc.update(status="passes", reason="the accuracy gate passes: nothing to keep in float")
            return doc
        if not layers:
            doc.update(status="not found", reason="the precision step changed no node that could be kept in float"
                       + (" by a name the source model has" if an.renamed else "") + _in_subgraphs(an.reduced))
            return doc
        predict: Callable[[list[str]], Prediction | None] | None = None
        if knob.table != "fp16":
            layers, predict, doc["predictions"] = self._predict(job, an, start)
            doc["layers"] = _layers_doc(layers)
        with tempfile.TemporaryDirectory(prefix="ortbuild-explain-") as scratch:
            dist = Path(scratch)
            quiet = Progress(quiet=True)  # the search reports per rebuild itself
            builder = Builder(self.builder.project, dist, force=True, progress=quiet, enc_key=self.builder.enc_key,
                              sign_key=self.builder.sign_key)
            tester = Tester(self.tester.project, dist, self.tester.secret, self.tester.config_arg, quiet,
                            self.tester.sign_key)
            tester.golden_cache = self.tester.golden_cache  # the golden data of the model, computed once

            def trial(nodes: list[str], op_types: list[str]) -> tuple[bool, str]:
                tjob = Job(job.target, job.model, settings_with(job.settings, knob, nodes, op_types))
                built = builder.run_job(tjob)
                if built.status != BUILT:
                    return False, f"build {built.status}: {built.reason[:160]}"
                tres = TestResult(job.target.name, job.model.name, job.settings.precision)
                try:
                    tester.accuracy_gate(tjob, tres)
                except OrtbuildError as e:
                    return False, e.message[:160]
                return tres.accuracy == PASS, tres.worst

            def graph(nodes: list[str], op_types: list[str]) -> str:
                return graph_digest(reduce_model(job, settings_with(job.settings, knob, nodes, op_types), an.src))

            search = Search(trial, self.max_rebuilds, self.max_seconds, lambda m: self.progress(job.name, m),
                            graph=graph, predict=predict, graphs={an.digest: -1}, start=start)
            best = search.search(layers, knob.op_types is not None)
            doc["trials"] = [dataclasses.asdict(t) for t in search.trials]
            doc["rebuilds"] = len(search.trials)
            doc["skipped"] = search.skipped
            if best is None:
                doc.update(status="not found", reason=search.stopped or "no candidate set made the gate pass",
                           seconds=round(time.monotonic() - start, 1))
                return doc
            nodes, op_types = best
            settings = settings_with(job.settings, knob, nodes, op_types)
            text = override_toml(job, knob, settings)
            check_override(self.builder.project, job, text, settings)
            final_job = Job(job.target, job.model, settings)
            self.progress(job.name, "explain: the full gate (accuracy, size, latency) of the answer")
            builder.run_job(final_job)
            final = TestResult(job.target.name, job.model.name, job.settings.precision)
            try:
                tester.gate(final_job, final, {})
            except OrtbuildError as e:
                final.fail([e.message])
            doc.update(status="found", nodes=nodes, op_types=op_types, override=text,
                       result={"accuracy": final.accuracy, "worst": final.worst, "size": final.size,
                               "size_verdict": final.size_verdict, "latency_verdict": final.latency_verdict,
                               "p50_ms": final.latency.get("p50_ms"), "p90_ms": final.latency.get("p90_ms"),
                               "failures": final.failures},
                       seconds=round(time.monotonic() - start, 1), stopped=search.stopped)
            return doc

    def _predict(self, job: Job, an: Analysis, start: float) \
            -> tuple[list[Layer], Callable[[list[str]], Prediction | None] | None, dict[str, Any]]:
        """Each candidate kept in float alone, predicted (at most a third of --explain-seconds, the layer-wise
        ranking deciding which go first): the layers in the search's order, the predictor (None where predictions
        cannot be trusted) and what the report says about them."""
        s = job.settings
        gates = s.gates
        assert gates is not None
        t0 = time.monotonic()
        proxy = Proxy(an.source, an.reduced, an.feed, an.expected, lambda o: gates.accuracy_rule(s.precision, o),
                      s.custom_ops)
        base = proxy.predict([])
        if base is None:
            return an.layers, None, {"status": "off", "reason": "the precision step's output cannot be patched here"
                                     if proxy.usable else "the quantizer changed the model's opset"}
        if base.passed:  # the prediction passes where the gate fails: the proxy is no guide for this artifact
            return an.layers, None, {"status": "off", "reason": f"the unpatched prediction passes ({base.worst}) "
                                                                "where the gate fails"}
        self.progress(job.name, f"explain: predicting each of {len(an.layers)} candidate(s) kept in float alone "
                                "(no rebuild)")
        share = self.max_seconds / 3
        layers = []
        for x in an.layers:
            alone = proxy.predict([x.node]) if time.monotonic() - start < share else None
            layers.append(dataclasses.replace(x, alone=alone))
        done = sum(x.alone is not None for x in layers)
        return ranked(layers), proxy.predict, {
            "status": "on", "baseline": base.worst, "predicted": done, "candidates": len(layers),
            "seconds": round(time.monotonic() - t0, 1)}


def reduce_model(job: Job, settings: config.Settings, src: Any, *, converter_input: bool = False) -> onnx.ModelProto:
    """The precision step's output for `settings`, as the build writes it (`src`: the check step's result for
    the model; the fusion step first where it is on). converter_input: the float graph the converter reads
    instead (int8: after the quantizers' pre-processing and opset upgrade, the names `exclude_nodes` means)."""
    from ortbuild.pipeline.steps import precision

    names = [i["name"] for i in src.signature["inputs"]]
    samples = data.load_samples(job.model.calibration, names) \
        if settings.rule.needs_calibration and job.model.calibration is not None and not converter_input else None
    external = src.files.has_external_data
    path, model = job.model.path, onnx.ModelProto()
    model.CopyFrom(src.model)  # the converters change the graph they are given (int4 does, in place)
    opts, prec = settings.typed_precision_options(), settings.precision
    with workspace.private_dir(workspace.temp_need(src.size)) as work:
        if settings.fusion.enabled:  # the precision step reads the fused graph (build.py's fusion step)
            from ortbuild.pipeline.steps import fusion

            fused = fusion.run(path, model, settings.fusion, work, external=external)
            path, model = fused.path, fused.model
        if converter_input:
            if not settings.rule.quantized:  # fp16 and int4 convert the graph they are given
                return onnx.load(str(path))
            # the int8 path with nothing to quantize: the pre-processed, upgraded graph the quantizer reads
            assert isinstance(opts, config.Quantization)
            opts = dataclasses.replace(opts, op_types=(NOTHING,), exclude_nodes=())
            prec = options.INT8_DYNAMIC
        out = precision.run(path, model, prec, opts, work, samples, external=external)
        return onnx.load(str(out.path))


def analyse(job: Job) -> Analysis:
    """The failing artifact's precision step: its candidates and their layer-wise errors."""
    from ortbuild.pipeline.steps import check

    s = job.settings
    src = check.run(job.model.path)
    known = {n.name for n in src.model.graph.node}  # the names the build accepts in exclude_nodes
    names = [i["name"] for i in src.signature["inputs"]]
    feed = data.load_feed(job.model.inputs, names)
    reduced = reduce_model(job, s, src)
    base = reduce_model(job, s, src, converter_input=True)
    # the golden outputs the gate compares with: the source model's, weights loaded
    source = onnx.load(str(job.model.path)) if src.files.has_external_data else src.model
    outputs = [o.name for o in source.graph.output]
    expected = dict(zip(outputs, _session(source, s.custom_ops).run(outputs, dict(feed)), strict=True))
    del source
    nodes = changed_nodes(base, reduced, s.precision, s.typed_precision_options())
    renamed = [n.name for n in nodes if n.name not in known]
    nodes = [n for n in nodes if n.name in known]
    return Analysis(layerwise(base, reduced, nodes, feed, s.custom_ops), base, reduced, feed,
                    graph_digest(reduced), src, expected, renamed)


def _in_subgraphs(reduced: onnx.ModelProto) -> str:
    """What the precision step changed inside If/Loop/Scan bodies, which the layer-wise search does not enter."""
    inside: dict[str, int] = {}
    for g in list(accounting.graphs(reduced.graph))[1:]:  # the bodies, not the main graph
        for n in g.node:
            if n.op_type in QUANT_OPS:
                inside[n.op_type] = inside.get(n.op_type, 0) + 1
    if not inside:
        return ""
    ops = ", ".join(f"{k} {v}" for k, v in sorted(inside.items(), key=lambda kv: -kv[1]))
    return (f"; what it changed sits inside If/Loop/Scan bodies ({ops}), which the layer-wise search does not "
            "enter: keep an op type there in float by naming only the others in quantization.op_types (e.g. "
            "op_types = [\"Conv\"] leaves LSTM in float), and rebuild")


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(f"{x:.4g}")


def _layers_doc(layers: Sequence[Layer]) -> list[dict[str, Any]]:
    out = []
    for x in layers[:20]:
        d: dict[str, Any] = {"node": x.node, "op_type": x.op_type,
                             "error": (x.note or "n/a") if x.error is None else _num(x.error), "added": _num(x.added),
                             "weights": x.weights}
        if x.alone is not None:
            d["alone"] = dataclasses.asdict(x.alone) | {"error": _num(x.alone.error)}
        out.append(d)
    return out


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def _shown(v: Any) -> str:
    """A value in a table: never `None`."""
    return "-" if v is None else str(v)


def render(job_name: str, doc: dict[str, Any]) -> list[str]:
    """What `ortbuild test` prints for one explained job."""
    lines = [f"explain {job_name}: {doc['status']}" + (f": {doc['reason']}" if doc.get("reason") else "")]
    p = doc.get("predictions") or {}
    if p.get("status") == "on":
        lines.append(f"  predicted (no rebuild): {p['predicted']} of {p['candidates']} candidate(s) kept in float "
                     f"alone, {p['seconds']} s; the failing artifact predicted as {p['baseline']}")
    elif p.get("status") == "off":
        lines.append(f"  predictions off: {p['reason']}")
    if doc.get("renamed"):
        names = doc["renamed"]
        lines.append(f"  not searched: {len(names)} quantized node(s) the source model has no name for (the "
                     f"quantizers' pre-processing or the fusion renamed them: {', '.join(names[:3])}"
                     f"{' ...' if len(names) > 3 else ''}); quantization = {{ preprocess = false }} keeps the names")
    for x in doc.get("layers", [])[:5]:
        line = (f"  layer-wise: {x['node']} ({x['op_type']}) error {_shown(x['error'])} vs fp32, "
                f"adds {_shown(x['added'])}")
        if x.get("weights"):
            line += f", {_size(x['weights'])} of weights"
        if x.get("alone"):
            a = x["alone"]
            line += f"; kept in float alone: {a['worst']} ({'PASS' if a['passed'] else 'FAIL'}, predicted)"
        lines.append(line)
    for t in doc.get("trials", []):
        lines.append(f"  rebuild: {Trial(**t).describe()}")
    for s in doc.get("skipped", []):
        lines.append(f"  not rebuilt: {_what(s['nodes'], s['op_types'])}: the same graph as {s['same_as']}")
    if doc.get("status") == "found":
        r = doc["result"]
        size = r.get("size") or {}
        lines.append(f"  result ({doc['rebuilds']} rebuilds, {doc['seconds']} s): accuracy {_shown(r['accuracy'])} "
                     f"({_shown(r['worst'])}), size {size.get('bytes', 0) / 1024:.1f} KB ({size.get('ratio', 0):.2f}x "
                     f"the source, {_shown(r['size_verdict'])}), latency p50 "
                     + (f"{r['p50_ms']:.3f} ms" if isinstance(r["p50_ms"], float) else "-")
                     + f" ({'no budget' if r['latency_verdict'] in ('-', None) else r['latency_verdict']})")
        lines.append("  paste into targets.toml:\n")
        lines += doc["override"].rstrip("\n").splitlines()
        lines.append("")
    return lines
