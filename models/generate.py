"""Generate the example models and their golden/calibration data, deterministically.

    python models/generate.py [OUTDIR]      (default: the directory of this script)

Four small models (about 3 MB in all), built with onnx.helper from seeded NumPy weights, plus a
scikit-learn model exported with skl2onnx:

- tiny_cnn          image[N,3,32,32] -> logits[N,10]: Conv/BatchNorm/Relu blocks, pooling, Gemm
- tiny_transformer  input_ids/attention_mask int64[N,S] -> embedding[N,128]: a 3-layer encoder
                    (byte-level vocabulary, multi-head attention, LayerNorm, Erf GELU, mean pooling)
- tiny_lstm         series[N,T,8] -> forecast[N,3]: an LSTM over a multi-channel time series
- breast_cancer_gb  features[N,30] -> label, probabilities: GradientBoosting on sklearn's dataset

Golden inputs are realistic for each model (rendered shapes, English sentences, sine mixtures, held-out
rows of the data set); calibration sets are drawn from the same distributions, never from noise.
Same library versions in, same bytes out: tests/test_models.py regenerates and compares sha256.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # opset 17's IR version: loads in every runtime flavor we pin

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "ONNX Runtime executes models on many kinds of hardware.",
    "Release engineers ship the same model to servers and phones.",
    "A latency budget that never fails a build is only a wish.",
    "Quantization trades a little accuracy for a lot of speed.",
    "Golden outputs catch regressions before users do.",
    "Edge devices have small memories and slow storage.",
    "Every artifact records the machine that built it.",
    "Reproducible builds make audits and rollbacks boring.",
    "The detector found three lines of text in the receipt.",
    "Please translate this sentence into French and German.",
    "Weather tomorrow: light rain in the morning, sun later.",
    "The invoice total does not match the purchase order.",
    "Our servers run on CPUs, GPUs and a few accelerators.",
    "She measured the median and the ninety-ninth percentile.",
    "Models are compiled once and loaded many times.",
]


class _Graph:
    """A tiny builder: collects nodes and initializers with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, base: str, shape: tuple[int, ...], fan_in: int) -> str:
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape).astype(np.float32)
        return self.const(base, w)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs

    def op1(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        return self.op(op_type, inputs, 1, **attrs)[0]


def _model(g: _Graph, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           doc: str) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ortbuild-models", producer_version="1")
    model.ir_version = IR_VERSION
    model.doc_string = doc
    onnx.checker.check_model(model, full_check=True)
    return model


# ------------------------------------------------------------------------------------------- CNN

def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    """Synthetic photos: a colour gradient background with a filled disc or box, plus mild noise."""
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32) / 31.0
    out = np.empty((n, 3, 32, 32), np.float32)
    for i in range(n):
        base = rng.uniform(0.1, 0.9, size=(3, 1, 1)).astype(np.float32)
        tilt = rng.uniform(-0.3, 0.3, size=(3, 1, 1)).astype(np.float32)
        img = base + tilt * (xx if i % 2 else yy)
        cy, cx, r = rng.uniform(8, 24), rng.uniform(8, 24), rng.uniform(4, 9)
        mask = ((yy * 31 - cy) ** 2 + (xx * 31 - cx) ** 2 < r * r) if i % 3 else (
            (abs(yy * 31 - cy) < r) & (abs(xx * 31 - cx) < r))
        img = np.where(mask, rng.uniform(0, 1, size=(3, 1, 1)).astype(np.float32), img)
        img += rng.normal(0, 0.02, size=img.shape).astype(np.float32)
        out[i] = (np.clip(img, 0, 1) - 0.5) / 0.25  # normalised as a real pipeline would
    return out


