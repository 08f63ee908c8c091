"""TEMPORARY wiring of the load scenarios (`throughput`, `server`, `multi_stream`) into `ortbuild test` until
the gate registry (ortbuild/gating/registry.py) lands: Tester.gate calls `judge`, which runs each gate with a
loadgen.Context and writes their verdicts and sections to LOAD_REPORT in the artifact folder. The registry
replaces this module: it calls each gate(ctx) and records the sections in the typed test record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ortbuild import files, paths
from ortbuild.gating import loadgen, multistream, server, throughput
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.artifact import golden, manifest
    from ortbuild.gating.gates import Tester, TestResult
    from ortbuild.project.plan import Job

LOAD_REPORT = "load-report.json"
SCENARIOS: dict[str, Callable[[loadgen.Context], tuple[Verdict | str, dict[str, object], list[str]]]] = {
    "throughput": throughput.gate, "server": server.gate, "multi_stream": multistream.gate}


def judge(tester: Tester, job: Job, res: TestResult, module: ModuleType, g: golden.Golden,
          m: manifest.Manifest) -> None:
    """Run the load scenarios the target declares; failure lines into `res` (exit 9), an INCONCLUSIVE one makes
    the result INCONCLUSIVE (when nothing failed)."""
    lat = job.settings.gates.latency if job.settings.gates is not None else None
    if lat is None or (lat.offline is None and lat.server is None and lat.multi_stream is None):
        return
    folder: Path = paths.inside(tester.dist, job.target.name, job.model.name)
    ctx = loadgen.Context(tester.project, job, tester.dist, folder, tester.secret, tester.quick,
                          lambda name, text: tester.progress(name, text), module, g, m,
                          find_peak=bool(getattr(tester, "find_peak", False)))
    doc: dict[str, object] = {}
    for name, gate in SCENARIOS.items():
        verdict, section, lines = gate(ctx)
        doc[name] = {"verdict": str(verdict), **section}
        if lines:
            res.fail(lines)
        elif verdict == Verdict.INCONCLUSIVE and not res.failures:
            res.status = Verdict.INCONCLUSIVE
            res.reason = "; ".join(x for x in (res.reason, f"{name} inconclusive") if x)
    files.atomic_write(folder / LOAD_REPORT, (json.dumps(doc, indent=2, default=str) + "\n").encode(),
                       root=tester.dist)
