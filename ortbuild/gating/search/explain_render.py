"""What `ortbuild test --explain` reports: the JSON document's layer table and the text printed per job."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ortbuild.gating.records import ExplainDoc, LayerDoc
from ortbuild.gating.search.bisect import Trial, describe_set
from ortbuild.gating.search.layerwise import Layer
from ortbuild.status import Verdict


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(f"{x:.4g}")


def layers_doc(layers: Sequence[Layer]) -> list[LayerDoc]:
    out = []
    for x in layers[:20]:
        d: LayerDoc = {"node": x.node, "op_type": x.op_type,
                       "error": (x.note or "n/a") if x.error is None else _num(x.error), "added": _num(x.added),
                       "weights": x.weights}
        if x.alone is not None:
            d["alone"] = {"passed": x.alone.passed, "error": _num(x.alone.error), "worst": x.alone.worst}
        out.append(d)
    return out


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} B"


def _shown(v: object) -> str:
    """A value in a table: never `None`."""
    return "-" if v is None else str(v)


def render(job_name: str, doc: ExplainDoc) -> list[str]:
    """What `ortbuild test` prints for one explained job."""
    lines = [f"explain {job_name}: {doc['status']}" + (f": {doc['reason']}" if doc.get("reason") else "")]
    p = doc.get("predictions") or {}
    if p.get("status") == "on":
        lines.append(f"  predicted (no rebuild): {p['predicted']} of {p['candidates']} candidate(s) kept in float "
                     f"alone, {p['seconds']} s; the failing artifact predicted as {p['baseline']}")
    elif p.get("status") == "off":
        lines.append(f"  predictions off: {p['reason']}")
    if doc.get("renamed"):
        names = doc["renamed"]
        lines.append(f"  not searched: {len(names)} quantized node(s) the source model has no name for (the "
                     f"quantizers' pre-processing or the fusion renamed them: {', '.join(names[:3])}"
                     f"{' ...' if len(names) > 3 else ''}); quantization = {{ preprocess = false }} keeps the names")
    for x in doc.get("layers", [])[:5]:
        line = (f"  layer-wise: {x['node']} ({x['op_type']}) error {_shown(x['error'])} vs fp32, "
                f"adds {_shown(x['added'])}")
        if x.get("weights"):
            line += f", {_size(x['weights'])} of weights"
        if x.get("alone"):
            a = x["alone"]
            line += f"; kept in float alone: {a['worst']} ({Verdict.PASS if a['passed'] else Verdict.FAIL}, predicted)"
        lines.append(line)
    for t in doc.get("trials", []):
        lines.append(f"  rebuild: {Trial(**t).describe()}")
    for s in doc.get("skipped", []):
        lines.append(f"  not rebuilt: {describe_set(s['nodes'], s['op_types'])}: the same graph as {s['same_as']}")
    if doc.get("status") == "found":
        r = doc["result"]
        size = r.get("size") or {}
        lines.append(f"  result ({doc['rebuilds']} rebuilds, {doc['seconds']} s): accuracy {_shown(r['accuracy'])} "
                     f"({_shown(r['worst'])}), size {size.get('bytes', 0) / 1024:.1f} KB ({size.get('ratio', 0):.2f}x "
                     f"the source, {_shown(r['size_verdict'])}), latency p50 "
                     + (f"{r['p50_ms']:.3f} ms" if isinstance(r["p50_ms"], float) else "-")
                     + f" ({'no budget' if r['latency_verdict'] in ('-', None) else r['latency_verdict']})")
        lines.append("  paste into targets.toml:\n")
        lines += doc["override"].rstrip("\n").splitlines()
        lines.append("")
    return lines
