"""The precision step: change the precision with ONNX Runtime's own tools. Portable: no provider is involved.

Models of any size: the source is read from its path (its external data beside it), fp32 is not copied at all,
and every output whose weights could pass protobuf's 2 GB limit is written with external data (`external`).

fp16          onnxruntime.transformers.float16.convert_float_to_float16
int8-dynamic  onnxruntime.quantization.quantize_dynamic   (after quant_pre_process)
int8-static   onnxruntime.quantization.quantize_static    (after quant_pre_process; calibration data)
              (with external data, both run on the graph without its weights, each weight read when the
              quantizer asks for it: streamquant)
int4-weight   onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import onnx

from ortbuild import modelfiles
from ortbuild.artifact import manifest_types
from ortbuild.pipeline.steps import accounting, recipes, streamquant
from ortbuild.project import precisions
from ortbuild.project.config import Fp16, Int4, PrecisionOptions, Quantization, as_plain
from ortbuild.project.data import Feed
from ortbuild.project.declare import build
from ortbuild.project.precisions import PrecisionRule, Quantizer
from ortbuild.project.sections import OPTIONS_TYPES

if TYPE_CHECKING:
    from onnxruntime.quantization import QuantType

_QUANT_MIN_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear need opset 13


@dataclass(frozen=True)
class PrecisionResult:
    path: Path                       # the converted model, inside the build's private temp dir
    precision: str
    options: dict[str, object]       # the options as used (the manifest records them)
    notes: list[str] = field(default_factory=list)
    changed: accounting.Accounting | None = None  # what the step converted (None: fp32, nothing to convert)
    already: str | None = None       # why the source is already quantized or fp16 (None: it is not)

    def manifest_section(self) -> manifest_types.PrecisionInfo:
        return manifest_types.PrecisionInfo(self.precision, self.options,
                                            self.changed.as_json() if self.changed else None)


def _save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    """Write `model`; with `external`, every tensor over 1 KB goes to `<name>.data` beside it (one file)."""
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{path.name}.data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))
    return path


def _weightless(model: onnx.ModelProto) -> bool:
    """Whether `model` was loaded without its external data (its tensors only point at files)."""
    return bool(modelfiles.locations(model))


def _full(source: Path, model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its weights: `model` itself, or loaded again from `source` with its external data."""
    return onnx.load(str(source)) if _weightless(model) else model


def toposort(model: onnx.ModelProto) -> onnx.ModelProto:
    """Order nodes so every input is produced before use (ORT's fp16 converter appends Casts at the end).

    Stable: nodes keep their relative order where the dependencies allow it.
    """
    g = model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    producers = {o: i for i, n in enumerate(g.node) for o in n.output}
    deps = [{producers[x] for x in ({*n.input} | accounting.subgraph_reads(n)) if x in producers and x not in known}
            for n in g.node]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    pending = [len(d) for d in deps]
    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(g.node):
        raise ValueError("the graph has a cycle: it cannot be ordered")
    nodes = [g.node[i] for i in order]
    del g.node[:]
    g.node.extend(nodes)
    return model


def _is_weight(node: onnx.NodeProto) -> bool:
    """A Constant node holding a float tensor over 1 KB: a weight, as exporters such as spox write them."""
    return node.op_type == "Constant" and any(
        a.name == "value" and a.t.data_type in accounting.FLOAT_TYPES and modelfiles.nbytes(a.t) > 1024
        for a in node.attribute)


def _constant_weights(model: onnx.ModelProto) -> int:
    return sum(1 for g in accounting.graphs(model.graph) for n in g.node if _is_weight(n))


