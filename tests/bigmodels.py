"""Generated MLP stacks with ONNX external data, of any size, written tensor by tensor (never whole in memory).

    python tests/bigmodels.py OUT_DIR --gib 2.5 [--width 4096] [--embedded]

Layer i: y = Relu(x @ W_i + b_i), W_i [width, width] float32, as a user's large model would store them:
`model.onnx` (the graph, a few KB) beside `model.onnx.data` (every weight). Used by the tests (small sizes)
and the scale benchmark (0.5 and 2.5 GiB); never committed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 4096  # ORT maps external data in place when offsets are page-aligned


def mlp(out_dir: Path, *, layers: int, width: int = 4096, batch: int | str = "batch", seed: int = 0,
        embedded: bool = False) -> Path:
    """Write out_dir/model.onnx (+ model.onnx.data unless embedded) and the golden input file inputs.npz.
    Weights are scaled so activations stay O(1) through any depth."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    data_path = out_dir / "model.onnx.data"
    data = None if embedded else open(data_path, "wb")  # noqa: SIM115
    scale = np.float32(np.sqrt(2.0 / width))
    try:
        for i in range(layers):
            w = (rng.standard_normal((width, width), dtype=np.float32) * scale).astype(np.float32)
            b = (rng.standard_normal(width, dtype=np.float32) * np.float32(0.01)).astype(np.float32)
            for name, arr in ((f"W{i}", w), (f"b{i}", b)):
                if data is None:
                    inits.append(onnx.numpy_helper.from_array(arr, name))
                    continue
                pad = -data.tell() % ALIGN
                data.write(b"\0" * pad)
                offset = data.tell()
                data.write(arr.tobytes())
                t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=arr.shape)
                t.data_location = TensorProto.EXTERNAL
                for k, v in (("location", data_path.name), ("offset", str(offset)), ("length", str(arr.nbytes))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
                inits.append(t)
            x = "x" if i == 0 else f"h{i - 1}"
            nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"m{i}"], name=f"matmul{i}"),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                      helper.make_node("Relu", [f"a{i}"], [f"h{i}" if i < layers - 1 else "y"], name=f"relu{i}")]
    finally:
        if data is not None:
            data.close()
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortbuild-tests")
    model.ir_version = 9
    onnx.save_model(model, str(out_dir / "model.onnx"))
    np.savez(out_dir / "inputs.npz", x=np.random.default_rng(seed + 1).standard_normal((2, width), dtype=np.float32))
    return out_dir / "model.onnx"


