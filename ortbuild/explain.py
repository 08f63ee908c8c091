"""Precision bisection (`ortbuild test --explain`): which nodes break the accuracy of an fp16, int8 or int4
artifact, and the `[[targets.X.overrides]]` table that fixes it.

1. Layer-wise error: the source model (fp32) and the precision step's output run side by side on the golden
   inputs with every node output exposed (CPU provider, no optimization). Each node the precision changed
   gets the relative L2 error of its outputs against fp32 and the error it adds to its inputs' error.
2. The search rebuilds and re-tests: each candidate runs the real build pipeline into a scratch directory
   and the real accuracy gate through the generated loader. Op types come first, ranked by the error their
   nodes add, one at a time (fp16: `op_block_list`; int8/int4: their nodes in `exclude_nodes`); if none
   passes alone, the top-ranked op types together. A passing set is then bisected to fewer nodes
   (`node_block_list` / `exclude_nodes`): halves, then one node at a time.
3. The smallest passing candidate gets the full gate (accuracy, size, latency). Its override is printed,
   checked by parsing targets.toml with it appended (the printed table yields the settings tested), and
   recorded in the test report.
Bounded by a number of rebuilds and seconds; progress per rebuild. ORT's converters are not monotonic (the
fp16 converter casts to fp16 between two blocked nodes), so every answer is one that was built and passed.
"""

from __future__ import annotations

import dataclasses
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

from . import config, data, workspace
from .build import BUILT, Builder, Progress
from .errors import OrtbuildError
from .gates import PASS, Tester, TestResult
from .plan import Job


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


@dataclass(frozen=True)
class Layer:
    node: str
    op_type: str
    error: float | None              # relative L2 error of its outputs against fp32 (inf: non-finite)
    added: float                     # what it adds to the largest error of its inputs


def _rel(got: Any, ref: Any) -> float:
    a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape or (np.isfinite(b).all() and not np.isfinite(a).all()):
        return math.inf
    norm = float(np.linalg.norm(b.ravel()))
    diff = float(np.linalg.norm((a - b).ravel()))
    return diff / norm if norm > 0 else diff


def _outputs_of(model: onnx.ModelProto, names: Sequence[str], feed: data.Feed,
                custom_ops: Sequence[config.CustomOps] = ()) -> dict[str, Any]:
    """The values of the tensors `names` (those the graph computes) on `feed`: CPU provider, no optimization."""
    from . import runtime

    ort = runtime.import_ort()

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o for n in m.graph.node for o in n.output} | {o.name for o in m.graph.output}
    present = [n for n in names if n in have]
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in present if n not in known)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    runtime.register_custom_ops(so, custom_ops)
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values = sess.run(present, dict(feed))
    return {n: v for n, v in zip(present, values, strict=True)
            if isinstance(v, np.ndarray) and v.dtype.kind == "f"}


def changed_nodes(source: onnx.ModelProto, reduced: onnx.ModelProto, precision: str,
                  opts: Any) -> list[onnx.NodeProto]:
    """The source nodes the precision step changed (and may be kept in float)."""
    if precision == "fp16":
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

        blocked = set(DEFAULT_OP_BLOCK_LIST) | set(opts.op_block_list)
        return [n for n in source.graph.node
                if n.name and n.op_type not in blocked and n.name not in opts.node_block_list and n.op_type != "Cast"]
    by_name = {n.name: n for n in reduced.graph.node}
    producer = {o: n.op_type for n in reduced.graph.node for o in n.output}
    only = set(getattr(opts, "op_types", ()) or ())
    out = []
    for n in source.graph.node:
        if not n.name or n.name in opts.exclude_nodes or (only and n.op_type not in only):
            continue
        r = by_name.get(n.name)
        if r is None or r.op_type != n.op_type or any(producer.get(i) == "DequantizeLinear" for i in r.input):
            out.append(n)
    return out


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
    layers = []
    for n in nodes:
        outs = [err[o] for o in n.output if o in err and not (writer.get(o, n.name) in source_names
                                                              and writer.get(o) != n.name)]
        e_out = max(outs) if outs else None
        e_in = max((err[i] for i in n.input if i in err), default=0.0)
        if e_out is None:
            added = 0.0
        elif math.isinf(e_out):
            added = 0.0 if math.isinf(e_in) else math.inf
        else:
            added = max(0.0, e_out - e_in)
        layers.append(Layer(n.name, n.op_type, e_out, added))
    return sorted(layers, key=lambda x: (-x.added, -(x.error if x.error is not None else -1.0), x.node))


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


@dataclass
class Trial:
    nodes: list[str]
    op_types: list[str]
    passed: bool
    worst: str
    seconds: float

    def describe(self) -> str:
        what = (f"op types {', '.join(self.op_types)}" if self.op_types else
                f"{len(self.nodes)} node(s) {', '.join(self.nodes[:6])}{' ...' if len(self.nodes) > 6 else ''}")
        return f"{what}: {'PASS' if self.passed else 'FAIL'} ({self.worst})"


