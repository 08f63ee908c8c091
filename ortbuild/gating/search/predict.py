"""Predictions of `ortbuild test --explain` (step 3): a candidate set kept in float judged without a rebuild, the
precision step's output patched with the set's source nodes and run on the golden inputs (main graph only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from ortbuild.gating.measure import compare
from ortbuild.gating.records import Rule
from ortbuild.gating.search.layerwise import Prediction, rel_error, session_of
from ortbuild.pipeline.steps import accounting
from ortbuild.project import config, data


class Proxy:
    """Predicts a candidate set without a rebuild: the precision step's output with the set's nodes put back in
    float (each node of `source`, the float graph the converter reads, in place of what the quantizer wrote for
    it, with its float weights; what no longer feeds an output is removed), run on the golden inputs (CPU provider,
    no optimization) and judged by the gate's rule against `expected` (the source model's outputs). No prediction
    (None) where a node cannot be put back (its inputs are gone from the reduced graph, or it sits inside an
    If/Loop/Scan body, which it does not patch) or ORT refuses the graph."""

    def __init__(self, source: onnx.ModelProto, reduced: onnx.ModelProto, feed: data.Feed,
                 expected: Mapping[str, object], rule: Callable[[str], Rule],
                 custom_ops: Sequence[config.CustomOps] = ()) -> None:
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

    def patchable(self, node: str) -> bool:
        """Whether `node` is one the predictor can put back at all: a node of the main graph (not of an
        If/Loop/Scan body)."""
        return node in self.source_nodes

    def model(self, keep: Sequence[str]) -> onnx.ModelProto | None:
        """The reduced graph with the nodes `keep` in float, or None where they cannot be put back (a node inside
        an If/Loop/Scan body among them)."""
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
            values = session_of(m, self.custom_ops).run(self.outputs, dict(self.feed))
        except Exception:  # ORT refusing the patched graph (any of its error types): no prediction
            return None
        got = dict(zip(self.outputs, values, strict=True))
        results = [compare.compare(o, "predicted", self.expected[o], got[o], self.rule(o)) for o in self.outputs]
        errors = [rel_error(got[o], self.expected[o]) for o in self.outputs
                  if not self.rule(o).get("ignore") and isinstance(e := self.expected[o], np.ndarray)
                  and e.dtype.kind == "f"]
        return Prediction(all(r.passed for r in results), max(errors, default=0.0), compare.worst_metric(results))
