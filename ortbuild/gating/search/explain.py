"""Precision bisection (`ortbuild test --explain`): which nodes break the accuracy of an fp16, int8 or int4
artifact, and the `[[targets.X.overrides]]` table that fixes it.

1. Candidates: the nodes the precision step actually changed, in the main graph and inside If/Loop/Scan bodies
   (ORT's quantizers and fp16 converter match `exclude_nodes` / `node_block_list` by plain node name in every
   body; int8-static leaves bodies in float). int8/int4: the nodes of the float graph the quantizer reads (int8:
   after its pre-processing) whose outputs the reduced graph now computes through quantized operators or
   quantized weights (MatMul -> MatMulInteger or MatMulNBits, a Gather over a quantized embedding table, QDQ
   pairs; a body compared with the same body of the output); nodes the pre-processing only folded away
   (Constant, Shape, Unsqueeze ...) are not candidates, and those it renamed (no name in the source, so no
   `exclude_nodes` entry) are reported, not searched. fp16: the nodes outside the block lists.
2. Layer-wise error: that float graph (fp32) and the precision step's output run side by side on the golden
   inputs with every node output of the main graph exposed (CPU provider, no optimization). Each main-graph
   candidate gets the relative L2 error of its outputs against fp32 and the error it adds to its inputs' error.
   A body's tensors cannot be made outputs of the model: candidates inside bodies get no error ("n/a (inside
   If_0 then_branch: not measured)") and are ranked after the measured ones, by the weights they keep in float.
   Those the golden inputs do not run (ORT's profile of one run of the float graph: an If's other branch) cannot
   change what the gate sees: they are listed last and not searched.
3. Prediction (int8, int4): each main-graph candidate is put back in float in the reduced graph (the source node
   in place of what the quantizer wrote for it), the model run on the golden inputs and judged by the gate's rule
   against fp32, without a rebuild. Candidates are ranked by the outputs' error so predicted; the fewest
   top-ranked ones predicted to pass, made smaller one node at a time on predictions, are the first set rebuilt.
   The predictor does not patch bodies: candidates inside them are not predicted (the search goes on by
   rebuilds), and a model whose every candidate sits in a body has predictions off.
4. The search rebuilds and re-tests: each candidate set runs the real build pipeline into a scratch directory
   and the real accuracy gate through the generated loader. A set whose precision step gives a graph already
   tried (the failing artifact's included) is not rebuilt. Without a passing prediction (fp16 always): op types
   first, ranked, one at a time, bodies' nodes included (fp16: `op_block_list`; int8/int4: their nodes, of every
   graph, in `exclude_nodes`); if none passes alone, the top-ranked op types together. A passing set is then
   bisected to fewer nodes (`node_block_list` / `exclude_nodes`): halves, then one node at a time.
5. The smallest passing candidate gets the full gate (accuracy, size, latency). Its override is printed,
   checked by parsing targets.toml with it appended (the printed table yields the settings tested), and
   recorded in the test report.
Bounded by a number of rebuilds and seconds; progress per rebuild. ORT's converters are not monotonic (the
fp16 converter casts to fp16 between two blocked nodes), so every answer is one that was built and passed.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from ortbuild import logs, modelfiles, workspace
from ortbuild.errors import OrtbuildError
from ortbuild.gating.record import TestResult
from ortbuild.gating.records import ExplainDoc, PredictionsDoc
from ortbuild.gating.runner import Tester
from ortbuild.gating.search.base import Budget, Clock, Found, Say
from ortbuild.gating.search.bisect import Bisection, check_override, override_toml, settings_with
from ortbuild.gating.search.explain_render import layers_doc
from ortbuild.gating.search.layerwise import (
    NOTHING,
    QUANT_OPS,
    Layer,
    Prediction,
    changed_nodes,
    graph_digest,
    joined,
    layerwise,
    ranked,
    samples,
    session_of,
)
from ortbuild.gating.search.predict import Proxy
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.progress import Progress
from ortbuild.pipeline.steps import accounting, check, fusion, precision
from ortbuild.project import config, data, options
from ortbuild.project.plan import Job
from ortbuild.project.precisions import Quantizer, SearchKnob
from ortbuild.status import JobStatus, PhaseStarted, Verdict

Knob = SearchKnob
# what each precision keeps in float, from its rule (PrecisionRule.knob): the precisions the search applies to
KNOBS = {r.name: r.knob for r in options.RULES if r.knob is not None}


@dataclass
class Analysis:
    """The failing artifact's precision step, as the search needs it."""

    layers: list[Layer]
    source: onnx.ModelProto
    reduced: onnx.ModelProto
    feed: data.Feed
    digest: str                      # graph_digest of the precision step's output
    src: check.CheckResult           # the check step's result for the source model
    expected: dict[str, object]      # the source model's outputs on `feed`
    renamed: list[str]               # changed nodes the source has no name for (renamed by pre-processing)
    analysed: int = 1                # golden samples the layer-wise error and the predictions ran on
    of: int = 1                      # of the golden samples