def _constants_to_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every weight held in a Constant node becomes an initializer of the same graph (subgraphs included)."""
    for g in accounting.graphs(model.graph):
        keep = []
        for n in g.node:
            if _is_weight(n):
                t = onnx.TensorProto()
                t.CopyFrom(next(a.t for a in n.attribute if a.name == "value"))
                t.name = n.output[0]
                g.initializer.append(t)
            else:
                keep.append(n)
        if len(keep) != len(g.node):
            del g.node[:]
            g.node.extend(keep)
    return model


def _has_subgraphs(model: onnx.ModelProto) -> bool:
    return any(a.HasField("g") or len(a.graphs) for n in model.graph.node for a in n.attribute)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), _QUANT_MIN_OPSET)


def _upgrade_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    version = _opset(model)
    if version < _QUANT_MIN_OPSET:
        notes.append(f"converted the graph from opset {version} to {_QUANT_MIN_OPSET} first: ORT's "
                     "quantizer writes per-axis DequantizeLinear, which needs opset 13")
        model = onnx.version_converter.convert_version(model, _QUANT_MIN_OPSET)
    return model


def _preprocess(src: Path, work: Path, enabled: bool, notes: list[str], external: bool) -> Path:
    if not enabled:
        return src
    out = work / "preprocessed.onnx"
    if external:  # the same passes, the weights read from their files
        return streamquant.preprocess(src, out, notes)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(src), str(out))
    except Exception as e:  # symbolic shape inference fails on some exported graphs
        notes.append(streamquant.no_symbolic_shapes(e))
        quant_pre_process(str(src), str(out), skip_symbolic_shape=True)
    return out



class _Reader:
    """A CalibrationDataReader over a list of feeds (duck-typed: get_next + rewind)."""

    def __init__(self, samples: list[Feed]) -> None:
        self.samples = samples
        self._it: Iterator[Feed] = iter(samples)

    def get_next(self) -> Feed | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.samples)


def _qtype(name: str) -> QuantType:
    from onnxruntime.quantization import QuantType

    return QuantType.QInt8 if name == "int8" else QuantType.QUInt8


def _typed(rule: PrecisionRule, opts: Mapping[str, object] | PrecisionOptions) -> PrecisionOptions:
    """The precision's typed options (a plain table, as recorded in manifests, is accepted too)."""
    if opts is None or not isinstance(opts, Mapping):
        return opts
    table = rule.options_table
    return None if table is None else build(OPTIONS_TYPES[table], opts)


def run(source: Path, model: onnx.ModelProto, precision: str | PrecisionRule,
        opts: Mapping[str, object] | PrecisionOptions, work: Path, calibration: list[Feed] | None = None, *,
        external: bool = False) -> PrecisionResult:
    """Convert the model at `source` (`model`: its graph as the check step read it, weights loaded or not).
    external: write the output's weights as external data (the model is, or may grow, too big for one file)."""
    rule = precisions.rule(precision)
    root = logging.getLogger()
    level, tmp = root.level, tempfile.tempdir
    root.setLevel(max(level, logging.WARNING))  # ORT's quantizers log every node at INFO on the root logger
    # Keep every copy of the model inside the job's private temp dir: ORT's symbolic shape inference, on
    # failure, dumps the model and its weights (as <uuid>.data) into the current directory, and the
    # quantizers make their own temp dirs (calibration writes an augmented copy of the model).
    tempfile.tempdir = str(work.resolve())
    before = accounting.Snapshot.of(model) if opts is not None else None  # the int4 quantizer edits `model`
    try:
        with contextlib.chdir(work):
            res = _run(source.resolve(), model, rule, _typed(rule, opts), work.resolve(), calibration, external)
    finally:
        root.setLevel(level)
        tempfile.tempdir = tmp
    if before is None or res.path == source.resolve():
        return res
    changed = accounting.account(before, onnx.load(str(res.path), load_external_data=False))
    notes = list(res.notes)
    already = accounting.already_reduced(before)
    if already:
        notes.append(f"the source is already reduced ({already}): {rule.name} converts it again; "
                     "precision = \"fp32\" ships it as it is")
    return PrecisionResult(res.path, res.precision, res.options, notes, changed, already)


