"""Benchmarks of built artifacts (nox -s benchmark). Ratios measured side by side, never absolute budgets.

1. Cold start: session creation + first run in a fresh process, the source model with ORT's online
   optimization (ORT_ENABLE_ALL, what an app does without ortbuild) vs the offline-optimized artifact loaded
   with ORT_DISABLE_ALL (what ortbuild ships). Runs alternate between the two, REPS times each.
2. Steady state: per-run latency of each cpu-int8 / cpu-int4 artifact vs the cpu-fp32 artifact of the same
   model, interleaved in one process.

    python tests/benchmarks/bench_artifacts.py [DIST] [--reps N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import sys, time, json
t0 = time.perf_counter()
import numpy as np, onnxruntime as ort
model, inputs, level = sys.argv[1], sys.argv[2], sys.argv[3]
so = ort.SessionOptions()
so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
so.intra_op_num_threads = 2
t1 = time.perf_counter()
s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
s.run(None, dict(np.load(inputs)))
t3 = time.perf_counter()
print(json.dumps({"create_ms": (t2 - t1) * 1e3, "first_run_ms": (t3 - t2) * 1e3}))
"""


def cold_start(model: Path, inputs: Path, level: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(inputs), level], capture_output=True,
                         text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def steady(pairs: dict[str, tuple[Path, dict[str, np.ndarray]]], reps: int) -> dict[str, float]:
    import onnxruntime as ort

    sessions = {}
    for name, (path, _) in pairs.items():
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 2
        sessions[name] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    times: dict[str, list[float]] = {n: [] for n in pairs}
    for _ in range(5):  # warm-up
        for n, s in sessions.items():
            s.run(None, pairs[n][1])
    for _ in range(reps):
        for n, s in sessions.items():  # interleaved: drift hits every variant alike
            t = time.perf_counter()
            s.run(None, pairs[n][1])
            times[n].append((time.perf_counter() - t) * 1e3)
    return {n: statistics.median(v) for n, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist", nargs="?", default=str(REPO / "dist"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    dist = Path(args.dist)
    report: dict[str, Any] = {"cold_start": [], "steady_state": []}

    for man in sorted((dist / "cpu-fp32").glob("*/manifest.json")):
        doc = json.loads(man.read_text())
        src, art = REPO / doc["source"]["path"], man.parent / doc["artifact"]["file"]
        inputs = REPO / "models" / f"{doc['model']}.inputs.npz"
        online, offline = [], []
        for _ in range(args.reps):
            online.append(cold_start(src, inputs, "ORT_ENABLE_ALL"))
            offline.append(cold_start(art, inputs, "ORT_DISABLE_ALL"))
        row = {"model": doc["model"]}
        for key in ("create_ms", "first_run_ms"):
            on = statistics.median(r[key] for r in online)
            off = statistics.median(r[key] for r in offline)
            row[f"online_{key}"], row[f"offline_{key}"], row[f"{key}_ratio"] = on, off, off / on
        report["cold_start"].append(row)

    for target in ("cpu-int8", "cpu-int4"):
        for man in sorted((dist / target).glob("*/manifest.json")):
            model = man.parent.name
            base = dist / "cpu-fp32" / model / "model.onnx"
            if not base.exists():
                continue
            feed = dict(np.load(REPO / "models" / f"{model}.inputs.npz"))
            med = steady({"fp32": (base, feed), target: (man.parent / "model.onnx", feed)}, args.reps * 30)
            report["steady_state"].append({"model": model, "target": target, "fp32_ms": med["fp32"],
                                           "ms": med[target], "speedup": med["fp32"] / med[target]})

    print(f"cold start, medians of {args.reps} fresh processes (offline artifact / online optimization):")
    for r in report["cold_start"]:
        print(f"  {r['model']:<18} create {r['online_create_ms']:7.1f} -> {r['offline_create_ms']:7.1f} ms "
              f"({r['create_ms_ratio']:.2f}x)   first run {r['online_first_run_ms']:6.2f} -> "
              f"{r['offline_first_run_ms']:6.2f} ms ({r['first_run_ms_ratio']:.2f}x)")
    print("steady state, interleaved medians (speed-up over the cpu-fp32 artifact):")
    for r in report["steady_state"]:
        print(f"  {r['target']:<9} {r['model']:<18} {r['fp32_ms']:7.3f} -> {r['ms']:7.3f} ms  ({r['speedup']:.2f}x)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
