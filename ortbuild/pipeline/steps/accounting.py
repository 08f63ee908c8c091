"""What a precision step changed: weights by element type, and the reduced-precision ops it wrote.

Every graph is counted, the bodies of If/Loop/Scan nodes included, and weights are initializers and the
values of Constant nodes alike (exporters such as spox and torch's keep weights in Constant nodes inside
subgraphs). Tensors stored as external data are counted from their recorded length, never loaded.

The share converted is measured on the result: the float bytes its reduced weights stand for (int8 x4, fp16 x2)
over those plus the float weights it still holds, so pre-processing that folds weights (and grows them) does not
skew it. A precision step that converted less than MIN_CHANGED of the weights did nothing worth
the name: the build fails the job with the reason and the way out (docs/targets.md, "Precision accounting").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from ortbuild import modelfiles
from ortbuild.artifact import manifest_types

MIN_CHANGED = 0.05  # a precision step must convert at least this share of the weights (Accounting.converted)

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})
REDUCED_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8,
                           onnx.TensorProto.UINT8, onnx.TensorProto.INT4, onnx.TensorProto.UINT4})
# ops that carry or compute in a reduced precision: what ORT's quantizers and converters write
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul",
    "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearSoftmax", "QLinearWhere", "QGemm", "QAttention", "QEmbedLayerNormalization", "MatMulNBits",
    "GatherBlockQuantized", "MatMulIntegerToFloat", "QOrderedMatMul"})


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph inside it (If branches, Loop and Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from graphs(attr.g)
            for g in attr.graphs:
                yield from graphs(g)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read, from the enclosing scope or their own."""
    names: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for n in g.node:
                names.update(n.input)
                names |= subgraph_reads(n)
    return names


def weights(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """name -> (element type, bytes) of every weight of every graph: initializers and Constant values.
    Names are made unique per graph where two subgraphs reuse one (`name@graph`)."""
    out: dict[str, tuple[int, int]] = {}
    for g in graphs(model.graph):
        found = [(i.name, i) for i in g.initializer]
        found += [(n.output[0], a.t) for n in g.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"]
        for name, t in found:
            key = name if name not in out else f"{name}@{g.name}"
            out[key] = (t.data_type, modelfiles.nbytes(t))
    return out


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """Node count per op type over every graph."""
    return Counter(n.op_type for g in graphs(model.graph) for n in g.node)


@dataclass(frozen=True)
class Accounting:
    """What one precision step changed (recorded in the manifest as precision.changed)."""

    ops: dict[str, int]              # reduced-precision ops written, by type (the source's own subtracted)
    tensors: int                     # weights stored in a reduced type, beyond the source's
    float_bytes_before: int          # the source's float weights (fp32/fp64)
    reduced_as_float: int            # the float bytes the result's new reduced-type weights stand for
    float_bytes_after: int           # float weights left in the result
    bytes_before: int                # all weights
    bytes_after: int
    subgraph_ops: int                # of `ops`, how many sit inside If/Loop/Scan bodies
    users: dict[str, int]            # the source's float weight bytes by the op type computing with them

    @property
    def converted(self) -> float:
        """The share of the source's float weight bytes no longer stored as float."""
        total = self.reduced_as_float + self.float_bytes_after
        return self.reduced_as_float / total if total else 0.0

    def as_json(self) -> manifest_types.Changed:
        return {"ops": self.ops, "tensors": self.tensors, "float_bytes_before": self.float_bytes_before,
                "reduced_as_float": self.reduced_as_float,
                "float_bytes_after": self.float_bytes_after, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "subgraph_ops": self.subgraph_ops,
                "converted": round(self.converted, 4)}

    def summary(self) -> str:
        """One line for the build table's notes: '12 ConvInteger, 4 DynamicQuantizeLSTM (16 in subgraphs);
        96% of the float weights converted; weights 2.3 MB -> 0.9 MB'."""
        ops = ", ".join(f"{n} {op}" for op, n in sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0])))
        sub = f" ({self.subgraph_ops} in subgraphs)" if self.subgraph_ops else ""
        return (f"{ops or 'no reduced-precision op'}{sub}; {self.tensors} weight(s) converted, "
                f"{self.converted:.0%} of the float weight bytes; weights {_mb(self.bytes_before)} -> "
                f"{_mb(self.bytes_after)}")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} B"


def _float_bytes(w: dict[str, tuple[int, int]]) -> int:
    return sum(b for dt, b in w.values() if dt in FLOAT_TYPES)


