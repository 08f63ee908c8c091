"""x86-64 vs aarch64 ONNX Runtime on the same artifacts, per precision (nox -s benchmark; docs/targets.md#platforms).

Builds the example models at each precision (optimization `extended`: the same portable artifact for both
platforms) into a temporary project, then runs every artifact through its generated Python loader twice: on this
machine's onnxruntime and on the aarch64 wheel under emulation (ortbuild.emulation, qemu-user). Each side is
compared with the golden reference (the fp32 source on the CPU provider, optimizations off), and the two sides
with each other. Needs qemu-user-static and debootstrap; prints why and exits 0 without them.

    python tests/benchmarks/bench_platforms.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import emulation, installed  # noqa: E402
from ortbuild.artifact import golden, keys, loaders, manifest  # noqa: E402
from ortbuild.gating import emulated  # noqa: E402
from ortbuild.project import config  # noqa: E402

MODELS = ("tiny_cnn", "tiny_transformer", "tiny_lstm")
# (target, precision options, models): int8 both with x86's reduce_range (cpu-int8) and without (arm64-int8)
TARGETS = (
    ("fp32", 'precision = "fp32"', MODELS),
    ("fp16", 'precision = "fp16"\nfp16 = { keep_io_types = true }', MODELS),
    ("int8-dynamic", 'precision = "int8-dynamic"\nquantization = { per_channel = true, reduce_range = false }',
     MODELS),
    ("int8-dynamic-reduce-range",
     'precision = "int8-dynamic"\nquantization = { per_channel = true, reduce_range = true }', MODELS),
    ("int8-static", 'precision = "int8-static"\nquantization = { format = "qdq", calibration_method = "minmax" }',
     ("tiny_cnn", "tiny_transformer")),
    ("int4-weight", 'precision = "int4-weight"\nint4 = { block_size = 32, symmetric = true, accuracy_level = 4 }',
     ("tiny_transformer",)),
)


def _project(root: Path) -> Path:
    flavor = installed.installed_flavor()
    assert flavor is not None
    text = '[project]\nname = "platforms"\nversion = "1"\n\n'
    for m in MODELS:
        text += (f'[models.{m}]\npath = "{REPO}/models/{m}.onnx"\ninputs = "{REPO}/models/{m}.inputs.npz"\n'
                 + (f'calibration = "{REPO}/models/{m}.calib.npz"\n' if (REPO / f"models/{m}.calib.npz").exists()
                    else "") + "\n")
    for name, opts, models in TARGETS:
        text += textwrap.dedent(f"""\
            [targets.{name}]
            runtime = "{flavor.distribution}=={flavor.version}"
            providers = ["CPUExecutionProvider"]
            optimization = "extended"
            models = {json.dumps(list(models))}
            """) + opts + "\n\n"
    toml = root / "targets.toml"
    toml.write_text(text)
    return toml


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    n = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / n) if n else 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the rows here too")
    args = ap.parse_args()
    os.environ.pop(emulation.SWITCH_VAR, None)
    with tempfile.TemporaryDirectory(prefix="bench-platforms-") as tmp:
        root = Path(tmp)
        env = dict(os.environ)
        if not env.get("ORTBUILD_KEY") and not env.get("ORTBUILD_KEY_FILE"):
            subprocess.run([sys.executable, "-m", "ortbuild", "keygen", "--out", str(root / "keys")], check=True,
                           capture_output=True)
            env |= {"ORTBUILD_KEY_FILE": str(root / "keys/encryption.key"),
                    "ORTBUILD_SIGNING_KEY_FILE": str(root / "keys/signing.key")}
        toml = _project(root)
        project = config.load(toml)
        first = project.targets["fp32"]
        why = emulation.unavailable("linux-aarch64", emulated.requirements(first))
        if why:
            print(f"bench_platforms: skipped: {why}")
            return 0
        subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(toml), "-j", "1"], check=True, env=env,
                       cwd=root)
        os.environ.update(env)
        enc = keys.read_secrets().encryption
        secret = enc.secret if enc is not None else None
        rows: list[dict[str, Any]] = []
        for tname, _, models in TARGETS:
            target = project.targets[tname]
            for m in models:
                folder = root / "dist" / tname / m
                man, _ = manifest.read(folder)
                g = golden.golden_for(project.models[m], man.io, ())
                loader = loaders.python_path(folder, m)
                native: Any = loaders.import_python_loader(loader)
                model = native.load(key=secret, folder=folder)
                x86 = [model.run(ds.inputs) for ds in g.sets]
                arm, info = emulation.run("linux-aarch64", emulated.requirements(target), loader, folder, secret,
                                          [ds.inputs for ds in g.sets], f"{tname}/{m}")
                for o in man.io["outputs"]:
                    name = o["name"]
                    ref = np.concatenate([ds.expected[name].ravel() for ds in g.sets])
                    a = np.concatenate([x[name].ravel() for x in x86])
                    b = np.concatenate([x[name].ravel() for x in arm])
                    rows.append({"precision": tname, "model": m, "output": name,
                                 "x86_cosine": _cosine(a, ref), "aarch64_cosine": _cosine(b, ref),
                                 "x86_max_abs": float(np.max(np.abs(a - ref))),
                                 "aarch64_max_abs": float(np.max(np.abs(b - ref))),
                                 "between_max_abs": float(np.max(np.abs(a - b))),
                                 "identical": bool(np.array_equal(a, b)),
                                 "aarch64": f"onnxruntime {info['onnxruntime']} {info['emulator']}"})
    print("| precision | model (output) | cosine vs fp32 ref, x86-64 | cosine, aarch64 | max abs err, x86-64 | "
          "max abs err, aarch64 | max abs x86-64 vs aarch64 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        between = "identical" if r["identical"] else f"{r['between_max_abs']:.2e}"
        print(f"| {r['precision']} | {r['model']} ({r['output']}) | {r['x86_cosine']:.6f} | {r['aarch64_cosine']:.6f} "
              f"| {r['x86_max_abs']:.2e} | {r['aarch64_max_abs']:.2e} | {between} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
