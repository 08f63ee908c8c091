"""int8-dynamic against fp32 on this CPU, for `ortbuild init` (ortbuild.project.speedup holds the result and the
rule): the model quantized as the cpu-int8 preset quantizes it (the build's own precision step, with the preset's
`quantization` table), both sessions opened as the preset opens them (every graph optimization, its session's
intra-op threads), their runs paired and interleaved on one golden feed (A B, B A, ...: latency.sample, as
`latency.faster_than` and `ortbuild tune` measure) for about speedup.SECONDS; the verdict is on the median of the
paired ratios int8/fp32 (a relative budget of ratio 1, its interval at speedup.CONFIDENCE)."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ortbuild import modelfiles, runtime
from ortbuild.errors import first_line
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.measure.percentiles import Budget
from ortbuild.pipeline.steps import precision
from ortbuild.project.data import Feed
from ortbuild.project.speedup import CONFIDENCE, MAX_PAIRS, MAX_SECONDS, MIN_PAIRS, SECONDS, Measured, Unmeasured

RELATIVE = Budget("relative", 0.5, 1.0, "fp32")  # the median of int8/fp32 at most 1


def _session(threads: int, path: Path) -> object:
    ort = runtime.import_ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _quantized(source: Path, quantization: Mapping[str, object], work: Path) -> Path:
    """The source quantized by the build's precision step as int8-dynamic with `quantization` (the quantizers'
    log warnings, e.g. symbolic shape inference's, not on init's terminal: the build keeps them in its logs)."""
    external = modelfiles.of(source, hashed=False).keeps_external_data  # as the build keeps them
    logging.disable(logging.WARNING)
    try:
        return precision.run(source, modelfiles.load_graph(source), "int8-dynamic", dict(quantization), work,
                             external=external).path
    finally:
        logging.disable(logging.NOTSET)


def _per_pair(calls: Mapping[str, Callable[[], object]]) -> float:
    """Seconds one run of each takes, after a first (warm-up) run of each."""
    for call in calls.values():
        call()
    start = time.perf_counter()
    for call in calls.values():
        call()
    return time.perf_counter() - start


def _caller(session: object, feed: Feed) -> Callable[[], object]:
    run = getattr(session, "run")  # noqa: B009 (an onnxruntime InferenceSession: untyped)
    return lambda: run(None, feed)


def measure(source: Path, feed: Feed, quantization: Mapping[str, object], threads: int) -> Measured | Unmeasured:
    """int8 (`quantization`: the preset's table) against fp32 on `feed`, paired and interleaved, sessions with
    `threads` intra-op threads (0: ONNX Runtime's default); Unmeasured saying why where it cannot be."""
    with tempfile.TemporaryDirectory(prefix="ortbuild-init-") as tmp:
        try:
            int8 = _quantized(source, quantization, Path(tmp))
            calls = {"fp32": _caller(_session(threads, source), feed), "int8": _caller(_session(threads, int8), feed)}
            pair = _per_pair(calls)
        except Exception as err:  # the quantizer's and ONNX Runtime's errors share no base class
            return Unmeasured(f"int8 could not be made or run here: {first_line(err)}")
        if pair * MIN_PAIRS > MAX_SECONDS:
            return Unmeasured(f"one fp32 and one int8 run take {pair:.1f} s: {MIN_PAIRS} pairs would pass "
                              f"{MAX_SECONDS:g} s")
        pairs = min(MAX_PAIRS, max(MIN_PAIRS, int(SECONDS / max(pair, 1e-9))))
        attempt = latency.sample(calls, "int8", [RELATIVE], latency.Plan(CONFIDENCE, pairs, 0.0, 0.0))
    v = attempt.verdicts["relative"]
    return Measured(v.observed, v.lower, v.upper, v.samples, attempt.series["int8"].summary()["p50_ms"],
                    attempt.series["fp32"].summary()["p50_ms"], v.confidence)