AS_FLOAT: dict[int, int] = {onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 4,
                            onnx.TensorProto.UINT8: 4, onnx.TensorProto.INT4: 8, onnx.TensorProto.UINT4: 8}


def _as_float(w: dict[str, tuple[int, int]]) -> int:
    """The fp32 bytes the reduced-type weights stand for (packed int4 in uint8 counts as int8: a lower bound)."""
    return sum(b * AS_FLOAT[dt] for dt, b in w.values() if dt in AS_FLOAT and b > 16)


def _reduced(w: dict[str, tuple[int, int]]) -> int:
    return sum(1 for dt, b in w.values() if dt in REDUCED_TYPES and b > 16)  # scales/zero points aside


def _in_subgraphs(model: onnx.ModelProto) -> int:
    """Reduced-precision ops inside If/Loop/Scan bodies."""
    main = sum(1 for n in model.graph.node if n.op_type in QUANTIZED_OPS)
    return sum(n for op, n in op_counts(model).items() if op in QUANTIZED_OPS) - main


@dataclass(frozen=True)
class Snapshot:
    """What accounting needs of the source, taken before a converter (some modify their input in place)."""

    weights: dict[str, tuple[int, int]]
    ops: Counter[str]
    in_subgraphs: int
    users: dict[str, int]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> Snapshot:
        return cls(weights(model), op_counts(model), _in_subgraphs(model), weight_users(model))


def account(source: Snapshot, result: onnx.ModelProto) -> Accounting:
    """Compare the source with a precision step's result (loaded without external data, or with it)."""
    w0, w1 = source.weights, weights(result)
    before, after = source.ops, op_counts(result)
    ops = {op: after[op] - before.get(op, 0) for op in sorted(QUANTIZED_OPS) if after[op] > before.get(op, 0)}
    return Accounting(ops=ops, tensors=max(0, _reduced(w1) - _reduced(w0)), float_bytes_before=_float_bytes(w0),
                      reduced_as_float=max(0, _as_float(w1) - _as_float(w0)),
                      float_bytes_after=_float_bytes(w1), bytes_before=sum(b for _, b in w0.values()),
                      bytes_after=sum(b for _, b in w1.values()),
                      subgraph_ops=max(0, _in_subgraphs(result) - source.in_subgraphs), users=source.users)


def already_reduced(model: onnx.ModelProto | Snapshot) -> str | None:
    """Why the model is already quantized or half precision (None: it is not): its quantized ops, and the
    share of its weight bytes stored in a reduced type."""
    snap = model if isinstance(model, Snapshot) else Snapshot(weights(model), op_counts(model), 0, {})
    ops = {op: n for op, n in snap.ops.items() if op in QUANTIZED_OPS}
    w = snap.weights
    total = sum(b for _, b in w.values())
    reduced = sum(b for dt, b in w.values() if dt in REDUCED_TYPES)
    share = reduced / total if total else 0.0
    if not ops and share < 0.5:
        return None
    shown = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:4])
    return (f"{shown or 'no quantized op'}; {share:.0%} of its weight bytes are int8/int4/fp16"
            if ops else f"{share:.0%} of its weight bytes are int8/int4/fp16")


MOVES = frozenset({"Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Transpose", "Cast", "Identity",
                   "Split", "Flatten", "Expand"})  # ops that only move weights on their way to an op


def weight_users(model: onnx.ModelProto) -> dict[str, int]:
    """Float weight bytes by the op type that computes with them (followed through Slice, Concat, Reshape ...
    and into If/Loop/Scan bodies), largest first: where the weights sit, for the user to name in op_types."""
    floats: dict[str, int] = {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for g in graphs(model.graph):
        floats |= {i.name: modelfiles.nbytes(i) for i in g.initializer if i.data_type in FLOAT_TYPES}
        floats |= {n.output[0]: modelfiles.nbytes(a.t) for n in g.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value" and a.t.data_type in FLOAT_TYPES}
        for n in g.node:
            for x in set(n.input):
                readers.setdefault(x, []).append(n)
    out: Counter[str] = Counter()
    for name, size in floats.items():
        if size <= 1024:
            continue
        seen, todo, users = {name}, [name], set()
        while todo:
            for n in readers.get(todo.pop(), []):
                if n.op_type in MOVES:
                    new = [o for o in n.output if o and o not in seen]
                    seen.update(new)
                    todo += new
                else:
                    users.add(n.op_type)
        for op in users:
            out[op] += size
    return dict(out.most_common())
