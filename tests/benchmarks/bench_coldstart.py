"""Benchmark: cold start of a small, many-layer model through the generated Python loader, against plain ORT.

    python tests/benchmarks/bench_coldstart.py [--runs 21] [--baseline-ortbuild /path/to/other/checkout]
                                                [--json out.json] [--keep DIR]

The model is tests/bigmodels.py's transformer_like (48 layers, 2,017 nodes, 9.7 MB, LayerNorm and GELU written
out as primitive ops, so ORT's online optimizer has real work), generated into a temp dir (never into the
repository) and built by ortbuild for one target: fp32, optimization "all", encrypted (the defaults), dev keys
from `ortbuild keygen --dev`. Fresh processes, alternating (the order rotates every round), each timed from
after its imports (numpy, onnxruntime, and for the loader its module) to the end of the first inference:

- plain:    `onnxruntime.InferenceSession(source model.onnx)` with default options, then run();
- offline:  the same artifact's optimized graph, decrypted once into the temp dir, opened by path with
            ORT_DISABLE_ALL and default options, then run() (what the offline graph costs with no crypto);
- loader:   `ortbuild_<model>.load()` + `run()`, with where its time goes (signature, side files, key, the
            read/hash/decrypt pass, session creation, first run), timed by wrapping the loader's own functions;
- loader (baseline): with --baseline-ortbuild, the same project built by another ortbuild checkout (e.g. the
            main branch) into a copy, so a change to the loader is measured before/after in one run.

numpy's OpenBLAS starts a worker per core at `import numpy`, and it spins for about 0.1 s: on a 2-core machine it
takes the second core from whatever runs right after the imports (the loader's hashing thread, ORT's intra-op
threads). None of the modes uses BLAS, so the children run with OPENBLAS_NUM_THREADS=1 (an import's aftermath,
excluded like the import), unless --openblas-default.

Medians of wall time and of the process's CPU time (both threads; steadier than wall time on a shared machine),
and each mode's median as a ratio of plain's. The import times are measured too (in their own fresh processes):
the loader imports cryptography at module import, so `import ortbuild_<model>` is shown beside `import onnxruntime`.
Prints markdown; --json writes every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import installed  # noqa: E402
from tests.benchmarks.machine_class import describe  # noqa: E402
from tests.bigmodels import dev_keys_env, transformer_like  # noqa: E402

MODEL = "tlike48"

CHILD = r"""
import json, os, sys, time
mode, where, inputs = sys.argv[1:4]
profile = sys.argv[4] if len(sys.argv) > 4 else None  # ORT's profiler on: its session phases, not the time
import numpy as np
import onnxruntime as ort
feed = dict(np.load(inputs))
T = {}
if mode.startswith("loader"):
    sys.path.insert(0, where + "/loader")
    import importlib
    loader = importlib.import_module("ortbuild_" + where.rstrip("/").rsplit("/", 1)[-1])

    def wrap(mod, name, label):
        fn = getattr(mod, name, None)
        if fn is None:
            return
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                T[label] = T.get(label, 0.0) + (time.perf_counter() - t) * 1e3
        setattr(mod, name, timed)

    for name, label in (("verify", "signature_ms"), ("_check_side_files", "side_files_ms"), ("_key", "key_ms"),
                        ("_open_file", "read_hash_decrypt_ms")):
        wrap(loader, name, label)
    wrap(ort, "InferenceSession", "session_ms")
    c0, t0 = time.process_time(), time.perf_counter()
    model = loader.load(folder=where, profile=profile)
    t1 = time.perf_counter()
    model.run(feed)
    session = model.session
else:
    c0, t0 = time.process_time(), time.perf_counter()
    so = ort.SessionOptions()
    if mode == "offline":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if profile:
        so.enable_profiling, so.profile_file_prefix = True, profile
    session = ort.InferenceSession(where, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    T["session_ms"] = (t1 - t0) * 1e3
    session.run(None, feed)
t2, c2 = time.perf_counter(), time.process_time()
T.update(total_ms=(t2 - t0) * 1e3, cpu_ms=(c2 - c0) * 1e3, load_ms=(t1 - t0) * 1e3, first_run_ms=(t2 - t1) * 1e3)
if profile:
    trace = session.end_profiling()
    for e in json.load(open(trace)):
        if e.get("cat") == "Session":  # model_loading_uri/_array, session_initialization, model_run
            name = "model_loading" if e["name"].startswith("model_loading") else e["name"]
            T["ort_" + name + "_ms"] = T.get("ort_" + name + "_ms", 0.0) + e["dur"] / 1e3
    os.remove(trace)
print(json.dumps(T))
"""

IMPORTS = r"""
import sys, time
t0 = time.perf_counter()
import numpy, onnxruntime
t1 = time.perf_counter()
sys.path.insert(0, sys.argv[1] + "/loader")
import importlib
importlib.import_module("ortbuild_" + sys.argv[1].rstrip("/").rsplit("/", 1)[-1])
t2 = time.perf_counter()
print((t1 - t0) * 1e3, (t2 - t1) * 1e3)
"""

TARGETS = """[project]
name = "bench-coldstart"
version = "1"

[models.{model}]
path = "{model}/model.onnx"
inputs = "{model}/inputs.npz"

[targets.cpu]
runtime = "{runtime}"
providers = ["CPUExecutionProvider"]
precision = "fp32"
optimization = "all"
"""


def build(root: Path, env: dict[str, str], ortbuild_path: Path) -> Path:
    """`ortbuild build` of the project in root with the ortbuild at ortbuild_path; the artifact's folder."""
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-j", "1"], cwd=root,
                          env={**env, "PYTHONPATH": str(ortbuild_path)}, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"build with {ortbuild_path} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return root / "dist" / "cpu" / MODEL


def prepare(root: Path, baseline: Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    """The model, its artifact(s) and the offline graph in plaintext (temp dir only); {mode: what it opens}."""

    flavor = installed.installed_flavor()
    assert flavor is not None, "needs a venv with one ONNX Runtime flavor"
    transformer_like(root / MODEL)
    (root / "targets.toml").write_text(TARGETS.format(model=MODEL, runtime=f"{flavor.distribution}=={flavor.version}"))
    env = dev_keys_env(root)
    where = {"plain": root / MODEL / "model.onnx", "loader": build(root, env, REPO)}
    if baseline is not None:
        other = root / "baseline"
        other.mkdir()
        for name in (MODEL, "keys", "targets.toml"):
            (shutil.copytree if (root / name).is_dir() else shutil.copy)(root / name, other / name)
        where["loader (baseline)"] = build(other, env, baseline)
    # the offline graph without crypto: the artifact's own plaintext, decrypted by its loader (temp dir only)
    sys.path.insert(0, str(where["loader"] / "loader"))
    import importlib

    mod: Any = importlib.import_module(f"ortbuild_{MODEL}")
    key = mod._read_key_file(env["ORTBUILD_KEY_FILE"])
    offline = root / "offline.onnx"
    offline.write_bytes(bytes(mod.decrypt_container((where["loader"] / "model.onnx.enc").read_bytes(), key)))
    where["offline"] = offline
    return where, env


def child(mode: str, where: Path, inputs: Path, env: dict[str, str], profile: str = "") -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(where), str(inputs)] + ([profile] if profile else []),
                         env=env, check=True, capture_output=True, text=True, timeout=300).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def measure(where: dict[str, Path], inputs: Path, env: dict[str, str], runs: int,
            profile: str = "") -> dict[str, list[dict[str, float]]]:
    modes = ["plain", "offline", "loader"] + (["loader (baseline)"] if "loader (baseline)" in where else [])
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for i in range(runs):  # alternating; the order rotates so no mode always runs first
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
            got[mode].append(child(mode.split(" ")[0], where[mode], inputs, env, profile))
    return got