@dataclass
class Search:
    """The bounded search over candidate sets; every trial is a rebuild and a re-test."""

    trial: Callable[[list[str], list[str]], tuple[bool, str]]
    max_rebuilds: int
    max_seconds: float
    progress: Callable[[str], None]
    trials: list[Trial] = field(default_factory=list)
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
        t0 = time.monotonic()
        passed, worst = self.trial(nodes, op_types)
        t = Trial(nodes, op_types, passed, worst, round(time.monotonic() - t0, 2))
        self.trials.append(t)
        self.progress(f"explain: rebuild {len(self.trials)}/{self.max_rebuilds}: {t.describe()}")
        return passed

    def search(self, layers: list[Layer], op_keys: bool) -> tuple[list[str], list[str]] | None:
        """The smallest passing (nodes, op types) found, or None."""
        rank: dict[str, float] = {}
        for x in layers:
            rank[x.op_type] = max(rank.get(x.op_type, -1.0), x.added if not math.isinf(x.added) else 1e300)
        groups = sorted(rank, key=lambda o: -rank[o])
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
        from . import modelfiles

        weights = self.builder.model_files(job.model.path).weights_size
        if modelfiles.needs_external_data(weights):
            return {"status": "not run", "reason": f"the model holds {weights / (1 << 30):.2f} GiB of weights: the "
                    "search runs it whole with every layer exposed and rebuilds it per candidate, which a model past "
                    "protobuf's 2 GB limit does not fit; keep layers in float by hand (quantization.exclude_nodes, "
                    "int4.exclude_nodes, fp16.node_block_list) or explain a smaller model of the same architecture"}
        start = time.monotonic()
        self.progress(job.name, "explain: layer-wise error against fp32 on the golden inputs")
        layers = self._layers(job)
        doc: dict[str, Any] = {
            "precision": job.settings.precision, "table": knob.table,
            "layers": [{"node": x.node, "op_type": x.op_type, "error": _num(x.error), "added": _num(x.added)}
                       for x in layers[:20]],
            "baseline": {"accuracy": res.accuracy, "worst": res.worst}}
        if res.accuracy == PASS:
            doc.update(status="passes", reason="the accuracy gate passes: nothing to keep in float")
            return doc
        if not layers:
            doc.update(status="not found", reason="the precision step changed no node that could be kept in float")
            return doc
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

            search = Search(trial, self.max_rebuilds, self.max_seconds, lambda m: self.progress(job.name, m))
            best = search.search(layers, knob.op_types is not None)
            doc["trials"] = [dataclasses.asdict(t) for t in search.trials]
            doc["rebuilds"] = len(search.trials)
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

    def _layers(self, job: Job) -> list[Layer]:
        from .steps import check, precision

        s = job.settings
        src = check.run(job.model.path)
        names = [i["name"] for i in src.signature["inputs"]]
        feed = data.load_feed(job.model.inputs, names)
        samples = data.load_samples(job.model.calibration, names) \
            if s.rule.needs_calibration and job.model.calibration is not None else None
        external = src.files.has_external_data
        with workspace.private_dir(workspace.temp_need(src.size)) as work:
            prec = precision.run(job.model.path, src.model, s.precision, s.typed_precision_options(), work, samples,
                                 external=external)
            reduced = onnx.load(str(prec.path))
        source = onnx.load(str(job.model.path)) if external else src.model  # the layer-wise runs need weights
        nodes = changed_nodes(source, reduced, s.precision, s.typed_precision_options())
        return layerwise(source, reduced, nodes, feed, s.custom_ops)


def _num(x: float | None) -> float | str | None:
    return None if x is None else ("inf" if math.isinf(x) else float(f"{x:.4g}"))


def render(job_name: str, doc: dict[str, Any]) -> list[str]:
    """What `ortbuild test` prints for one explained job."""
    lines = [f"explain {job_name}: {doc['status']}" + (f": {doc['reason']}" if doc.get("reason") else "")]
    for x in doc.get("layers", [])[:5]:
        lines.append(f"  layer-wise: {x['node']} ({x['op_type']}) error {x['error']} vs fp32, adds {x['added']}")
    for t in doc.get("trials", []):
        lines.append(f"  rebuild: {Trial(**t).describe()}")
    if doc.get("status") == "found":
        r = doc["result"]
        size = r.get("size") or {}
        lines.append(f"  result ({doc['rebuilds']} rebuilds, {doc['seconds']} s): accuracy {r['accuracy']} "
                     f"({r['worst']}), size {size.get('bytes', 0) / 1024:.1f} KB ({size.get('ratio', 0):.2f}x the "
                     f"source, {r['size_verdict']}), latency p50 "
                     + (f"{r['p50_ms']:.3f} ms" if isinstance(r["p50_ms"], float) else "-")
                     + f" ({'no budget' if r['latency_verdict'] == '-' else r['latency_verdict']})")
        lines.append("  paste into targets.toml:\n")
        lines += doc["override"].rstrip("\n").splitlines()
        lines.append("")
    return lines
