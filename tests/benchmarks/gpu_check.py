"""The GPU targets on an NVIDIA machine, through their generated loaders (what docs/gpu-results.md records):

- every ONNX artifact of `--onnx-target` (cuda-fp16): opened by its loader, its model's golden inputs
  (models/<model>.inputs.npz) run, the outputs compared with the fp32 source run by ONNX Runtime's CPU provider
  (max abs diff, cosine), and the providers the session really has; latency p50/p90 of `--runs` runs, CUDA vs that
  CPU session, measured alternately;
- every generative artifact of `--llm-target` (llm-cuda-int4): opened by its loader (onnxruntime-genai-cuda),
  greedy tokens of its golden prompts compared with the tokens its build recorded (on the CPU provider), and time
  to first token / per output token over `--generations` generations of 64 prompt + 32 new tokens.

Needs what the loaders need (onnxruntime-gpu, onnxruntime-genai-cuda, numpy, cryptography), this checkout (the
generation gate's prompt and timing: ortbuild.gating.measure.generation) and the key ($ORTBUILD_KEY). Run from
the repository root after `ortbuild build -t cuda-fp16 -t llm-cuda-int4`:

    python tests/benchmarks/gpu_check.py --json gpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from ortbuild.gating.measure import generation  # noqa: E402  (numpy and the standard library only)


def _loader(folder: Path) -> Any:
    path = next((folder / "loader").glob("ortbuild_*.py"))
    spec = importlib.util.spec_from_file_location(f"{path.stem}_{folder.parent.name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ms(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50": round(1000 * s[len(s) // 2], 4), "p90": round(1000 * s[int(0.9 * (len(s) - 1))], 4)}


def gpu() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, check=False).stdout.strip()
    except OSError as e:
        return f"nvidia-smi: {e}"


def onnx_target(dist: Path, target: str, runs: int) -> list[dict[str, Any]]:
    import onnxruntime as ort

    out = []
    for folder in sorted(p for p in (dist / target).iterdir() if (p / "manifest.json").is_file()):
        doc: dict[str, Any] = {"model": folder.name}
        try:
            model = _loader(folder).load(folder=folder)
            doc["providers"] = model.providers
            feeds_all = dict(np.load(ROOT / "models" / f"{folder.name}.inputs.npz"))
            cpu = ort.InferenceSession(str(ROOT / "models" / f"{folder.name}.onnx"), providers=["CPUExecutionProvider"])
            names = [i.name for i in cpu.get_inputs()]
            n = len(next(iter(feeds_all.values())))
            worst, cos = 0.0, 1.0
            for i in range(min(n, 16)):
                feeds = {k: feeds_all[k][i:i + 1] if feeds_all[k].ndim and len(feeds_all[k]) == n else feeds_all[k]
                         for k in names}
                got = model.run(feeds)
                ref = cpu.run(None, feeds)
                for a, b in zip(ref, got.values(), strict=True):
                    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
                    worst = max(worst, float(np.max(np.abs(a64 - b64))) if a64.size else 0.0)
                    norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
                    cos = min(cos, float(a64 @ b64) / norm if norm else 1.0)
            doc["max_abs_diff_vs_cpu_fp32"], doc["min_cosine_vs_cpu_fp32"] = worst, cos
            feeds = {k: feeds_all[k][:1] if feeds_all[k].ndim and len(feeds_all[k]) == n else feeds_all[k]
                     for k in names}
            for _ in range(10):
                model.run(feeds)
                cpu.run(None, feeds)
            t_gpu: list[float] = []
            t_cpu: list[float] = []
            for _ in range(runs):  # alternately: the same moment's machine for both
                t0 = time.perf_counter()
                model.run(feeds)
                t1 = time.perf_counter()
                cpu.run(None, feeds)
                t_cpu.append(time.perf_counter() - t1)
                t_gpu.append(t1 - t0)
            doc["cuda_ms"], doc["cpu_fp32_ms"] = _ms(t_gpu), _ms(t_cpu)
        except Exception as e:  # recorded: the check goes on to the next model
            doc["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        print(json.dumps(doc), flush=True)
        out.append(doc)
    return out


def llm_target(dist: Path, target: str, generations: int) -> list[dict[str, Any]]:
    out = []
    for folder in sorted(p for p in (dist / target).iterdir() if (p / "manifest.json").is_file()):
        doc: dict[str, Any] = {"model": folder.name}
        try:
            import onnxruntime_genai as og

            doc["is_cuda_available"] = bool(og.is_cuda_available())
            t0 = time.perf_counter()
            model = _loader(folder).load(folder=folder)
            doc["load_s"] = round(time.perf_counter() - t0, 3)
            golden = model.manifest["generative"]["golden_tokens"]  # the build's greedy tokens (CPU provider)
            same = 0
            flips = []
            for prompt, tokens in golden.items():
                got = model.generate_ids(model.encode(prompt), max_tokens=len(tokens))
                same += got == tokens
                if got != tokens:
                    flips.append({"prompt": prompt, "cpu": tokens, "cuda": got})
            doc["golden_prompts_equal"] = f"{same}/{len(golden)}"
            doc["flips"] = flips[:4]
            # the generation gate's own prompt (ids drawn from the vocabulary less its special tokens) and timing
            ids = generation.prompt_ids(generation.read_config(folder), 64)
            timings = [generation.generate_once(model.model, ids, 32) for _ in range(generations + 2)][2:]
            ttft = [t.ttft_ms / 1e3 for t in timings]
            tpot = [t.tpot_ms / 1e3 for t in timings]
            doc["ttft_ms"], doc["tpot_ms"] = _ms(ttft), _ms(tpot)
            doc["decode_tokens_per_s_p50"] = round(1 / statistics.median(tpot), 1)
        except Exception as e:
            doc["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        print(json.dumps(doc), flush=True)
        out.append(doc)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", type=Path, default=ROOT / "dist")
    ap.add_argument("--onnx-target", default="cuda-fp16")
    ap.add_argument("--llm-target", default="llm-cuda-int4")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    import onnxruntime as ort

    doc: dict[str, Any] = {"gpu": gpu(), "python": sys.version.split()[0], "onnxruntime": ort.__version__,
                           "available_providers": ort.get_available_providers(),
                           "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    try:
        import onnxruntime_genai as og

        doc["onnxruntime_genai"] = getattr(og, "__version__", "?")
    except ImportError as e:
        doc["onnxruntime_genai"] = f"missing: {e}"
    print(json.dumps(doc), flush=True)
    if (a.dist / a.onnx_target).is_dir():
        doc["onnx"] = onnx_target(a.dist, a.onnx_target, a.runs)
    if (a.dist / a.llm_target).is_dir():
        doc["llm"] = llm_target(a.dist, a.llm_target, a.generations)
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