def phases(got: dict[str, list[dict[str, float]]]) -> str:
    """ORT's own profiler's session phases (medians): model loading (parse, graph, resolve) and initialization."""
    lines = ["| mode | ORT model loading | ORT session initialization | ORT first run (model_run) |",
             "|---|---|---|---|"]
    for mode, rs in got.items():
        med = [statistics.median(r.get(k, 0.0) for r in rs)
               for k in ("ort_model_loading_ms", "ort_session_initialization_ms", "ort_model_run_ms")]
        lines.append(f"| {mode} | " + " | ".join(f"{v:.1f}" for v in med) + " |")
    return "\n".join(lines)


def imports(loader: Path, env: dict[str, str], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", IMPORTS, str(loader)], env=env, check=True, capture_output=True,
                             text=True, timeout=300).stdout.split()
        samples.append((float(out[0]), float(out[1])))
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


COLUMNS = [("total_ms", "load to first output"), ("cpu_ms", "CPU time"), ("signature_ms", "signature"),
           ("side_files_ms", "side files"), ("key_ms", "key"), ("read_hash_decrypt_ms", "read + sha256 + decrypt"),
           ("session_ms", "session creation"), ("first_run_ms", "first run")]


def table(got: dict[str, list[dict[str, float]]]) -> str:
    med = {m: {k: statistics.median(r.get(k, 0.0) for r in rs) for k, _ in COLUMNS} for m, rs in got.items()}
    plain = med["plain"]
    lines = ["| mode | " + " | ".join(title for _, title in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for mode, row in med.items():
        cells = []
        for k, _ in COLUMNS:
            if k in ("total_ms", "cpu_ms"):
                cells.append(f"{row[k]:.1f} ms (**{row[k] / plain[k]:.2f}x**)")
            else:
                cells.append(f"{row[k]:.1f}" if any(k in r for r in got[mode]) else "-")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--baseline-ortbuild", type=Path, help="another ortbuild checkout to build a 'before' loader with")
    ap.add_argument("--json")
    ap.add_argument("--keep", type=Path, help="work in this (new) directory and keep it")
    ap.add_argument("--openblas-default", action="store_true",
                    help="leave OPENBLAS_NUM_THREADS as it is in the children (numpy's workers spin after import)")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-coldstart-") as tmp:
        root = a.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        where, env = prepare(root, a.baseline_ortbuild)
        if not a.openblas_default:
            env = {**env, "OPENBLAS_NUM_THREADS": "1"}
        got = measure(where, root / MODEL / "inputs.npz", env, a.runs)
        ort_import, loader_import = imports(where["loader"], env, max(5, a.runs // 3))
        profiled = measure(where, root / MODEL / "inputs.npz", env, max(5, a.runs // 3), str(root / "profile"))
    blas = "as set" if a.openblas_default else "1"
    print(f"# {describe()}")
    print(f"# {os.cpu_count()} CPUs; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; medians of "
          f"{a.runs} fresh processes per mode, alternating; OPENBLAS_NUM_THREADS {blas}; ms, ratios to plain")
    print(table(got))
    print(f"\nimports (excluded above), medians: numpy + onnxruntime {ort_import:.1f} ms; then the loader module "
          f"{loader_import:.1f} ms")
    print(f"\nInside session creation, ORT's profiler (separate runs with it on), medians of {max(5, a.runs // 3)}, "
          "ms:")
    print(phases(profiled))
    if a.json:
        Path(a.json).write_text(json.dumps({"samples": got, "profiled": profiled, "import_onnxruntime_ms": ort_import,
                                            "import_loader_ms": loader_import}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
