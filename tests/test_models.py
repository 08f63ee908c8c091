"""The committed example models are exactly what models/generate.py makes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MODELS


@pytest.mark.parametrize("hash_seed", ["1", "2"])  # set iteration order must not leak into the bytes
def test_generator_is_deterministic_and_matches_the_committed_files(tmp_path: Path, hash_seed: str) -> None:
    proc = subprocess.run([sys.executable, str(MODELS / "generate.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": hash_seed})
    assert proc.returncode == 0, proc.stderr
    made = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in MODELS.iterdir() if p.suffix in (".onnx", ".npz"))
    assert made == committed and len(made) == 12
    for name in made:
        a = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert a == hashlib.sha256((MODELS / name).read_bytes()).hexdigest(), name


def test_examples_are_small() -> None:
    total = sum(p.stat().st_size for p in MODELS.iterdir() if p.suffix in (".onnx", ".npz"))
    assert total < 5_000_000, total
