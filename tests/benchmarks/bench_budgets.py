"""Budgets are bounds: `--explain-seconds` and `ortbuild tune --seconds` on PaddleOCR's text detector with a golden set
of many pages, beside CPU burners, and the peak memory of the search.

The detector (DBNet, rapidocr-onnxruntime 1.4.4's ch_PP-OCRv4_det_infer.onnx, sha256-pinned: bench_fastest.py
fetches it) gets --pages golden pages of rendered text (640x640, batch --pages: 315 MB of inputs at 64) in a temp
project with two targets: `det-int8` (int8-dynamic as `ortbuild init` writes it, `precision_search = "auto"`) and
`det-fp32`. Each target is built first with nothing to search (precision_search off, not timed); then, with
--burners `yes` processes beside it:

- `ortbuild build -t det-int8 --explain-seconds S` (the build up to date: what it does is the accuracy gate and
  the search), its wall time against S, and the search's own seconds as targets.lock (or the failure) records it;
- `ortbuild tune -t det-fp32 --seconds T`, its wall time against T (the rebuild with what it keeps included), and
  the tuning's own seconds from targets.lock.

Peak RSS is each command's own (getrusage of a wrapper's one child). Checks (exit 1 when one is missed):
each wall time within 10% of its budget plus what the command does outside it (at most --slack seconds: starting,
reading the project, the rebuild).

    python tests/benchmarks/bench_budgets.py [--pages 64] [--explain-seconds 120] [--tune-seconds 90]
        [--burners 1] [--slack 15] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import machine  # noqa: E402
from ortbuild.project import speedup  # noqa: E402
from tests.benchmarks.bench_fastest import ocr_model, page  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402


def project(root: Path, pages: int, search: str) -> Path:
    det = ocr_model("ch_PP-OCRv4_det_infer.onnx")
    if not (root / "det.inputs.npz").exists():
        np.savez(root / "det.inputs.npz", x=np.concatenate([page(i) for i in range(pages)]))
    path = root / "targets.toml"
    path.write_text(f"""[project]
name = "bench-budgets"
version = "1"

[models.det]
path = "{det}"
inputs = "det.inputs.npz"

[targets.det-fp32]
runtime = "onnxruntime=={md.version('onnxruntime')}"
providers = ["CPUExecutionProvider"]
precision = "fp32"
session = {{ intra_op_num_threads = {os.cpu_count() or 1} }}
# offline optimization moves 0.03% of the probability map's 26 M values past rtol 1e-4 / atol 1e-5 on 64 pages
accuracy = {{ mismatch_fraction = 0.01 }}

[targets.det-int8]
extends = "det-fp32"
precision = "int8-dynamic"
quantization = {{ per_channel = true, reduce_range = true }}
precision_search = "{search}"
""")
    return path


# runs one command and prints its peak RSS (KB) last on stderr: its own children only, whatever ran before
_PEAK = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")


def run(args: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """The command's wall seconds, its peak RSS (MB) and its result."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "ortbuild", *args],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - t0
    err, _, peak = proc.stderr.rstrip().rpartition("\n")
    proc.stderr = err
    return wall, int(peak) / 1024 if peak.isdigit() else float("nan"), proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--explain-seconds", type=float, default=120)
    ap.add_argument("--tune-seconds", type=float, default=90)
    ap.add_argument("--burners", type=int, default=1)
    ap.add_argument("--slack", type=float, default=15, help="seconds a command may spend outside its budget")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    print(f"CPU: {speedup.host()}, ISA flags {' '.join(machine.fingerprint()['isa_flags'])}; {os.cpu_count()} CPUs;"
          f" {a.burners} burner(s)")
    problems, out = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-budgets-") as tmp:
        root = Path(tmp)
        env = dev_keys_env(root)
        path = project(root, a.pages, "off")
        wall, _, proc = run(["build", "-c", str(path)], env)
        if proc.returncode:
            print(proc.stderr[-3000:])
            return 1
        print(f"built both targets ({a.pages} pages) in {wall:.0f} s (not timed against a budget)")
        burners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(a.burners)]
        try:
            project(root, a.pages, "auto")
            wall, rss, proc = run(["build", "-c", str(path), "-t", "det-int8", "--explain-seconds",
                                   str(a.explain_seconds), "--json"], env)
            lock = tomllib.loads((root / "targets.lock").read_text()).get("jobs", {}) \
                if (root / "targets.lock").exists() else {}
            search = lock.get("det-int8/det", {}).get("search", {})
            jobs = json.loads(proc.stdout)["jobs"] if proc.stdout else []
            said = search or {"status": jobs[0]["status"] if jobs else "?",
                              "reason": (jobs[0].get("reason", "") if jobs else proc.stderr[-500:])[:300]}
            out["explain"] = {"budget_s": a.explain_seconds, "wall_s": round(wall, 1), "peak_rss_mb": round(rss),
                              "search": said}
            print(f"build --explain-seconds {a.explain_seconds:g}: wall {wall:.0f} s, peak RSS {rss:.0f} MB; {said}")
            if wall > a.explain_seconds * 1.1 + a.slack:
                problems.append(f"the search took {wall:.0f} s of a {a.explain_seconds:g} s budget")
            wall, rss, proc = run(["tune", "-c", str(path), "-t", "det-fp32", "--seconds", str(a.tune_seconds)], env)
            lock = tomllib.loads((root / "targets.lock").read_text()).get("jobs", {}) \
                if (root / "targets.lock").exists() else {}
            tune = lock.get("det-fp32/det", {}).get("tune", {})
            out["tune"] = {"budget_s": a.tune_seconds, "wall_s": round(wall, 1), "peak_rss_mb": round(rss),
                           "tune_seconds": tune.get("seconds"), "kept": tune.get("kept"), "exit": proc.returncode}
            print(f"tune --seconds {a.tune_seconds:g}: wall {wall:.0f} s, its own {tune.get('seconds')} s, peak RSS "
                  f"{rss:.0f} MB; kept {tune.get('kept')}; exit {proc.returncode}")
            if proc.returncode:
                print(proc.stderr[-2000:])
            if wall > a.tune_seconds * 1.1 + a.slack:
                problems.append(f"tune took {wall:.0f} s of a {a.tune_seconds:g} s budget")
        finally:
            for b in burners:
                b.kill()
    if a.json:
        a.json.write_text(json.dumps({"cpu": speedup.host(), "pages": a.pages, "burners": a.burners, **out}, indent=1))
    for p in problems:
        print(f"MISSED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
