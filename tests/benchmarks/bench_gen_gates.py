"""The token gates' measures on a generative model's builds: each builder setting built with onnxruntime-genai's
model builder, run through onnxruntime-genai against the fp32 source (transformers) on the model's golden prompts,
and judged by the precision's default rule (ortbuild.gating.measure.tokens.DEFAULTS): what the defaults in
docs/generative.md were chosen from.

    python tests/benchmarks/bench_gen_gates.py MODEL_DIR [--tokens 32] [--settings int4:32:4 int4:128:4 ...]
    python tests/benchmarks/bench_gen_gates.py --qwen2 bench          # trains models/generate_qwen2.py's model

A setting is `fp32`, `int8`, or `int4:BLOCK:LEVEL[:asym][:lmhead]`. Needs the generative targets' venv (torch,
transformers, onnxruntime-genai). The builds go to a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_SETTINGS = ("fp32", "int8", "int4:32:4", "int4:32:0", "int4:16:0", "int4:128:4", "int4:256:4")


def build(model: Path, setting: str, out: Path) -> Path:
    parts = setting.split(":")
    extra = []
    if parts[0] == "int4":
        extra = [f"block_size={parts[1]}", f"accuracy_level={parts[2]}",
                 f"is_symmetric={'false' if 'asym' in parts else 'true'}"]
        if "lmhead" in parts:
            extra.append("nodes_to_exclude=/lm_head/MatMul")
    from tests.genmodels import builder_runs

    builder_runs(["-i", str(model), "-o", str(out), "-p", parts[0], "-e", "cpu", "-c", str(out) + ".cache",
                  "--extra_options", *extra, "hf_remote=false"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, nargs="?")
    ap.add_argument("--qwen2", choices=("small", "bench"), help="train models/generate_qwen2.py's model first")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the builder reads the directory: never a hub
    import onnxruntime_genai as og
    from machine_class import describe

    from ortbuild.gating.measure.tokens import DEFAULTS, judge
    from ortbuild.generative import reference, run

    print(describe(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-gen-gates-") as tmp:
        model = a.model
        if a.qwen2:
            sys.path.insert(0, str(ROOT / "models"))
            from generate_qwen2 import generate

            model = generate(Path(tmp) / "qwen2", a.qwen2)
        assert model is not None, "name a model directory or --qwen2"
        prompts = [p for p in (model / "prompts.txt").read_text().splitlines() if p.strip()]
        held = model / "heldout.txt"
        ref = reference.reference(model, prompts, a.tokens, held.read_text() if held.is_file() else None, None)
        tok = og.Tokenizer(og.Model(str(build(model, "fp32", Path(tmp) / "fp32"))))
        rows = []
        for setting in a.settings:
            start = time.perf_counter()
            out = Path(tmp) / setting.replace(":", "-")
            m = og.Model(str(out if out.is_dir() else build(model, setting, out)))
            observed = run.observe(m, ref)
            rule = DEFAULTS[setting.split(":")[0]]
            verdict, doc, lines = judge(ref, observed, rule, lambda ids: str(tok.decode(ids)))
            row = {"setting": setting, "verdict": str(verdict), "exact": doc["exact_prompts"],
                   "agreement": round(doc["agreement"], 3), "kl_mean": round(doc["kl_mean"], 5),
                   "kl_p99": round(doc["kl_p99"], 4), "kl_max": round(doc["kl_max"], 4),
                   "decided": doc["decided"], "top1_decided": round(doc["top1_decided"], 4),
                   "top1_all": round(doc["top1_all"], 4), "min_cosine": round(doc["min_cosine"], 5),
                   "top5": round(doc["top5"], 4), "ppl": None if doc["ppl_increase"] is None
                   else round(doc["ppl_increase"], 4),
                   "flip_margins": [d["flip_margin"] for d in doc["prompts"]], "seconds": round(
                       time.perf_counter() - start, 1), "lines": lines}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "lines"}), flush=True)
            print("\n".join(lines), flush=True)
            del m
        if a.json:
            a.json.write_text(json.dumps({"model": str(model), "rules": {k: asdict(v) for k, v in DEFAULTS.items()},
                                          "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