class Explainer:
    """Precision bisection, a base.Search over a job's failing test result: for failing jobs of one `ortbuild
    test` (scratch builds, re-tests, the final gate), and for build to the gates (autobuild.PrecisionSearch)."""

    def __init__(self, builder: Builder, tester: Tester, budget: Budget, *, progress: Say,
                 final_gate: bool = True) -> None:
        self.builder = builder
        self.final_gate = final_gate  # the answer's full gate (accuracy, size, latency) in the search's scratch
        self.tester = tester
        self.budget = budget
        self.progress = progress
        self.logs: list[tuple[str, logs.Captured]] = []  # (job, what the converters and ORT said in its search)

    def explain(self, job: Job, res: TestResult) -> ExplainDoc:
        """The search's record for one job (the test report's `explain` section)."""
        return self.search(job, res).answer

    def search(self, job: Job, given: TestResult, clock: Clock | None = None) -> Found[ExplainDoc]:
        """The search for one job, what the converters and ONNX Runtime say in it kept in its log,
        dist/logs/<target>/<model>.explain.log (ortbuild.logs; none with -v, as the build's capture). `clock`: the
        caller's, already started (one deadline for a whole build-to-the-gates search), else this budget's."""
        dist = self.builder.dist
        log = logs.log_path(dist, job.target.name, job.model.name, "explain") if self.builder.capture else None
        cap: logs.Captured | None = None
        clock = clock or self.budget.start()
        try:
            with logs.captured(log, dist) as cap:
                doc = self._explain(job, given, clock)
        finally:
            if cap is not None and log is not None:
                self.logs.append((job.name, cap))
        return clock.found(doc, found=doc.get("status") == "found", cut_short=bool(doc.get("stopped")) or
                           str(doc.get("reason", "")).startswith("stopped after"))

    def _explain(self, job: Job, res: TestResult, clock: Clock) -> ExplainDoc:
        knob = job.settings.rule.knob
        if knob is None:
            return {"status": "not applicable", "reason": f"precision {job.settings.precision}: nothing to keep in "
                                                          "float (only fp16, int8 and int4 are searched)"}
        weights = self.builder.model_files(job.model.path).weights_size
        if modelfiles.needs_external_data(weights):
            return {"status": "not run", "reason": f"the model holds {weights / (1 << 30):.2f} GiB of weights: the "
                    "search runs it whole with every layer exposed and rebuilds it per candidate, which a model past "
                    "protobuf's 2 GB limit does not fit; keep layers in float by hand (quantization.exclude_nodes, "
                    "int4.exclude_nodes, fp16.node_block_list) or explain a smaller model of the same architecture"}
        self.progress(job.name, PhaseStarted("explain: layer-wise error against fp32 on the golden inputs"))
        an = analyse(job, lambda: clock.within(ANALYSIS_SHARE))
        layers = an.layers
        doc: ExplainDoc = {"precision": job.settings.precision, "table": knob.table,
                           "layers": layers_doc(layers), "baseline": {"accuracy": res.accuracy, "worst": res.worst},
                           "analysed": f"{an.analysed} of {an.of} golden sample(s)"}
        if an.renamed:
            doc["renamed"] = an.renamed
        if res.accuracy == Verdict.PASS:
            doc["status"], doc["reason"] = "passes", "the accuracy gate passes: nothing to keep in float"
            return doc
        if not layers:
            doc["status"] = "not found"
            doc["reason"] = ("the precision step changed no node that could be kept in float"
                             + (" by a name the source model has" if an.renamed else "") + _in_subgraphs(an.reduced))
            return doc
        if not any(x.ran for x in layers):
            doc["status"] = "not found"
            doc["reason"] = (f"the {len(layers)} node(s) the precision step changed sit inside If/Loop/Scan bodies "
                             "that the golden inputs do not run: keeping them in float cannot change what the gate "
                             "sees; add golden inputs that run them (`inputs`)")
            return doc
        predict: Callable[[list[str]], Prediction | None] | None = None
        if job.settings.rule.quantizer is not Quantizer.FP16:  # the quantizers' output can be patched
            layers, predict, doc["predictions"] = self._predict(job, an, clock)
            doc["layers"] = layers_doc(layers)
        with tempfile.TemporaryDirectory(prefix="ortbuild-explain-") as scratch:
            dist = Path(scratch)
            quiet = Progress(quiet=True)  # the search reports per rebuild itself
            # no capture of its own: what the rebuilds' tools say goes to this search's log (or, with -v, shows)
            builder = Builder(self.builder.project, dist, force=True, progress=quiet, secrets=self.builder.secrets,
                              capture=False)
            tester = Tester(self.tester.project, dist, self.tester.secret, self.tester.config_arg, quiet,
                            self.tester.sign_key, judged=self.tester.judged)  # --gates: the answer's gates too
            tester.golden_cache = self.tester.golden_cache  # the golden data of the model, computed once

            def trial(nodes: list[str], op_types: list[str]) -> tuple[bool, str]:
                tjob = Job(job.target, job.model, settings_with(job.settings, knob, nodes, op_types))
                built = builder.run_job(tjob)
                if built.status != JobStatus.BUILT:
                    return False, f"build {built.status}: {built.reason[:160]}"
                tres = TestResult(job.target.name, job.model.name, job.settings.precision)
                try:
                    tester.accuracy_gate(tjob, tres)
                except OrtbuildError as e:
                    return False, e.message[:160]
                return tres.accuracy == Verdict.PASS, tres.worst

            def graph(nodes: list[str], op_types: list[str]) -> str:
                return graph_digest(reduce_model(job, settings_with(job.settings, knob, nodes, op_types), an.src))

            search = Bisection(trial, clock, lambda m: self.progress(job.name, m), graph=graph, predict=predict,
                               graphs={an.digest: -1})
            best = search.search(layers, knob.op_types is not None)
            doc["trials"] = [t.as_json() for t in search.trials]
            doc["rebuilds"] = len(search.trials)
            doc["skipped"] = search.skipped
            if best is None:
                doc["status"], doc["reason"] = "not found", search.stopped or "no candidate set made the gate pass"
                doc["seconds"] = round(clock.spent(), 1)
                return doc
            nodes, op_types = best
            settings = settings_with(job.settings, knob, nodes, op_types)
            text = override_toml(job, knob, settings)
            check_override(self.builder.project, job, text, settings)
            doc["status"], doc["nodes"], doc["op_types"], doc["override"] = "found", nodes, op_types, text
            doc["seconds"], doc["stopped"] = round(clock.spent(), 1), search.stopped
            if not self.final_gate:
                return doc
            final_job = Job(job.target, job.model, settings)
            self.progress(job.name, PhaseStarted("explain: the full gate (accuracy, size, latency) of the answer"))
            builder.run_job(final_job)
            final = TestResult(job.target.name, job.model.name, job.settings.precision)
            try:
                tester.gate(final_job, final, {})
            except OrtbuildError as e:
                final.fail([e.message])
            doc["result"] = {"accuracy": final.accuracy, "worst": final.worst, "size": final.size,
                             "size_verdict": final.size_verdict, "latency_verdict": final.latency_verdict,
                             "p50_ms": final.latency.get("p50_ms"), "p90_ms": final.latency.get("p90_ms"),
                             "failures": final.failures}
            doc["seconds"], doc["stopped"] = round(clock.spent(), 1), search.stopped
            return doc

    def _predict(self, job: Job, an: Analysis, clock: Clock) \
            -> tuple[list[Layer], Callable[[list[str]], Prediction | None] | None, PredictionsDoc]:
        """Each candidate kept in float alone, predicted (at most a third of --explain-seconds, the layer-wise
        ranking deciding which go first): the layers in the search's order, the predictor (None where predictions
        cannot be trusted) and what the report says about them."""
        s = job.settings
        gates = s.gates
        assert gates is not None
        t0 = time.monotonic()
        proxy = Proxy(an.source, an.reduced, an.feed, an.expected, lambda o: gates.accuracy_rule(s.precision, o),
                      s.custom_ops)
        if not any(proxy.patchable(x.node) for x in an.layers):
            return an.layers, None, {"status": "off", "reason": f"all {len(an.layers)} candidate(s) sit inside "
                                     "If/Loop/Scan bodies, which the predictor does not patch"}
        base = proxy.predict([])
        if base is None:
            return an.layers, None, {"status": "off", "reason": "the precision step's output cannot be patched here"
                                     if proxy.usable else "the quantizer changed the model's opset"}
        if base.passed:  # the prediction passes where the gate fails: the proxy is no guide for this artifact
            return an.layers, None, {"status": "off", "reason": f"the unpatched prediction passes ({base.worst}) "
                                                                "where the gate fails"}
        self.progress(job.name, PhaseStarted(f"explain: predicting each of {len(an.layers)} candidate(s) kept in "
                                             "float alone (no rebuild)"))
        layers = []
        for x in an.layers:
            alone = proxy.predict([x.node]) if clock.within(1 / 3) else None
            layers.append(dataclasses.replace(x, alone=alone))
        done = sum(x.alone is not None for x in layers)
        return ranked(layers), proxy.predict, {
            "status": "on", "baseline": base.worst, "predicted": done, "candidates": len(layers),
            "seconds": round(time.monotonic() - t0, 1)}


