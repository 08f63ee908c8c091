"""Step 2: change the precision with ONNX Runtime's own tools. Portable: no provider is involved.

fp16          onnxruntime.transformers.float16.convert_float_to_float16
int8-dynamic  onnxruntime.quantization.quantize_dynamic   (after quant_pre_process)
int8-static   onnxruntime.quantization.quantize_static    (after quant_pre_process; calibration data)
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
from typing import Any

import onnx

from .. import options
from ..config import Fp16, Int4, PrecisionOptions, Quantization, as_plain, typed
from ..data import Feed
from ..errors import first_line

_QUANT_MIN_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear need opset 13


@dataclass(frozen=True)
class PrecisionResult:
    path: Path                       # the converted model, inside the build's private temp dir
    precision: str
    options: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def _subgraph_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    names: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for n in g.node:
                names.update(n.input)
                names |= _subgraph_names(n)
    return names


def toposort(model: onnx.ModelProto) -> onnx.ModelProto:
    """Order nodes so every input is produced before use (ORT's fp16 converter appends Casts at the end).

    Stable: nodes keep their relative order where the dependencies allow it.
    """
    g = model.graph
    known = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    producers = {o: i for i, n in enumerate(g.node) for o in n.output}
    deps = [{producers[x] for x in ({*n.input} | _subgraph_names(n)) if x in producers and x not in known}
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


def _upgrade_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is not None and version < _QUANT_MIN_OPSET:
        notes.append(f"converted the graph from opset {version} to {_QUANT_MIN_OPSET} first: ORT's "
                     "quantizer writes per-axis DequantizeLinear, which needs opset 13")
        model = onnx.version_converter.convert_version(model, _QUANT_MIN_OPSET)
    return model


def _preprocess(src: Path, work: Path, enabled: bool, notes: list[str]) -> Path:
    if not enabled:
        return src
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = work / "preprocessed.onnx"
    try:
        quant_pre_process(str(src), str(out))
    except Exception as e:  # symbolic shape inference fails on some exported graphs
        notes.append(f"quant_pre_process with symbolic shapes failed ({first_line(e, 120)}); "
                     "retried with skip_symbolic_shape=True")
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


def _qtype(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    return QuantType.QInt8 if name == "int8" else QuantType.QUInt8


def _typed(precision: str, opts: Mapping[str, Any] | PrecisionOptions) -> PrecisionOptions:
    """The precision's typed options (a plain table, as recorded in manifests, is accepted too)."""
    if opts is None or not isinstance(opts, Mapping):
        return opts
    table = options.PRECISION_RULES[precision].options_table
    cls = {"quantization": Quantization, "fp16": Fp16, "int4": Int4}.get(table or "")
    return None if cls is None else typed(cls, opts)


def run(model: onnx.ModelProto, precision: str, opts: Mapping[str, Any] | PrecisionOptions, work: Path,
        calibration: list[Feed] | None = None) -> PrecisionResult:
    root = logging.getLogger()
    level, tmp = root.level, tempfile.tempdir
    root.setLevel(max(level, logging.WARNING))  # ORT's quantizers log every node at INFO on the root logger
    # Keep every copy of the model inside the job's private temp dir: ORT's symbolic shape inference, on
    # failure, dumps the model and its weights (as <uuid>.data) into the current directory, and the
    # quantizers make their own temp dirs (calibration writes an augmented copy of the model).
    tempfile.tempdir = str(work.resolve())
    try:
        with contextlib.chdir(work):
            return _run(model, precision, _typed(precision, opts), work.resolve(), calibration)
    finally:
        root.setLevel(level)
        tempfile.tempdir = tmp


def _run(model: onnx.ModelProto, precision: str, opts: PrecisionOptions, work: Path,
         calibration: list[Feed] | None) -> PrecisionResult:
    notes: list[str] = []
    src = work / "source.onnx"
    if opts is None:  # fp32: as is
        return PrecisionResult(_save(model, src), precision, {}, notes)
    used = as_plain(opts)  # what the manifest records

    if isinstance(opts, Fp16):
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

        block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(opts.op_block_list))
        converted = convert_float_to_float16(
            model, keep_io_types=opts.keep_io_types, op_block_list=block,
            node_block_list=list(opts.node_block_list) or None)
        out = _save(toposort(converted), work / "fp16.onnx")
        return PrecisionResult(out, precision, used, notes)

    if isinstance(opts, Quantization):
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_dynamic, quantize_static

        pre = _preprocess(_save(_upgrade_opset(model, notes), src), work, opts.preprocess, notes)
        out = work / "int8.onnx"
        common: dict[str, Any] = {
            "per_channel": opts.per_channel, "reduce_range": opts.reduce_range,
            "weight_type": _qtype(opts.weight_type),
            "op_types_to_quantize": list(opts.op_types) or None,
            "nodes_to_exclude": list(opts.exclude_nodes) or None,
        }
        if not options.PRECISION_RULES[precision].needs_calibration:  # int8-dynamic
            quantize_dynamic(str(pre), str(out), **common)
            used = {k: used[k] for k in ("per_channel", "reduce_range", "weight_type", "op_types",
                                         "exclude_nodes", "preprocess")}
            used["format"] = "qoperator"
        else:
            assert calibration, "config validation guarantees calibration data for int8-static"
            method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                      "percentile": CalibrationMethod.Percentile,
                      "distribution": CalibrationMethod.Distribution}[opts.calibration_method]
            quantize_static(
                str(pre), str(out), _Reader(calibration),
                quant_format=QuantFormat.QDQ if opts.format == "qdq" else QuantFormat.QOperator,
                activation_type=_qtype(opts.activation_type), calibrate_method=method,
                calibration_providers=["CPUExecutionProvider"], **common)
            used["calibration_samples"] = len(calibration)
        return PrecisionResult(out, precision, used, notes)

    # int4-weight
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(
        model, bits=4, block_size=opts.block_size, is_symmetric=opts.symmetric,
        accuracy_level=opts.accuracy_level or None, nodes_to_exclude=list(opts.exclude_nodes) or None)
    quant.process()
    out = work / "int4.onnx"
    quant.model.save_model_to_file(str(out), False)
    if not any(n.op_type == "MatMulNBits" for n in onnx.load(str(out)).graph.node):
        notes.append("no MatMul had a constant weight to quantize: the graph is unchanged")
    return PrecisionResult(out, precision, used, notes)
