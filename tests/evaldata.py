"""A labelled evaluation set for PaddleOCR's text-orientation classifier (rapidocr-onnxruntime's
ch_ppocr_mobile_v2.0_cls_infer.onnx): text lines rendered with Pillow's default font, dark on light noisy
backgrounds, rotated by 0 or 180 degrees, labelled by construction. rapidocr's label_list is ['0', '180'], so class 0
is upright and class 1 upside down. Each line is resized and normalised as rapidocr_onnxruntime.ch_ppocr_cls's
TextClassifier.resize_norm_img does: height 48, width ceil(48 * w / h) up to 192, (x / 255 - 0.5) / 0.5, the rest of
the 192 columns zero. Written into a test's temporary folder; never committed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

WORDS = ["invoice", "total", "amount", "date", "release", "model", "runtime", "golden", "budget", "latency", "quick",
         "brown", "fox", "jumps", "over", "lazy", "dog", "edge", "mobile", "server", "artifact", "bundle", "compiled",
         "target", "shipped", "today", "number", "order", "customer", "account", "payment", "address", "street", "city",
         "station", "train", "ticket", "price", "Monday", "March", "OCR", "Paddle", "Text", "Line"]
SHAPE = (3, 48, 192)


def line(rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """One rendered text line, normalised to SHAPE, and its label (0: upright, 1: rotated by 180 degrees)."""
    from PIL import Image, ImageDraw, ImageFont

    text = " ".join(str(w) for w in rng.choice(WORDS, int(rng.integers(2, 6))))
    if rng.random() < 0.3:
        text += f" {int(rng.integers(0, 10000))}"
    font = ImageFont.load_default(size=int(rng.integers(20, 36)))
    left, top, right, bottom = font.getbbox(text)
    pad = int(rng.integers(2, 8))
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    background = rng.integers(190, 256, (h, w, 3)).astype(np.float32) + rng.normal(0, 8, (h, w, 3))
    img = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8))
    ink = tuple(int(x) for x in rng.integers(0, 60, 3))
    ImageDraw.Draw(img).text((pad - left, pad - top), text, fill=ink, font=font)
    label = int(rng.integers(0, 2))
    if label:
        img = img.rotate(180)
    _, height, width = SHAPE
    resized = min(width, math.ceil(height * img.width / img.height))
    arr = np.asarray(img.resize((resized, height), Image.Resampling.BILINEAR), np.float32).transpose(2, 0, 1) / 255
    out = np.zeros(SHAPE, np.float32)
    out[:, :, :resized] = (arr - 0.5) / 0.5
    return out, label


def lines(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` lines (float32 [count, 3, 48, 192]) and their labels (int64 [count])."""
    rng = np.random.default_rng(seed)
    xs, ys = zip(*(line(rng) for _ in range(count)), strict=True)
    return np.stack(xs), np.array(ys, dtype=np.int64)


def write(folder: Path, count: int, seed: int = 0, files: int = 1) -> tuple[Path, Path]:
    """The inputs (an .npz keyed `x`, or a directory of `files` .npz files) and labels (.npy) of `count` lines."""
    x, y = lines(count, seed)
    labels = folder / "labels.npy"
    np.save(labels, y)
    if files == 1:
        np.savez(folder / "eval.npz", x=x)
        return folder / "eval.npz", labels
    (folder / "eval").mkdir()
    for i, part in enumerate(np.array_split(x, files)):
        np.savez_compressed(folder / "eval" / f"part{i:03d}.npz", x=part)
    return folder / "eval", labels