def tiny_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    x = "image"
    ch_in = 3
    for i, ch in enumerate((16, 32, 64)):
        w = g.weight(f"conv{i}.weight", (ch, ch_in, 3, 3), ch_in * 9)
        b = g.const(f"conv{i}.bias", np.zeros(ch, np.float32))
        x = g.op1("Conv", [x, w, b], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        bn = [g.const(f"bn{i}.{p}", v) for p, v in (
            ("scale", rng.uniform(0.8, 1.2, ch).astype(np.float32)),
            ("bias", rng.normal(0, 0.1, ch).astype(np.float32)),
            ("mean", rng.normal(0, 0.1, ch).astype(np.float32)),
            ("var", rng.uniform(0.5, 1.5, ch).astype(np.float32)))]
        x = g.op1("BatchNormalization", [x, *bn])
        x = g.op1("Relu", [x])
        if i < 2:
            x = g.op1("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        ch_in = ch
    x = g.op1("GlobalAveragePool", [x])
    x = g.op1("Flatten", [x], axis=1)
    w = g.weight("fc.weight", (10, 64), 64)
    b = g.const("fc.bias", rng.normal(0, 0.01, 10).astype(np.float32))
    g.nodes.append(helper.make_node("Gemm", [x, w, b], ["logits"], name="fc", transB=1))
    return _model(g, "tiny_cnn",
                  [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
                  "Small image classifier (random weights, realistic op mix).")


# ----------------------------------------------------------------------------------- transformer

D, HEADS, FF, LAYERS, VOCAB, MAX_SEQ = 128, 4, 512, 3, 256, 64


def _encode(sentences: list[str], seq: int) -> dict[str, np.ndarray]:
    ids = np.zeros((len(sentences), seq), np.int64)
    mask = np.zeros((len(sentences), seq), np.int64)
    for i, s in enumerate(sentences):
        b = list(s.encode("utf-8"))[:seq]
        ids[i, :len(b)] = b
        mask[i, :len(b)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def tiny_transformer(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    i64 = np.int64

    def linear(x: str, base: str, d_in: int, d_out: int) -> str:
        y = g.op1("MatMul", [x, g.weight(f"{base}.weight", (d_in, d_out), d_in)])
        return g.op1("Add", [y, g.const(f"{base}.bias", rng.normal(0, 0.02, d_out).astype(np.float32))])

    def layer_norm(x: str, base: str) -> str:
        scale = g.const(f"{base}.weight", np.ones(D, np.float32))
        bias = g.const(f"{base}.bias", np.zeros(D, np.float32))
        return g.op1("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-5)

    emb = g.const("embed.tokens", rng.normal(0, 0.5, (VOCAB, D)).astype(np.float32))
    pos = g.const("embed.positions", rng.normal(0, 0.1, (MAX_SEQ, D)).astype(np.float32))
    shape = g.op1("Shape", ["input_ids"])                                  # [B, S]
    seq = g.op1("Slice", [shape, g.const("c1", np.array([1], i64)), g.const("c2", np.array([2], i64))])
    pos_slice = g.op1("Slice", [pos, g.const("c0", np.array([0], i64)), seq, g.const("c0a", np.array([0], i64))])
    x = g.op1("Add", [g.op1("Gather", [emb, "input_ids"]), pos_slice])     # [B, S, D]
    x = layer_norm(x, "embed.norm")

    # additive attention bias from the mask: (1 - mask) * -1e4, shaped [B, 1, 1, S]
    maskf = g.op1("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    neg = g.op1("Mul", [g.op1("Sub", [g.const("one", np.array(1.0, np.float32)), maskf]),
                        g.const("neg", np.array(-1e4, np.float32))])
    bias = g.op1("Unsqueeze", [neg, g.const("axes12", np.array([1, 2], i64))])
    heads_shape = g.const("heads_shape", np.array([0, 0, HEADS, D // HEADS], i64))
    merge_shape = g.const("merge_shape", np.array([0, 0, D], i64))
    scale = g.const("attn_scale", np.array(1.0 / np.sqrt(D // HEADS), np.float32))

    for li in range(LAYERS):
        p = f"layers.{li}"
        q, k, v = (g.op1("Reshape", [linear(x, f"{p}.attn.{n}", D, D), heads_shape]) for n in "qkv")
        q = g.op1("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op1("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op1("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op1("Add", [g.op1("Mul", [g.op1("MatMul", [q, k]), scale]), bias])
        ctx = g.op1("MatMul", [g.op1("Softmax", [scores], axis=-1), v])
        ctx = g.op1("Reshape", [g.op1("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        x = layer_norm(g.op1("Add", [x, linear(ctx, f"{p}.attn.out", D, D)]), f"{p}.norm1")
        h = linear(x, f"{p}.ff1", D, FF)
        # GELU written out with Erf, as exporters emit it (ORT fuses it to Gelu/BiasGelu)
        erf = g.op1("Erf", [g.op1("Div", [h, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])])
        h = g.op1("Mul", [g.op1("Mul", [h, g.op1("Add", [erf, g.const("one_b", np.array(1.0, np.float32))])]),
                          g.const("half", np.array(0.5, np.float32))])
        x = layer_norm(g.op1("Add", [x, linear(h, f"{p}.ff2", FF, D)]), f"{p}.norm2")

    # masked mean pooling -> [B, D]
    m3 = g.op1("Unsqueeze", [maskf, g.const("axis2", np.array([2], i64))])
    summed = g.op1("ReduceSum", [g.op1("Mul", [x, m3]), g.const("axis1", np.array([1], i64))], keepdims=0)
    count = g.op1("Max", [g.op1("ReduceSum", [m3, g.const("axis1b", np.array([1], i64))], keepdims=0),
                          g.const("eps", np.array(1e-6, np.float32))])
    g.nodes.append(helper.make_node("Div", [summed, count], ["embedding"], name="pool"))
    return _model(g, "tiny_transformer",
                  [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                   helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
                  [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", D])],
                  "3-layer byte-level transformer encoder with mean pooling (random weights).")


# ------------------------------------------------------------------------------------------ LSTM

def _series(rng: np.random.Generator, n: int, steps: int = 48) -> np.ndarray:
    t = np.arange(steps, dtype=np.float32)[None, :, None]
    freq = rng.uniform(0.05, 0.4, size=(n, 1, 8)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 8)).astype(np.float32)
    trend = rng.normal(0, 0.01, size=(n, 1, 8)).astype(np.float32)
    noise = rng.normal(0, 0.05, (n, steps, 8))  # float64, added before the final cast
    out: np.ndarray = (np.sin(freq * t + phase) + trend * t + noise).astype(np.float32)
    return out


def tiny_lstm(rng: np.random.Generator) -> onnx.ModelProto:
    g = _Graph(rng)
    hidden, feat = 64, 8
    w = g.const("lstm.W", rng.uniform(-0.125, 0.125, (1, 4 * hidden, feat)).astype(np.float32))
    r = g.const("lstm.R", rng.uniform(-0.125, 0.125, (1, 4 * hidden, hidden)).astype(np.float32))
    b = g.const("lstm.B", np.zeros((1, 8 * hidden), np.float32))
    # ORT's CPU LSTM supports only layout 0 (time-major), as exporters emit it
    xt = g.op1("Transpose", ["series"], perm=[1, 0, 2])                       # [T, B, F]
    _, y_h, _ = g.op("LSTM", [xt, w, r, b], 3, hidden_size=hidden)            # Y_h: [1, B, H]
    h = g.op1("Squeeze", [y_h, g.const("axis0", np.array([0], np.int64))])
    fc = g.op1("MatMul", [h, g.weight("head.weight", (hidden, 3), hidden)])
    g.nodes.append(helper.make_node("Add", [fc, g.const("head.bias", np.zeros(3, np.float32))], ["forecast"],
                                    name="head"))
    return _model(g, "tiny_lstm",
                  [helper.make_tensor_value_info("series", TensorProto.FLOAT, ["batch", "steps", feat])],
                  [helper.make_tensor_value_info("forecast", TensorProto.FLOAT, ["batch", 3])],
                  "One-layer LSTM forecaster over 8 channels (random weights).")


# ------------------------------------------------------------------------------------ classic ML

def breast_cancer_gb() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import GradientBoostingClassifier

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    y = data.target
    order = np.random.default_rng(7).permutation(len(x))
    train, test = order[:400], order[400:]
    clf = GradientBoostingClassifier(n_estimators=40, max_depth=3, random_state=0).fit(x[train], y[train])
    model = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}},
                    target_opset={"": OPSET, "ai.onnx.ml": 3}, naming="gb_")
    # stable names: skl2onnx names the input "X"; rename to a descriptive one
    old = model.graph.input[0].name
    model.graph.input[0].name = "features"
    for node in model.graph.node:
        node.input[:] = ["features" if i == old else i for i in node.input]
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.ir_version = IR_VERSION
    # skl2onnx collects opset imports in a set: their order follows PYTHONHASHSEED, so sort them
    imports = sorted(model.opset_import, key=lambda o: o.domain)
    del model.opset_import[:]
    model.opset_import.extend(imports)
    model.producer_name = "ortbuild-models"
    model.producer_version = "1"
    model.doc_string = "GradientBoosting on sklearn's breast_cancer data (held-out rows are the inputs)."
    onnx.checker.check_model(model, full_check=True)
    return model, x[test[:16]], x[train[:64]]


# ------------------------------------------------------------------------------------------ main

def _save(model: onnx.ModelProto, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(model.SerializeToString(deterministic=True))
    tmp.replace(path)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez writes zip entries with a fixed timestamp, so the bytes are stable
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(path)


def generate(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def emit(name: str, model: onnx.ModelProto, inputs: dict[str, np.ndarray],
             calib: dict[str, np.ndarray]) -> None:
        _save(model, out / f"{name}.onnx")
        _save_npz(out / f"{name}.inputs.npz", inputs)
        _save_npz(out / f"{name}.calib.npz", calib)
        written.extend(out / f"{name}{suffix}" for suffix in (".onnx", ".inputs.npz", ".calib.npz"))

    rng = np.random.default_rng(20261122)
    cnn = tiny_cnn(rng)
    emit("tiny_cnn", cnn, {"image": _images(rng, 4)}, {"image": _images(rng, 32)})

    tr = tiny_transformer(rng)
    emit("tiny_transformer", tr, _encode(SENTENCES[:4], 32), _encode(SENTENCES[4:], 32))

    lstm = tiny_lstm(rng)
    emit("tiny_lstm", lstm, {"series": _series(rng, 4)}, {"series": _series(rng, 32)})

    gb, test_rows, calib_rows = breast_cancer_gb()
    emit("breast_cancer_gb", gb, {"features": test_rows}, {"features": calib_rows})
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in generate(target):
        print(f"{p.stat().st_size:>10,}  {p}")