def reduce_model(job: Job, settings: config.Settings, src: check.CheckResult, *,
                 converter_input: bool = False) -> onnx.ModelProto:
    """The precision step's output for `settings`, as the build writes it (`src`: the check step's result for
    the model; the fusion step first where it is on). converter_input: the float graph the converter reads
    instead (int8: after the quantizers' pre-processing and opset upgrade, the names `exclude_nodes` means)."""
    names = [i["name"] for i in src.signature["inputs"]]
    samples = data.load_samples(job.model.calibration, names) \
        if settings.rule.needs_calibration and job.model.calibration is not None and not converter_input else None
    external = src.files.has_external_data
    path, model = job.model.path, onnx.ModelProto()
    model.CopyFrom(src.model)  # the converters change the graph they are given (int4 does, in place)
    opts, prec = settings.typed_precision_options(), settings.precision
    with workspace.private_dir(workspace.temp_need(src.size)) as work:
        if settings.fusion.enabled:  # the precision step reads the fused graph (build.py's fusion step)
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


ANALYSIS_SHARE = 0.25  # of a search's seconds, what the layer-wise error may take (one golden sample at least)


def analyse(job: Job, more: Callable[[], bool] = lambda: True) -> Analysis:
    """The failing artifact's precision step: its candidates and their layer-wise errors, on the golden samples
    taken one at a time while `more()` says so (the first always): the Analysis' feed is those samples, which
    the predictions run on too."""
    s = job.settings
    src = check.run(job.model.path)
    # the names the build accepts in exclude_nodes (check.settings_problems: every graph's, bodies included)
    known = {n.name for g in accounting.graphs(src.model.graph) for n in g.node}
    names = [i["name"] for i in src.signature["inputs"]]
    every = samples(data.load_feed(job.model.inputs, names), src.model)
    reduced = reduce_model(job, s, src)
    base = reduce_model(job, s, src, converter_input=True)
    nodes = changed_nodes(base, reduced, s.precision, s.typed_precision_options())
    renamed = [n.name for n in nodes if n.name not in known]
    nodes = [n for n in nodes if n.name in known]
    used = 1  # samples layerwise() runs: the first, and each next one `more()` lets it

    def go_on() -> bool:
        nonlocal used
        on = more()
        used += on
        return on

    layers = layerwise(base, reduced, nodes, every, s.custom_ops, go_on)
    feed = joined(every[:used])
    # the golden outputs the gate compares with, on the samples analysed: the source model's, weights loaded
    source = onnx.load(str(job.model.path)) if src.files.has_external_data else src.model
    outputs = [o.name for o in source.graph.output]
    expected = dict(zip(outputs, session_of(source, s.custom_ops).run(outputs, dict(feed)), strict=True))
    del source
    return Analysis(layers, base, reduced, feed, graph_digest(reduced), src, expected, renamed, used, len(every))


def _in_subgraphs(reduced: onnx.ModelProto) -> str:
    """What the precision step changed inside If/Loop/Scan bodies, when no candidate there has a name to keep."""
    inside: dict[str, int] = {}
    for g in list(accounting.graphs(reduced.graph))[1:]:  # the bodies, not the main graph
        for n in g.node:
            if n.op_type in QUANT_OPS:
                inside[n.op_type] = inside.get(n.op_type, 0) + 1
    if not inside:
        return ""
    ops = ", ".join(f"{k} {v}" for k, v in sorted(inside.items(), key=lambda kv: -kv[1]))
    return (f"; what it changed inside If/Loop/Scan bodies ({ops}) has no node name to keep in float either: "
            "keep an op type in float by naming only the others in quantization.op_types (e.g. "
            "op_types = [\"Conv\"] leaves LSTM in float), and rebuild")
