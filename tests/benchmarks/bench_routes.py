"""Benchmark: the routes by which a loader can hand decrypted weights to ONNX Runtime, against plain ORT from a path.

    python tests/benchmarks/bench_routes.py [--gib 0.25 --gib 1 --gib 2.15] [--kind mlp|conv] [--reps 5]
                                            [--json out.json]

For each size a model with external data is generated into a temp dir (never into the repository) and built once
with `ortbuild build` (fp32, `external_data = true`, encrypted, dev keys): `mlp` is tests/bigmodels.py's stack
(MatMul 4096x4096 + Add + Relu: ORT prepacks every MatMul weight into memory of its own), `conv` a stack of 3x3
Convs (1024 channels: ORT's CPU Conv reads its weights where they are, no prepacking). Then --reps rounds of
fresh processes, alternating (the order rotates each round; the page cache is warm for all), each timed from
after `import onnxruntime` to the end of the first inference, with its own peak RSS (VmHWM):

- `plain`: `InferenceSession(model.onnx)` with default options (what an app does without ortbuild);
- `offline, from a path`: the artifact's own offline-optimized graph and external data, decrypted once into the
  temp dir, opened by path as the loader opens it (`ORT_DISABLE_ALL`, parallel prepacking): no crypto, no memory
  of its own, the floor of any route;
- `memory, ORT copies`: that external data read into fresh anonymous memory (what a loader's decryption leaves,
  without the crypto), handed over with `add_external_initializers_from_files_in_memory`: ORT copies it;
- `memory, borrowed` (the generated loader's route): the same buffer with
  `session.use_external_initializer_file_buffers_directly = 1` (ORT reads it in place) and parallel prepacking;
  the graph by path, as the loader's memory file is;
- `OrtValues over the buffer`: one `OrtValue.ortvalue_from_numpy` view per initializer into the same buffer
  (offsets from the graph, read beforehand), handed over with `add_external_initializers(names, values)`,
  parallel prepacking;
- `loader, 4 KiB pages` / `loader, huge pages`: the generated Python loader (signature, one pass of read + sha256
  + decrypt on every core, the borrowed route), its external data in 4 KiB pages (`load(huge_pages=False)`) or in
  transparent huge pages (`load(huge_pages=True)`); by default it takes huge pages from 2 GiB of external data.

The first line says the machine class (x86-64 level and the ISA flags that matter here: AVX2, AVX-512, VNNI,
SHA-NI, VAES) and whether the VM reports free pages to its host (then memory a process touches for the first time
costs host faults: see docs/loaders.md, Memory and speed). Prints a markdown table per size (medians; ratios to
plain); --json writes every run.
"""

from __future__ import annotations

import argparse
import json
import os
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
from tests.bigmodels import ALIGN, dev_keys_env, mlp  # noqa: E402

MB = 1_000_000
LOADER_4K, LOADER_HUGE = "loader, 4 KiB pages", "loader, huge pages"
MODES = ("plain", "offline, from a path", "memory, ORT copies", "memory, borrowed", "OrtValues over the buffer",
         LOADER_4K, LOADER_HUGE)