def _run(source: Path, model: onnx.ModelProto, rule: PrecisionRule, opts: PrecisionOptions, work: Path,
         calibration: list[Feed] | None, external: bool) -> PrecisionResult:
    notes: list[str] = []
    if rule.quantizer is Quantizer.NONE or opts is None:  # fp32: the source as it is, read in place (the optimize
        return PrecisionResult(source, rule.name, {}, notes)  # step writes the first copy)
    match rule.quantizer:
        case Quantizer.FP16:
            assert isinstance(opts, Fp16)
            return _fp16(source, model, rule, opts, work, external)
        case Quantizer.INT8:
            assert isinstance(opts, Quantization)
            return _int8(source, model, rule, opts, work, calibration, external)
        case Quantizer.INT4:
            assert isinstance(opts, Int4)
            return _int4(source, model, rule, opts, work, external)
        case _:
            assert_never(rule.quantizer)


def _fp16(source: Path, model: onnx.ModelProto, rule: PrecisionRule, opts: Fp16, work: Path,
          external: bool) -> PrecisionResult:
    notes: list[str] = []
    used = as_plain(opts)  # what the manifest records
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(opts.op_block_list))
    weightless = _weightless(model)
    full = _full(source, model)
    if weightless:  # the converter's own shape inference serializes the whole model, which fails past 2 GB:
        # infer the shapes on the graph without its weights, and the converter skips its own pass
        shapes = onnx.shape_inference.infer_shapes(model)
        del full.graph.value_info[:]
        full.graph.value_info.extend(shapes.graph.value_info)
    converted = convert_float_to_float16(
        full, keep_io_types=opts.keep_io_types, op_block_list=block,
        node_block_list=list(opts.node_block_list) or None, disable_shape_infer=weightless)
    del full
    out = _save(toposort(converted), work / "fp16.onnx", external)
    return PrecisionResult(out, rule.name, used, notes)


def _int8(source: Path, model: onnx.ModelProto, rule: PrecisionRule, opts: Quantization, work: Path,
          calibration: list[Feed] | None, external: bool) -> PrecisionResult:
    """quantize_dynamic, or quantize_static where the rule needs calibration."""
    notes: list[str] = []
    used = as_plain(opts)  # what the manifest records
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_dynamic, quantize_static

    held = _constant_weights(model)
    if _weightless(model) and _opset(model) >= _QUANT_MIN_OPSET and not held:  # read in place
        src = source
    else:
        full = _upgrade_opset(_full(source, model), notes)
        if held:  # ORT's quantizers look for weights among initializers only
            full = _constants_to_initializers(full)
            notes.append(f"{held} weight(s) held in Constant nodes made initializers of their graphs, so "
                         "ORT's quantizer sees them")
        src = _save(full, work / "source.onnx", external)
        del full
    pre = _preprocess(src, work, opts.preprocess, notes, external)
    if src.parent == work and pre != src:
        modelfiles.remove(src)
    out = work / "int8.onnx"
    common: dict[str, object] = {
        "per_channel": opts.per_channel, "reduce_range": opts.reduce_range,
        "weight_type": _qtype(opts.weight_type),
        "op_types_to_quantize": list(opts.op_types) or None,
        "nodes_to_exclude": list(opts.exclude_nodes) or None,
    }
    # with external data, ORT's quantizers run on the graph without its weights, each weight read from its
    # file when asked (streamquant); the pre-processed copy is removed before the result is written
    consume = (lambda: modelfiles.remove(pre)) if pre.parent == work else None
    streamed = streamquant.weightless(pre.parent, consume) if external else contextlib.nullcontext()
    nested = _has_subgraphs(model)
    if not rule.needs_calibration:  # int8-dynamic
        # weights inside If/Loop/Scan bodies: ORT's quantizer enters subgraphs only when asked (EnableSubgraph)
        extra = {"EnableSubgraph": True} if nested else {}
        with streamed:
            quantize_dynamic(str(pre), str(out), use_external_data_format=external, extra_options=extra,
                             **common)
        used = {k: used[k] for k in ("per_channel", "reduce_range", "weight_type", "op_types",
                                     "exclude_nodes", "preprocess")}
        used["format"] = "qoperator"
    else:
        assert calibration, "config validation guarantees calibration data for int8-static"
        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile,
                  "distribution": CalibrationMethod.Distribution}[opts.calibration_method]
        recipe = recipes.transformer(onnx.load(str(pre), load_external_data=False).graph, opts.op_types) \
            if opts.recipe == "auto" else None
        if recipe is not None:  # a known-good start for this kind of graph (recipes.py)
            common.update(op_types_to_quantize=list(recipe.op_types), nodes_to_exclude=list(dict.fromkeys(
                [*opts.exclude_nodes, *recipe.exclude_nodes])) or None)
            notes.append(recipe.note)
        used["recipe"] = recipe.name if recipe is not None else "none"
        with streamed:
            quantize_static(
                str(pre), str(out), _Reader(calibration),
                quant_format=QuantFormat.QDQ if opts.format == "qdq" else QuantFormat.QOperator,
                activation_type=_qtype(opts.activation_type), calibrate_method=method,
                calibration_providers=["CPUExecutionProvider"], use_external_data_format=external,
                extra_options=dict(recipe.extra_options) if recipe is not None else {}, **common)
        used["calibration_samples"] = len(calibration)
        if nested:
            notes.append(f"weights inside If/Loop/Scan bodies stay float: onnxruntime {_ort_version()}'s static "
                         "quantizer enters subgraphs in dynamic mode only (its EnableSubgraph option); "
                         "int8-dynamic quantizes them")
    if pre.parent == work:
        modelfiles.remove(pre)
    return PrecisionResult(out, rule.name, used, notes)


