"""Benchmark: the generated Python loader against plain onnxruntime, on external-data models, in fresh processes.

    python tests/benchmarks/bench_loader.py [--size 100M --size 512M] [--big] [--runs 5] [--json out.json]

For each size an MLP stack (MatMul 4096x4096 + Add + Relu per layer, weights in model.onnx.data:
tests/bigmodels.py) is generated into a temp dir (never into the repository) and built with `ortbuild build`
(`external_data = true`, dev keys from `ortbuild keygen --dev`). Then, alternating fresh processes (the page
cache is warm for all), each process timed from before `import onnxruntime` to the end of the first inference,
with its own peak RSS (VmHWM, read by the process itself: a spawned child's ru_maxrss can start at its parent's):
- plain:      `onnxruntime.InferenceSession(source model.onnx)` with default options;
- plain+par:  the same with `session.prepack.enable_parallel = 1`, which the loader sets (so the loader's share of
              the gain shows);
- loader:     `ortbuild_<model>.load()` (verify signature, read + sha256 + decrypt, session) + `run()`.
Medians over --runs. --big adds a ~2.5 GB model (building models past 2 GB needs a build that can).
Then the decrypt rate of container v1 and what bounds it (sha256, first-touch page faults, the GIL), measured
in this process. Prints a markdown table; --json writes the figures too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import installed  # noqa: E402
from tests.benchmarks.machine_class import describe  # noqa: E402
from tests.bigmodels import dev_keys_env, mlp  # noqa: E402

MB = 1_000_000
WIDTH = 4096
LAYER_BYTES = 4 * WIDTH * (WIDTH + 1)

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
mode, where, inputs = sys.argv[1:4]
import numpy as np
import onnxruntime as ort
feed = dict(np.load(inputs))
if mode == "loader":
    sys.path.insert(0, where + "/loader")
    import importlib
    loader = importlib.import_module("ortbuild_" + where.rsplit("/", 1)[-1])  # its model: mlpN, an identifier
    model = loader.load(folder=where)
    t1 = time.perf_counter()
    model.run(feed)
else:
    so = ort.SessionOptions()
    if mode == "plain+par":
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
    session = ort.InferenceSession(where, so, providers=["CPUExecutionProvider"])
    t1 = time.perf_counter()
    session.run(None, feed)
t2 = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
kib = lambda k: int(status[k].split()[0]) * 1024
print(json.dumps({"seconds": t2 - t0, "session": t1 - t0, "peak_rss": kib("VmHWM"), "rss_after": kib("VmRSS")}))
"""

MODES = ("plain", "plain+par", "loader")


def parse_size(text: str) -> int:
    units = {"K": 1_000, "M": MB, "G": 1_000 * MB}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def build(root: Path, sizes: list[int]) -> tuple[dict[str, int], dict[str, str]]:
    """Generate the models and build their artifacts; returns {model name: weight bytes} and the child env."""

    flavor = installed.installed_flavor()
    assert flavor is not None, "needs a venv with one ONNX Runtime flavor"
    text = '[project]\nname = "bench-loader"\nversion = "1"\n\n'
    weights = {}
    for size in sizes:
        layers = max(1, round(size / LAYER_BYTES))
        name = f"mlp{layers}"
        if name in weights:
            continue
        mlp(root / name, layers=layers, width=WIDTH)
        weights[name] = (root / name / "model.onnx.data").stat().st_size
        text += f'[models.{name}]\npath = "{name}/model.onnx"\ninputs = "{name}/inputs.npz"\n\n'
    text += (f'[targets.cpu]\nruntime = "{flavor.distribution}=={flavor.version}"\n'
             'providers = ["CPUExecutionProvider"]\nexternal_data = true\noptimization = "basic"\n')
    (root / "targets.toml").write_text(text)
    env = dev_keys_env(root)
    ortbuild = [sys.executable, "-m", "ortbuild"]
    for name in weights:
        proc = subprocess.run([*ortbuild, "build", "-j", "1", "-m", name], cwd=root, env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            print(f"# {name} ({weights[name] / MB:.0f} MB) did not build, skipped:\n{proc.stdout[-1500:]}"
                  f"{proc.stderr[-1500:]}", file=sys.stderr)
            shutil.rmtree(root / name)
    return {n: w for n, w in weights.items() if (root / n).exists()}, env


def child(mode: str, root: Path, name: str, env: dict[str, str], where: Path | None = None) -> dict[str, float]:
    """One fresh process; `where` (default: the built artifact, or the source model for plain) is an artifact
    folder named after its model, or a model.onnx."""
    where = where or (root / "dist" / "cpu" / name if mode == "loader" else root / name / "model.onnx")
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(where), str(root / name / "inputs.npz")],
                         cwd=root, env=env, check=True, capture_output=True, text=True, timeout=900).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def first_inference(root: Path, weights: dict[str, int], env: dict[str, str], runs: int) -> list[dict[str, Any]]:
    rows = []
    for name, size in weights.items():
        got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(runs):  # alternating, so every mode sees the same machine state
            for mode in MODES:
                got[mode].append(child(mode, root, name, env))
        med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in got.items()}
        rows.append({"model": name, "weights": size, "runs": runs, **med,
                     "time_ratio": med["loader"]["seconds"] / med["plain"]["seconds"],
                     "rss_ratio": med["loader"]["peak_rss"] / med["plain"]["peak_rss"],
                     "loader_seconds_all": [r["seconds"] for r in got["loader"]],
                     "plain_seconds_all": [r["seconds"] for r in got["plain"]]})
    return rows