CHILD = r"""
import json, mmap, os, sys, time
mode, model, inputs = sys.argv[1:4]
import numpy as np
import onnxruntime as ort
feed = dict(np.load(inputs))
t0 = time.perf_counter()
folder = os.path.dirname(model)
so = ort.SessionOptions()
keep = None
if mode.startswith("loader"):
    import importlib
    sys.path.insert(0, model + "/loader")
    loader = importlib.import_module("ortbuild_" + os.path.basename(model))
    session = loader.load(folder=model, huge_pages=mode.endswith("huge pages"))
    t1 = time.perf_counter()
    session.run(feed)
else:
    if mode != "plain":  # the artifact's offline-optimized graph, opened as the loader opens it
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.prepack.enable_parallel", "1" if mode != "memory, ORT copies" else "0")
    if mode.startswith("memory") or mode.startswith("OrtValues"):
        layout = json.load(open(os.path.join(folder, "layout.json")))
        data = os.path.join(folder, layout["data"])
        n = os.path.getsize(data)
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # fresh memory, as a decryption fills
        with open(data, "rb", buffering=0) as f:
            view = memoryview(buf)
            got = 0
            while got < n:
                got += f.readinto(view[got:got + (4 << 20)])
            del view
        if mode.startswith("memory"):
            if mode == "memory, borrowed":
                so.add_session_config_entry("session.use_external_initializer_file_buffers_directly", "1")
            so.add_external_initializers_from_files_in_memory([layout["data"]], [buf], [n])
            keep = buf
        else:
            whole = np.frombuffer(buf, dtype=np.uint8)
            names, values = [], []
            for name, at, length, dtype, dims in layout["initializers"]:
                names.append(name)
                values.append(ort.OrtValue.ortvalue_from_numpy(whole[at:at + length].view(dtype).reshape(dims)))
            so.add_external_initializers(names, values)
            keep = (buf, values)
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    session.run(None, feed)
t2 = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"seconds": t2 - t0, "session": t1 - t0, "peak_rss": int(status["VmHWM"].split()[0]) * 1024}))
"""


def conv_stack(out: Path, gib: float, channels: int = 1024) -> Path:
    """out/model.onnx: 3x3 Convs of `channels` channels with their weights in model.onnx.data (page-aligned)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    out.mkdir(parents=True, exist_ok=True)
    layer = channels * channels * 9 * 4
    layers = max(1, round(gib * (1 << 30) / layer))
    rng = np.random.default_rng(0)
    scale = np.float32((2 / (9 * channels)) ** 0.5)
    nodes, inits = [], []
    with open(out / "model.onnx.data", "wb") as data:
        for i in range(layers):
            w = rng.standard_normal((channels, channels, 3, 3), dtype=np.float32) * scale
            data.write(b"\0" * (-data.tell() % ALIGN))
            t = TensorProto(name=f"W{i}", data_type=TensorProto.FLOAT, dims=w.shape, data_location=TensorProto.EXTERNAL)
            for k, v in (("location", "model.onnx.data"), ("offset", str(data.tell())), ("length", str(w.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            data.write(w.tobytes())
            inits.append(t)
            x = "x" if i == 0 else f"h{i - 1}"
            nodes += [helper.make_node("Conv", [x, f"W{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                      helper.make_node("Relu", [f"c{i}"], [f"h{i}" if i < layers - 1 else "y"])]
    shape: list[int | str] = ["batch", channels, 8, 8]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortbuild-tests")
    model.ir_version = 9
    onnx.save_model(model, str(out / "model.onnx"))
    np.savez(out / "inputs.npz", x=rng.standard_normal((1, channels, 8, 8), dtype=np.float32))
    return out / "model.onnx"


def layout(model: Path) -> None:
    """model's folder/layout.json: its external data file and (name, offset, length, numpy dtype, dims) of each
    external initializer, for the children (parsed here, so that no child pays for importing onnx)."""
    import onnx

    rows, files = [], set()
    for t in onnx.load(str(model), load_external_data=False).graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if info:
            files.add(info["location"])
            rows.append((t.name, int(info.get("offset", 0)), int(info["length"]),
                         onnx.helper.tensor_dtype_to_np_dtype(t.data_type).str, list(t.dims)))
    assert len(files) == 1, f"{model}: one external data file expected, found {sorted(files)}"
    (model.parent / "layout.json").write_text(json.dumps({"data": files.pop(), "initializers": rows}))


def decrypted(artifact: Path, out: Path, env: dict[str, str]) -> Path:
    """The artifact's offline-optimized graph and external data in plaintext under out (a temp dir), decrypted by
    its own loader module: what the routes hand to ONNX Runtime. Returns out/<the graph's location>."""
    import importlib

    sys.path.insert(0, str(artifact / "loader"))
    try:
        mod: Any = importlib.import_module(f"ortbuild_{artifact.name}")
    finally:
        sys.path.pop(0)
    key = mod._read_key_file(env["ORTBUILD_KEY_FILE"])
    out.mkdir()
    graph = out
    for entry in json.loads((artifact / "manifest.json").read_text())["artifact"]["files"]:
        plaintext = mod.decrypt_container((artifact / entry["name"]).read_bytes(), key)
        (out / entry["location"]).write_bytes(bytes(plaintext))
        if entry["role"] == "model":
            graph = out / entry["location"]
    return graph


