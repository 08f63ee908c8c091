"""Opening a generative artifact: its generated loader's `load()` against onnxruntime-genai opening the plaintext
builder output (`og.Model(og.Config(dir))` and `og.Tokenizer`, what an app does without ortbuild), each in a fresh
process, alternating, timed from before the first import to the model (and tokenizer) ready; medians.

    python tests/benchmarks/bench_genai_load.py ARTIFACT_DIR PLAIN_DIR [--reps 7]

ARTIFACT_DIR is dist/<target>/<model> (its key in $ORTBUILD_KEY or $ORTBUILD_KEY_FILE), PLAIN_DIR the folder the
builder wrote for the same source and options (`python -m onnxruntime_genai.models.builder -i HF_DIR -o PLAIN_DIR
-p P -e cpu [--extra_options ...]`: model.onnx + model.onnx.data). Needs onnxruntime-genai (docs/benchmarks.md,
Generative models).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

PLAIN = """
import time
t0 = time.perf_counter()
import onnxruntime_genai as og
model = og.Model(og.Config({folder!r}))
tokenizer = og.Tokenizer(model)
print(time.perf_counter() - t0)
"""

LOADER = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {loader!r})
import {module}
model = {module}.load(folder={folder!r})
print(time.perf_counter() - t0)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("plain", type=Path)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    loader = next((args.artifact / "loader").glob("ortbuild_*.py"))
    codes = {"og.Model(og.Config(plain dir))": PLAIN.format(folder=str(args.plain.resolve())),
             "loader load()": LOADER.format(loader=str(loader.parent.resolve()), module=loader.stem,
                                            folder=str(args.artifact.resolve()))}
    times: dict[str, list[float]] = {name: [] for name in codes}
    for _ in range(args.reps):
        for name, code in codes.items():  # alternating: the machine's drift falls on both
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            times[name].append(float(out.stdout.strip().splitlines()[-1]) * 1000)
    print(json.dumps({name: {"median_ms": round(statistics.median(ms), 1), "runs_ms": [round(x, 1) for x in ms]}
                      for name, ms in times.items()}, indent=1))


if __name__ == "__main__":
    main()