# ------------------------------------------------------------------------------------------- decrypt rate

def best(fn: Callable[[], Any], reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def decrypt_rates(total: int = 256 << 20) -> dict[str, float]:
    """GB/s of the pieces of a load, one core unless said (best of 5): where container v1 decryption goes."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from ortbuild.artifact import container

    key = os.urandom(32)
    plain = os.urandom(total)
    ct = container.encrypt(plain, key)
    header = container.parse_header(ct)
    aead = AESGCM(container.unwrap(header, key))
    aad, csize, chunks = header.payload_header, 1 << header.chunk_log2, header.chunks
    nonces = [header.nonce_prefix + struct.pack(">IB", i, i == chunks - 1) for i in range(chunks)]
    view = memoryview(ct)

    def stream(dst: Any) -> None:
        out = memoryview(dst)
        for i in range(chunks):
            at = container.HEADER + i * (csize + 16)
            aead.decrypt_into(nonces[i], view[at:at + csize + 16], aad, out[i * csize:(i + 1) * csize])

    hot_ct, hot_out = bytes(view[container.HEADER:container.HEADER + csize + 16]), bytearray(csize)
    warm = bytearray(total)
    rates = {
        "decrypt_into, 1 MiB chunk, source and destination in cache": (256 * csize) / best(
            lambda: [aead.decrypt_into(nonces[0], hot_ct, aad, hot_out) for _ in range(256)]),
        "decrypt_into, container in RAM -> touched buffer (the loader's pass)": total / best(lambda: stream(warm)),
        "decrypt_into, container in RAM -> fresh map (first-touch faults)": total / best(
            lambda: stream(_fresh_map(total))),
        "container.decrypt (allocates bytearray(size): memset + faults)": total / best(
            lambda: container.decrypt(ct, key), reps=3),
        "sha256 (hashlib)": total / best(lambda: hashlib.sha256(ct)),
        "first touch of fresh memory (page faults, 4 KiB pages)": total / best(lambda: _touch(total)),
        "populate fresh memory (MADV_POPULATE_WRITE)": total / best(lambda: _populate(total)),
    }
    rates = {k: v / 1e9 for k, v in rates.items()}
    # the GIL: decrypt on this thread while another hashes; if both let go of it, the pair takes max(), not sum()
    t_dec, t_hash = best(lambda: stream(warm), 3), best(lambda: hashlib.sha256(ct), 3)

    def both() -> None:
        th = threading.Thread(target=hashlib.sha256, args=(ct,))
        th.start()
        stream(warm)
        th.join()

    t_both = best(both, 3)
    rates["decrypt || sha256 on two threads: overlap (1 = fully parallel, 0 = serial)"] = (
        (t_dec + t_hash - t_both) / min(t_dec, t_hash))
    for size in (16 << 10, 1 << 20):
        try:
            out = subprocess.run(["openssl", "speed", "-seconds", "1", "-bytes", str(size), "-evp", "aes-256-gcm"],
                                 capture_output=True, text=True, timeout=60).stdout
            rates[f"openssl speed -evp aes-256-gcm, {size >> 10} KiB"] = float(
                out.strip().splitlines()[-1].split()[-1].rstrip("k")) * 1000 / 1e9
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            pass
    return rates


def _fresh_map(n: int) -> mmap.mmap:
    """Fresh private anonymous memory, as the loader allocates it."""
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _touch(n: int) -> None:
    m = _fresh_map(n)
    for off in range(0, n, 4096):
        m[off] = 1
    m.close()


def _populate(n: int) -> None:
    import ctypes

    m = _fresh_map(n)
    anchor = (ctypes.c_char * n).from_buffer(m)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(n), 23)
    del anchor
    m.close()


def table(rows: list[dict[str, Any]], rates: dict[str, float]) -> str:
    lines = ["| model | weights | plain | plain + parallel prepack | loader | loader / plain | peak RSS plain | "
             "peak RSS loader | RSS loader / plain | RSS after load (plain / loader) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p, pp, lo = r["plain"], r["plain+par"], r["loader"]
        lines.append(f"| {r['model']} | {r['weights'] / MB:.0f} MB | {p['seconds']:.2f} s | {pp['seconds']:.2f} s | "
                     f"{lo['seconds']:.2f} s | **{r['time_ratio']:.2f}x** | {p['peak_rss'] / MB:.0f} MB | "
                     f"{lo['peak_rss'] / MB:.0f} MB | **{r['rss_ratio']:.2f}x** | "
                     f"{p['rss_after'] / MB:.0f} / {lo['rss_after'] / MB:.0f} MB |")
    lines += ["", "| container v1 decryption, and what bounds a load | GB/s |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in rates.items()]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", action="append", help="weight bytes per model, e.g. 100M, 0.5G (default 100M, 512M)")
    ap.add_argument("--big", action="store_true", help="add a ~2.5 GB model")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in (a.size or ["100M", "512M"])] + ([2500 * MB] if a.big else [])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        weights, env = build(Path(tmp), sizes)
        rows = first_inference(Path(tmp), weights, env, a.runs)
    rates = decrypt_rates()
    print(f"# {describe()}")
    print(f"# {os.cpu_count()} CPUs; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; medians of "
          f"{a.runs} runs")
    print(table(rows, rates))
    if a.json:
        Path(a.json).write_text(json.dumps({"first_inference": rows, "rates": rates}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