def transformer_like(out_dir: Path, *, layers: int = 48, hidden: int = 64, ffn: int = 256, seq: int = 64,
                     seed: int = 0) -> Path:
    """Write out_dir/model.onnx (weights embedded) and inputs.npz: a stack of single-head self-attention + FFN
    blocks whose LayerNorm and GELU are written out as primitive ops (ReduceMean/Sub/Pow/Sqrt/Div, Erf), so ORT's
    optimizer has real fusion work to do. 48 layers (the default): 2,017 nodes, 9.7 MB, the cold-start model of
    ../shared/research/ort.md (`tlike48`); its session creation is dominated by the graph, not the weights."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []

    def init(name: str, value: object) -> str:
        inits.append(onnx.numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    for name, value in (("two", 2.0), ("eps", 1e-5), ("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5),
                        ("scale", np.sqrt(hidden))):
        init(name, value)

    def node(op: str, inputs: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def layernorm(x: str, p: str) -> str:
        g, b = init(p + "_g", np.ones(hidden)), init(p + "_b", np.zeros(hidden))
        mean = node("ReduceMean", [x], p + "_mean", axes=[-1])
        d = node("Sub", [x, mean], p + "_d")
        var = node("ReduceMean", [node("Pow", [d, "two"], p + "_sq")], p + "_var", axes=[-1])
        std = node("Sqrt", [node("Add", [var, "eps"], p + "_ve")], p + "_std")
        return node("Add", [node("Mul", [node("Div", [d, std], p + "_n"), g], p + "_ng"), b], p + "_out")

    def linear(x: str, p: str, din: int, dout: int) -> str:
        w = init(p + "_w", rng.standard_normal((din, dout)) / np.sqrt(din))
        b = init(p + "_b", rng.standard_normal(dout) * 0.01)
        return node("Add", [node("MatMul", [x, w], p + "_mm"), b], p + "_out")

    x = "input"
    for i in range(layers):
        p = f"l{i}"
        ln1 = layernorm(x, p + "_ln1")
        q, k, v = (linear(ln1, f"{p}_{n}", hidden, hidden) for n in "qkv")
        kt = node("Transpose", [k], p + "_kt", perm=[0, 2, 1])
        att = node("Softmax", [node("Div", [node("MatMul", [q, kt], p + "_qk"), "scale"], p + "_qks")], p + "_att",
                   axis=-1)
        res1 = node("Add", [x, linear(node("MatMul", [att, v], p + "_ctx"), p + "_o", hidden, hidden)], p + "_res1")
        f1 = linear(layernorm(res1, p + "_ln2"), p + "_f1", hidden, ffn)
        erf = node("Erf", [node("Div", [f1, "sqrt2"], p + "_gd")], p + "_ge")
        gelu = node("Mul", [node("Mul", [f1, node("Add", [erf, "one"], p + "_ga")], p + "_gm"), "half"], p + "_gelu")
        x = node("Add", [res1, linear(gelu, p + "_f2", ffn, hidden)], p + "_res2")
    node("Identity", [x], "output")
    graph = helper.make_graph(nodes, "transformer_like",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", seq, hidden])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", seq, hidden])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ortbuild-tests")
    model.ir_version = 8
    onnx.save_model(model, str(out_dir / "model.onnx"))
    np.savez(out_dir / "inputs.npz",
             input=np.random.default_rng(seed + 1).standard_normal((1, seq, hidden), dtype=np.float32))
    return out_dir / "model.onnx"


def dev_keys_env(project: Path) -> dict[str, str]:
    """Make a DEVELOPMENT key pair in project/keys and return the environment that builds with it (and nothing
    else: keys from the caller's environment are dropped) in fresh `python -m ortbuild` processes."""
    import os
    import subprocess
    import sys

    keys = project / "keys"
    env = {**os.environ, "ORTBUILD_KEY_FILE": str(keys / "encryption.key"),
           "ORTBUILD_SIGNING_KEY_FILE": str(keys / "signing.key"), "PYTHONDONTWRITEBYTECODE": "1"}
    for k in ("ORTBUILD_KEY", "ORTBUILD_SIGNING_KEY"):
        env.pop(k, None)
    subprocess.run([sys.executable, "-m", "ortbuild", "keygen", "--dev", "--out", str(keys)], cwd=project, env=env,
                   check=True, capture_output=True)
    return env


def needles(data_file: Path, count: int = 16, size: int = 64) -> list[bytes]:
    """`count` pieces of plaintext weights, spread over the whole external-data file (one per region)."""
    total = data_file.stat().st_size
    out = []
    with open(data_file, "rb") as f:
        for i in range(count):
            f.seek((total * i // count + total // (2 * count)) // 4 * 4)
            piece = f.read(size)
            if piece.strip(b"\0"):
                out.append(piece)
    assert len(out) >= count // 2, "too few non-zero pieces to scan for"
    return out


def plaintext_hits(roots: list[Path], pieces: list[bytes], skip: tuple[Path, ...] = ()) -> tuple[list[str], int]:
    """Files under `roots` (outside `skip`) that hold any of `pieces`, streamed in chunks; and bytes scanned."""
    hits, scanned, overlap = [], 0, max(len(p) for p in pieces) - 1
    for root in roots:
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if not path.is_file() or path.is_symlink() or any(path.is_relative_to(s) for s in skip):
                continue
            tail = b""
            with open(path, "rb") as f:
                while chunk := f.read(64 << 20):
                    window = tail + chunk
                    if any(p in window for p in pieces):
                        hits.append(str(path))
                        break
                    scanned += len(chunk)
                    tail = window[-overlap:]
    return hits, scanned


def layers_for(gib: float, width: int = 4096) -> int:
    return max(1, round(gib * (1 << 30) / (4 * width * (width + 1))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=float, default=0.5)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--embedded", action="store_true", help="weights inside model.onnx (under 2 GiB only)")
    a = ap.parse_args()
    path = mlp(a.out, layers=layers_for(a.gib, a.width), width=a.width, embedded=a.embedded)
    print(path)


if __name__ == "__main__":
    main()