def build(root: Path, name: str) -> tuple[Path, dict[str, str]]:
    """The artifact folder of root/name/model.onnx (fp32, external data, encrypted) and the children's env."""
    flavor = installed.installed_flavor()
    assert flavor is not None, "needs a venv with one ONNX Runtime flavor"
    (root / "targets.toml").write_text(
        f'[project]\nname = "bench-routes"\nversion = "1"\n\n[models.{name}]\npath = "{name}/model.onnx"\n'
        f'inputs = "{name}/inputs.npz"\n\n[targets.cpu]\nruntime = "{flavor.distribution}=={flavor.version}"\n'
        'providers = ["CPUExecutionProvider"]\nexternal_data = true\noptimization = "basic"\n')
    env = {**dev_keys_env(root), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-j", "1"], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} did not build:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return root / "dist" / "cpu" / name, env


def bench(gib: float, kind: str, reps: int, root: Path) -> dict[str, Any]:
    name = f"{kind}{round(gib * 100)}"
    source = (mlp(root / name, layers=max(1, round(gib * (1 << 30) / (4 * 4096 * 4097)))) if kind == "mlp"
              else conv_stack(root / name, gib))
    artifact, env = build(root, name)
    offline = decrypted(artifact, root / "offline", env)
    layout(offline)
    weights = (source.parent / "model.onnx.data").stat().st_size
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for r in range(reps):
        for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
            where = artifact if mode.startswith("loader") else source if mode == "plain" else offline
            out = subprocess.run([sys.executable, "-c", CHILD, mode, str(where), str(source.parent / "inputs.npz")],
                                 cwd=root, env=env, capture_output=True, text=True, timeout=1800)
            if out.returncode != 0:
                raise SystemExit(f"{mode} failed on {name}:\n{out.stderr[-2000:]}")
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    data_bytes = (offline.parent / json.loads((offline.parent / "layout.json").read_text())["data"]).stat().st_size
    return {"model": name, "kind": kind, "weights": weights, "data_bytes": data_bytes, "runs": runs}


def table(result: dict[str, Any]) -> str:
    runs = result["runs"]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "session", "peak_rss")}
           for m, rs in runs.items()}
    plain = med["plain"]
    reps = len(runs["plain"])
    lines = [f"#### {result['model']} ({result['weights'] / MB:.0f} MB of weights), medians of {reps} alternating "
             "fresh processes", "",
             "| route | time to first inference | of which until the session exists | peak RSS | time / plain | "
             "peak RSS / plain |", "|---|---|---|---|---|---|"]
    default = LOADER_HUGE if result["data_bytes"] >= 2 << 30 else LOADER_4K  # the loader's _HUGE_FROM
    for mode, row in med.items():
        label = mode + (" (the default at this size)" if mode == default else "")
        lines.append(f"| {label} | {row['seconds']:.2f} s | {row['session']:.2f} s | {row['peak_rss'] / MB:.0f} MB | "
                     f"**{row['seconds'] / plain['seconds']:.2f}x** | **{row['peak_rss'] / plain['peak_rss']:.2f}x** |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, action="append", help="weights per model (default 0.25)")
    ap.add_argument("--kind", choices=("mlp", "conv"), default="mlp")
    ap.add_argument("--reps", type=int, default=5, help="rounds of fresh processes (medians)")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    print(f"# {describe()}; load average {os.getloadavg()[0]:.2f}")
    results = []
    with tempfile.TemporaryDirectory(prefix="ortbuild-bench-routes-") as tmp:
        for gib in args.gib or [0.25]:
            root = Path(tmp) / f"g{gib}"
            root.mkdir()
            results.append(bench(gib, args.kind, args.reps, root))
            print(table(results[-1]) + "\n", flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f} after")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": describe(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
