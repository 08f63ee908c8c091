"""Build-time benchmark (part of `nox -s benchmark`): full build, no-op rebuild, parallel speed-up, as ratios.

Measured side by side in one run, on the example project's CPU targets (this venv's runtime):
- plain ONNX Runtime: what a hand-written script does for the same jobs' core work (a session per model with
  `optimized_model_filepath`, the offline optimization), in one process;
- `ortbuild build --force -j 1` and `-j N` (every step: check, precision, optimize, reload, encrypt, loaders,
  sign, verify through the generated loader), in fresh processes;
- the no-op `ortbuild build` (everything up to date) and, with --nox, the no-op `python3 -m nox -s build` of
  every target in its own venv.
Medians of --reps runs, alternating the variants.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = "cpu-*"


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t


PLAIN = """
import sys, time, tempfile, onnxruntime as ort
t = time.perf_counter()
with tempfile.TemporaryDirectory() as tmp:
    for i, path in enumerate(sys.argv[1:]):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = f"{tmp}/{i}.onnx"
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
print(time.perf_counter() - t)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nox", action="store_true", help="also time the no-op `python3 -m nox -s build`")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))
    from ortbuild.pipeline.parallel import default_workers
    from ortbuild.project import config, plan

    project = config.load(REPO / "targets.toml")
    jobs = plan.jobs(project, [TARGETS])
    models = sorted({str(j.model.path) for j in jobs})
    workers, _ = default_workers(jobs)
    ortbuild = [sys.executable, "-m", "ortbuild", "build", "-t", TARGETS]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    plain_proc, serial, parallel, noop, plain_inproc = [], [], [], [], []
    _timed([*ortbuild], env)  # warm: caches, bytecode
    for _ in range(args.reps):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PLAIN, *models], capture_output=True, text=True, check=True)
        plain_proc.append(time.perf_counter() - t)
        plain_inproc.append(float(out.stdout))
        serial.append(_timed([*ortbuild, "--force", "-j", "1"], env))
        parallel.append(_timed([*ortbuild, "--force", "-j", str(workers)], env))
        noop.append(_timed(ortbuild, env))
    res = {"jobs": len(jobs), "models": len(models), "workers": workers, "cores": os.cpu_count(),
           "plain_ort_s": statistics.median(plain_proc), "plain_ort_optimize_only_s": statistics.median(plain_inproc),
           "build_serial_s": statistics.median(serial), "build_parallel_s": statistics.median(parallel),
           "noop_s": statistics.median(noop)}
    res["parallel_speedup"] = res["build_serial_s"] / res["build_parallel_s"]
    res["serial_vs_plain"] = res["build_serial_s"] / res["plain_ort_s"]
    res["noop_vs_plain"] = res["noop_s"] / res["plain_ort_s"]
    if args.nox:
        nox = [sys.executable, "-m", "nox", "-s", "build"]
        _timed(nox)
        res["nox_noop_s"] = statistics.median(_timed(nox) for _ in range(args.reps))
    print(f"{len(jobs)} jobs ({TARGETS}, {len(models)} models), {workers} workers on {os.cpu_count()} cores, "
          f"medians of {args.reps}:")
    print(f"  plain ORT offline optimization, one process      {res['plain_ort_s']:6.2f} s  (1.00x)")
    print(f"  ortbuild build --force -j 1                      {res['build_serial_s']:6.2f} s  "
          f"({res['serial_vs_plain']:.2f}x plain)")
    print(f"  ortbuild build --force -j {workers}                      {res['build_parallel_s']:6.2f} s  "
          f"(speed-up {res['parallel_speedup']:.2f}x over -j 1)")
    print(f"  ortbuild build, nothing changed                  {res['noop_s']:6.2f} s  "
          f"({res['noop_vs_plain']:.2f}x plain)")
    if args.nox:
        print(f"  python3 -m nox -s build, nothing changed         {res['nox_noop_s']:6.2f} s  "
              f"({len(project.targets)} targets, one venv each)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
