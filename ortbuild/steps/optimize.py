"""Step 3: offline graph optimization inside the target's runtime, with its providers and level.

The optimized graph is written by ORT itself (SessionOptions.optimized_model_filepath) into the build's
private temp dir. What the result is tied to is read off the graph: com.microsoft contrib ops need the
providers that fused them, com.microsoft.nchwc ops need the build CPU's SIMD width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from .. import options, runtime
from ..config import Provider, Settings


@dataclass(frozen=True)
class OptimizeResult:
    path: Path
    requested: str
    applied: str
    providers: list[str]              # the providers the optimizing session ran with
    portable: bool                    # True: plain ONNX that any provider can load
    tied_to: dict[str, Any]           # {"providers": [...], "simd_level": "..."} where not portable
    op_domains: dict[str, int]        # node count per domain in the artifact
    notes: list[str] = field(default_factory=list)


def _domains(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    if path.suffix == ".ort":
        return counts  # a flatbuffer: onnx cannot read it
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        d = node.domain or "ai.onnx"
        counts[d] = counts.get(d, 0) + 1
    return dict(sorted(counts.items()))


def run(src: Path, settings: Settings, usable: list[Provider], missing: dict[str, str], work: Path,
        ) -> OptimizeResult:
    import onnxruntime as ort

    notes: list[str] = []
    requested = level = settings.optimization
    providers = usable
    compiling = [p.name for p in usable if p.name in options.COMPILING_PROVIDERS]
    if missing or compiling:
        level = options.cap_level(level)
        capped = level != requested
        if missing:
            providers = [Provider("CPUExecutionProvider")]
            notes.append("portable build: precision + basic level only, no provider-specific optimization")
        else:
            providers = [p for p in usable if p.name not in options.COMPILING_PROVIDERS] or [
                Provider("CPUExecutionProvider")]
            if capped:
                notes.append(f"{compiling[0]} compiles subgraphs at session creation, and ORT cannot serialize "
                             "compiled nodes: the artifact holds the portable basic-level graph, which the "
                             "provider compiles when the artifact is loaded")

    out = work / ("optimized.ort" if settings.format == "ort" else "optimized.onnx")
    so = runtime.session_options(settings, level)
    so.optimized_model_filepath = str(out)
    names, opts = runtime.ort_provider_args(tuple(providers))
    ort.InferenceSession(str(src), so, providers=names, provider_options=opts)

    domains = _domains(out)
    tied: dict[str, Any] = {}
    if settings.format == "ort":  # a flatbuffer that onnx cannot read: assume what the level can do
        if not options.LEVEL_RULES[level].portable:
            tied["providers"] = names
        if options.LEVEL_RULES[level].nchwc:
            tied["simd_level"] = runtime.simd_level()
    else:  # read off the graph: contrib ops need the providers that fused them, NCHWc ops the SIMD width
        if any(d.startswith("com.microsoft") for d in domains):
            tied["providers"] = names
        if "com.microsoft.nchwc" in domains:
            tied["simd_level"] = runtime.simd_level()
    if (settings.precision == options.FP16 and "CPUExecutionProvider" in names
            and not options.LEVEL_RULES[level].portable):
        grown = out.stat().st_size / max(1, src.stat().st_size)
        if grown > 1.3:
            notes.append(f"the CPU provider has no fp16 kernels: at level '{level}' ORT upcast the weights "
                         f"to fp32 (artifact {grown:.2f}x the fp16 model); "
                         f"use optimization = \"{options.PORTABLE_LEVEL}\" to keep fp16 storage")
    return OptimizeResult(path=out, requested=requested, applied=level, providers=names,
                          portable=not tied, tied_to=tied, op_domains=domains, notes=notes)
