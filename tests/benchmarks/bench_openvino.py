"""Benchmark of the compiled OpenVINO artifacts (nox -s benchmark). Ratios measured side by side in one process.

1. Session creation: the openvino-cpu artifact (EPContext, OpenVINO's blob embedded), decrypted in memory and
   opened with session.disable_model_compile = 1, vs the source model compiled by OpenVINO at load (what an app
   does without ortbuild). Creations alternate between the two, REPS times each.
2. Latency: the openvino-cpu artifact vs the cpu-fp32 artifact of the same model (CPU EP), runs interleaved.

Where the OpenVINO plugin EP offers no device (it supports Intel hardware only) it prints why and exits 0.

    python tests/benchmarks/bench_openvino.py [DIST] [--reps N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ortbuild import runtime  # noqa: E402
from ortbuild.artifact import loaders  # noqa: E402
from ortbuild.project import config  # noqa: E402


def _plaintext(folder: Path) -> bytes:
    """The artifact's model bytes, verified and decrypted in memory by its own generated loader."""
    mod: Any = loaders.import_python_loader(loaders.python_path(folder, folder.name))
    manifest = mod.verify(folder)
    files = mod._read_files(folder, manifest)
    (name,) = files
    return bytes(mod.decrypt_container(files[name], None) if manifest["encryption"] else files[name])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dist", nargs="?", default=str(REPO / "dist"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    import onnxruntime as ort

    project = config.load(REPO / "targets.toml")
    target = project.targets["openvino-cpu"]
    ov = target.providers[0]
    plugin = target.plugin_for(ov.name)
    assert plugin is not None
    devices, why = runtime.plugin_devices(plugin, str(ov.options.get("device_type", "CPU")))
    if why:
        print(f"bench_openvino: skipped: {why}")
        return 0
    opts = runtime.plugin_options(ov)

    def session(model: bytes | str, precompiled: bool) -> Any:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 2
        if precompiled:
            so.add_session_config_entry("session.disable_model_compile", "1")
        so.add_provider_for_devices(devices, opts)
        return ort.InferenceSession(model, so)

    rows = []
    for name in target.models:
        folder = Path(args.dist) / "openvino-cpu" / name
        doc = json.loads((folder / "manifest.json").read_text())
        if not doc.get("compiled"):
            print(f"{name}: not compiled ahead of time ({'; '.join(doc['notes'][-1:])}): left out")
            continue
        compiled = _plaintext(folder)
        source = str(project.models[name].path)
        create: dict[str, list[float]] = {"compiled": [], "at_load": []}
        for _ in range(args.reps):
            for kind, model, pre in (("compiled", compiled, True), ("at_load", source, False)):
                t = time.perf_counter()
                session(model, pre)
                create[kind].append((time.perf_counter() - t) * 1e3)
        feed = dict(np.load(project.models[name].inputs))
        cpu_folder = Path(args.dist) / "cpu-fp32" / name
        cpu: Any = loaders.import_python_loader(loaders.python_path(cpu_folder, name)).load(folder=cpu_folder)
        ovs = session(compiled, True)
        lat: dict[str, list[float]] = {"openvino": [], "cpu": []}
        for _ in range(200):
            for kind, sess in (("openvino", ovs), ("cpu", cpu.session)):
                t = time.perf_counter()
                sess.run(None, feed)
                lat[kind].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(v) for k, v in (create | lat).items()}
        rows.append({"model": name, **{f"{k}_ms": round(v, 3) for k, v in med.items()},
                     "creation_speedup": round(med["at_load"] / med["compiled"], 2),
                     "openvino_vs_cpu": round(med["cpu"] / med["openvino"], 2)})
    print(f"{'model':18} {'create compiled':>16} {'create at load':>15} {'speed-up':>9} {'OV p50':>8} "
          f"{'CPU p50':>8} {'OV vs CPU':>10}")
    for r in rows:
        print(f"{r['model']:18} {r['compiled_ms']:13.2f} ms {r['at_load_ms']:12.2f} ms {r['creation_speedup']:8.2f}x "
              f"{r['openvino_ms']:8.3f} {r['cpu_ms']:8.3f} {r['openvino_vs_cpu']:9.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
