"""Benchmark: the generated Python loader vs plain onnxruntime, side by side in one run, fresh processes.

    python tests/benchmarks/bench_loader.py [--runs N]

Models are generated into a temp dir at run time (never into the repository):
  many-layer  48 small transformer-like layers (MatMul+Add+Relu+MatMul+Add+residual+LayerNorm), ~10 MB
  large       16 x 1792x1792 MatMul+Relu, ~200 MB, built with external data (and embedded, for comparison)
Cold start = read + verify + decrypt + create session + first run (loader), vs InferenceSession(source.onnx)
with default options + first run (plain), each in a new process after `import onnxruntime`. Also: decrypt
throughput of container v1 and the peak RSS (ru_maxrss) of each process.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortbuild import config, container, keys, plan
from ortbuild.build import Builder

KEY, SEED = os.urandom(32), os.urandom(32)


def many_layer(path: Path, layers: int = 48, d: int = 96, ff: int = 256) -> None:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        def w(name: str, *shape: int) -> str:
            inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name))
            return name
        nodes += [
            helper.make_node("MatMul", [x, w(f"w1_{i}", d, ff)], [f"h{i}"]),
            helper.make_node("Add", [f"h{i}", w(f"b1_{i}", ff)], [f"ha{i}"]),
            helper.make_node("Relu", [f"ha{i}"], [f"hr{i}"]),
            helper.make_node("MatMul", [f"hr{i}", w(f"w2_{i}", ff, d)], [f"o{i}"]),
            helper.make_node("Add", [f"o{i}", w(f"b2_{i}", d)], [f"oa{i}"]),
            helper.make_node("Add", [f"oa{i}", x], [f"r{i}"]),
            helper.make_node("LayerNormalization", [f"r{i}", w(f"g{i}", d), w(f"be{i}", d)], [f"y{i}"], axis=-1),
        ]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "many_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64, d])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, 64, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


def large(path: Path, layers: int = 16, d: int = 1792) -> None:
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((d, d)) * 0.02).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"y{i}"])]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "large", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
mode, target, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
t0 = time.perf_counter()
if mode == "plain":
    sess = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": x})
    prep = 0.0
else:
    sys.path.insert(0, target)
    import ortbuild_loader as L
    m = L.load()
    t_load = time.perf_counter()
    m.run({"x": x})
    hwm_run = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    # the crypto share, measured again after the fact: verify + read + check digests + decrypt
    tp = time.perf_counter()
    man = L.verify()
    [L.decrypt_container(d, None) for d in L._read_files(L.HERE, man).values()]
    prep = time.perf_counter() - tp
t1 = time.perf_counter() if mode == "plain" else t_load + (tp - t_load)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
hwm = hwm if mode == "plain" else hwm_run
print(json.dumps({"seconds": t1 - t0, "crypto_seconds": prep, "peak_rss_mb": hwm / 1024}))
"""


def child(mode: str, target: str, shape: list[int]) -> dict[str, float]:
    env = {**os.environ, "ORTBUILD_KEY": base64.b64encode(KEY).decode()}
    out = subprocess.run([sys.executable, "-c", CHILD, mode, target, json.dumps(shape)], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    from ortbuild import runtime

    flavor = runtime.installed_flavor()
    assert flavor is not None
    with tempfile.TemporaryDirectory(prefix="ortbuild-bench-") as tmp:
        root = Path(tmp)
        many_layer(root / "many_layer.onnx")
        large(root / "large.onnx")
        np.savez(root / "many.npz", x=np.zeros((8, 64, 96), np.float32))
        np.savez(root / "large.npz", x=np.zeros((4, 1792), np.float32))
        (root / "targets.toml").write_text(f"""
[project]
name = "bench"
version = "1"
[models.many_layer]
path = "many_layer.onnx"
inputs = "many.npz"
[models.large]
path = "large.onnx"
inputs = "large.npz"
[targets.cpu]
runtime = "{flavor.distribution}=={flavor.version}"
providers = ["CPUExecutionProvider"]
session = {{ intra_op_num_threads = 2 }}
[targets.cpu-ext]
extends = "cpu"
external_data = true
models = ["large"]
""")
        project = config.load(root / "targets.toml")
        enc = keys.EncryptionKey(KEY, "bench")
        sign = keys.signing_key(SEED)
        results = Builder(project, root / "dist", progress=lambda j, m: None, enc_key=enc, sign_key=sign).run(
            plan.jobs(project))
        assert all(r.status == "built" for r in results), [r.reason for r in results]

        report = {}
        cases = [("many_layer (10 MB, 48 layers)", "cpu", "many_layer", [8, 64, 96]),
                 ("large (200 MB), embedded", "cpu", "large", [4, 1792]),
                 ("large (200 MB), external data", "cpu-ext", "large", [4, 1792])]
        for title, target, model, shape in cases:
            runs = args.runs if model == "many_layer" else max(3, args.runs // 2)
            plain, loader = [], []
            for _ in range(runs):  # interleaved, so both see the same machine state
                plain.append(child("plain", str(root / f"{model}.onnx"), shape))
                loader.append(child("loader", str(root / "dist" / target / model / "loader"), shape))
            p = statistics.median(r["seconds"] for r in plain)
            lo = statistics.median(r["seconds"] for r in loader)
            prss = max(r["peak_rss_mb"] for r in plain)
            lrss = max(r["peak_rss_mb"] for r in loader)
            crypto = statistics.median(r["crypto_seconds"] for r in loader)
            report[title] = {"plain_ms": round(p * 1000, 1), "loader_ms": round(lo * 1000, 1),
                             "loader_crypto_ms": round(crypto * 1000, 1),
                             "cold_start_ratio": round(lo / p, 3), "plain_peak_rss_mb": round(prss),
                             "loader_peak_rss_mb": round(lrss), "rss_ratio": round(lrss / prss, 3)}
        data = (root / "large.onnx").read_bytes()
        ct = container.encrypt(data, KEY)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            container.decrypt(ct, KEY)
            times.append(time.perf_counter() - t)
        report["decrypt"] = {"bytes": len(data), "gb_per_s": round(len(data) / min(times) / 1e9, 2)}
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