def _int4(source: Path, model: onnx.ModelProto, rule: PrecisionRule, opts: Int4, work: Path,
          external: bool) -> PrecisionResult:
    notes: list[str] = []
    used = as_plain(opts)  # what the manifest records
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(
        _full(source, model), bits=4, block_size=opts.block_size, is_symmetric=opts.symmetric,
        accuracy_level=opts.accuracy_level or None, nodes_to_exclude=list(opts.exclude_nodes) or None)
    quant.process()
    out = work / "int4.onnx"
    quant.model.save_model_to_file(str(out), external)
    del quant
    if not any(n.op_type == "MatMulNBits" for n in onnx.load(str(out), load_external_data=False).graph.node):
        notes.append("no MatMul had a constant weight to quantize: the graph is unchanged")
    return PrecisionResult(out, rule.name, used, notes)


def too_little(precision: str | PrecisionRule, changed: accounting.Accounting,
               opts: Mapping[str, object] | PrecisionOptions) -> tuple[str, str] | None:
    """(why, what to do) when the step converted less than accounting.MIN_CHANGED of the float weights: the
    artifact would carry the precision's name and hardly any of its effect."""
    if changed.converted >= accounting.MIN_CHANGED:
        return None
    users = changed.users
    where = ", ".join(f"{op} ({b / 1e6:.2f} MB)" for op, b in list(users.items())[:4]) or "none found"
    rule = precisions.rule(precision)
    why = (f"{rule.name} converted {changed.converted:.1%} of the float weights ({changed.tensors} tensor(s) "
           f"standing for {changed.reduced_as_float / 1e6:.2f} MB of float weights; "
           f"{changed.float_bytes_after / 1e6:.2f} MB left in float; at least {accounting.MIN_CHANGED:.0%} is "
           f"required); the source's float weights are read by: {where}")
    typed_opts = _typed(rule, opts)
    if isinstance(typed_opts, Quantization):
        asked = list(typed_opts.op_types)
        hint = ((f"quantization.op_types = {asked} leaves them out: add the ops above, or " if asked else "")
                + "set precision = \"fp32\" for this model in an override ([[targets.NAME.overrides]] "
                "models = [...]): ORT's quantizer found nothing it quantizes here")
        if not typed_opts.preprocess:
            hint = "quantization.preprocess = true (it folds weights computed in the graph into initializers); " \
                   + hint
    elif isinstance(typed_opts, Int4):
        hint = ("int4-weight quantizes MatMul weights only: set precision = \"int8-dynamic\" or \"fp32\" for this "
                "model in an override")
    else:
        hint = "fp16.op_block_list / node_block_list keep these in float: shorten them, or build this model in fp32"
    return why, hint
