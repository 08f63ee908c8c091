"""Benchmark: both generated loaders against plain ONNX Runtime, on manifest format 3 and the previous format 2.

    python tests/benchmarks/bench_formats.py [--gib 0.0625 --gib 0.5 --gib 1 --gib 2.5] [--reps 3] [--no-node]
                                             [--json out.json]

For each size (default 0.0625 and 0.5 GiB) an MLP stack (tests/bigmodels.py, weights in model.onnx.data) is
generated into a temp dir and built once with `ortbuild build` (fp32, `external_data = true`, encrypted, dev keys:
bench_loader.build). A format-2 copy of the artifact folder is made beside it: its files hard-linked (the same
bytes, the same warm page cache), manifest.json rewritten with `format_version` 2 and no `pieces`, and re-signed
with the build's own dev signing key, so the same generated loaders take their previous (sequential) path on it.
Then --reps rounds of fresh processes, alternating within each round:
- Python: plain `onnxruntime.InferenceSession(source model.onnx)`, the loader on format 3, the loader on format 2
  (bench_loader.child: timed from before `import onnxruntime` to the end of the first inference; peak RSS is
  the process's own VmHWM);
- Node (unless --no-node, and where node and npm are installed; the onnxruntime-node app of the tests):
  plain onnxruntime-node `InferenceSession.create(source model.onnx)`, the Node loader on format 3, on format 2
  (bench_scale.node_first_runs: the same span; peak RSS is ru_maxrss of the node process).
Prints a markdown table per size (medians, loader / plain for each format, and format 3 / format 2: what the new
format gained); --json writes every run and the medians. The temp dirs are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_loader import WIDTH, build, child  # noqa: E402
from tests.benchmarks.bench_scale import GIB, node_first_runs, versus  # noqa: E402
from tests.benchmarks.machine_class import describe  # noqa: E402

MB = 1_000_000
PLAIN, FORMAT3, FORMAT2 = "plain", "format 3", "format 2"
MODES = (PLAIN, FORMAT3, FORMAT2)


def to_format2(doc: dict[str, Any]) -> None:
    """A format-3 manifest as format 2 wrote it: one sha256 per file, no piece digests."""
    doc["format_version"] = 2
    for entry in doc["artifact"]["files"]:
        entry.pop("pieces", None)


def format2_copy(artifact: Path, out: Path, signing_key: Path) -> Path:
    """out/<model>: the artifact folder as format 2 (the loaders import themselves by the folder's name)."""
    from ortbuild.artifact import keys
    from tests.test_loaders import _resign

    def link(src: str, dst: str) -> None:
        if Path(src).name.startswith("manifest."):  # rewritten below: never through a link to the format-3 one
            shutil.copyfile(src, dst)
        else:
            os.link(src, dst)

    copy = out / artifact.name
    shutil.copytree(artifact, copy, copy_function=link)
    key = keys.signing_key(file=signing_key)
    assert key is not None, f"{signing_key}: no signing key"
    _resign(copy, to_format2, key.seed)
    return copy


def node_app() -> Path | None:
    """The tests' onnxruntime-node app (installed there once), or None without node and npm."""
    if not (shutil.which("node") and shutil.which("npm")):
        print("# node or npm not found: the Node rows are skipped", file=sys.stderr)
        return None
    from tests.test_loaders import install_node_app

    return install_node_app()


def rounds(reps: int, runners: dict[str, Callable[[], dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    got: dict[str, list[dict[str, float]]] = {mode: [] for mode in runners}
    for _ in range(reps):  # alternating, so every mode sees the same machine state
        for mode, run in runners.items():
            got[mode].append(run())
    return got


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Every run, the medians, and the ratios: each format against plain, and format 3 against format 2."""
    return {"runs": runs, "format3_vs_plain": versus(runs[FORMAT3], runs[PLAIN]),
            "format2_vs_plain": versus(runs[FORMAT2], runs[PLAIN]),
            "format3_vs_format2": versus(runs[FORMAT3], runs[FORMAT2])}


def bench(gib: float, reps: int, app: Path | None, root: Path) -> dict[str, Any] | None:
    weights, env = build(root, [round(gib * GIB)])
    if not weights:
        return None
    ((name, size),) = weights.items()
    source, artifact = root / name / "model.onnx", root / "dist" / "cpu" / name
    old = format2_copy(artifact, root / "format2", root / "keys" / "signing.key")

    def python(where: Path, mode: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            r = child(mode, root, name, env, where)
            return {"seconds": r["seconds"], "rss": r["peak_rss"]}
        return run

    result: dict[str, Any] = {"gib": gib, "model": name, "weights": size, "reps": reps,
                              "python": summary(rounds(reps, {PLAIN: python(source, "plain"),
                                                              FORMAT3: python(artifact, "loader"),
                                                              FORMAT2: python(old, "loader")}))}
    if app is not None:
        result["node"] = summary(rounds(reps, {
            PLAIN: lambda: node_first_runs("plain", app, source, WIDTH, env),
            FORMAT3: lambda: node_first_runs("loader", app, artifact, WIDTH, env),
            FORMAT2: lambda: node_first_runs("loader", app, old, WIDTH, env)}))
    return result


def table(r: dict[str, Any]) -> str:
    lines = [f"### {r['gib']:g} GiB ({r['model']}, {r['weights'] / MB:.0f} MB of weights), medians of {r['reps']} "
             "alternating fresh processes", "",
             "| runtime | mode | time to first inference | peak RSS | time / plain | peak RSS / plain |",
             "|---|---|---|---|---|---|"]
    for runtime, label in (("python", "Python"), ("node", "Node")):
        if runtime not in r:
            continue
        s = r[runtime]
        plain = s["format3_vs_plain"]["plain"]
        lines.append(f"| {label} | plain ORT from a path | {plain['seconds']:.2f} s | {plain['rss'] / MB:.0f} MB | "
                     "1 | 1 |")
        for fmt, key in ((FORMAT3, "format3_vs_plain"), (f"{FORMAT2} (previous)", "format2_vs_plain")):
            v = s[key]
            lines.append(f"| {label} | loader, {fmt} | {v['loader']['seconds']:.2f} s | "
                         f"{v['loader']['rss'] / MB:.0f} MB | **{v['time_ratio']:.2f}x** | **{v['rss_ratio']:.2f}x** |")
        gain = s["format3_vs_format2"]
        lines.append(f"| {label} | loader, format 3 / format 2 (the gain) | | | **{gain['time_ratio']:.2f}x** | "
                     f"**{gain['rss_ratio']:.2f}x** |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, action="append", help="weights per model (default 0.0625 and 0.5)")
    ap.add_argument("--reps", type=int, default=3, help="rounds of fresh processes (medians)")
    ap.add_argument("--no-node", action="store_true", help="skip the Node loader and onnxruntime-node")
    ap.add_argument("--json", help="write every run, the medians and the ratios here")
    a = ap.parse_args()
    app = None if a.no_node else node_app()
    load = os.getloadavg()[0]
    results = []
    for gib in a.gib or [0.0625, 0.5]:
        with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:  # one size on disk at a time
            result = bench(gib, a.reps, app, Path(tmp))
        if result is not None:
            results.append(result)
            print(table(result), end="\n\n", flush=True)
    print(f"# {describe()}")
    print(f"# {os.cpu_count()} CPUs; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
