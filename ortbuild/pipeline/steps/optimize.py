"""The optimize step: offline graph optimization inside the target's runtime, with its providers and level.

The optimized graph is written by ORT itself (SessionOptions.optimized_model_filepath) into the build's
private temp dir. What the result is tied to is read off the graph: com.microsoft contrib ops need the
providers that fused them, com.microsoft.nchwc ops need the build CPU's SIMD width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

import onnx

from ortbuild import machine, modelfiles, runtime
from ortbuild.artifact import manifest_types
from ortbuild.pipeline.steps import accounting
from ortbuild.project import options
from ortbuild.project.config import Provider, Settings
from ortbuild.project.precisions import Quantizer, Serialization, fp16_upcast_hint


@dataclass(frozen=True)
class OptimizeResult:
    path: Path
    requested: str
    applied: str
    providers: list[str]              # the providers the optimizing session ran with
    portable: bool                    # True: plain ONNX that any provider can load
    tied_to: manifest_types.TiedTo          # {"providers": [...], "simd_level": "..."} where not portable
    op_domains: dict[str, int]        # node count per domain in the artifact
    notes: list[str] = field(default_factory=list)
    disabled_optimizers: list[str] = field(default_factory=list)
    inflation: manifest_types.Inflation | None = None

    def manifest_section(self) -> manifest_types.Optimization:
        """The manifest's `optimization` (a compile step that ran amends it: CompileResult.amend)."""
        return manifest_types.Optimization(requested=self.requested, applied=self.applied, portable=self.portable,
                                     tied_to=self.tied_to.copy(), optimized_with=self.providers,
                                     op_domains=self.op_domains, disabled_optimizers=self.disabled_optimizers,
                                     inflation=self.inflation)


FOLDING = "ConstantFolding"
COMPILED_AT_LOAD = "cannot serialize compiled nodes"  # the note a compile step makes obsolete
GROWTH = 1.02  # weight bytes may grow this much (+ 4 KB: fusions add small constants) before it counts as inflation


def inflation(before: Path, after: Path) -> manifest_types.Inflation | None:
    """What constant folding grew: initializers of `after` that `before` computed in the graph (from smaller
    stored weights through Cast / DequantizeLinear / Mul ...), when the weights grew by more than GROWTH. Both are
    ONNX (protobuf) files."""
    src, out = onnx.load(str(before), load_external_data=False), onnx.load(str(after), load_external_data=False)
    a, b = accounting.weights(src), accounting.weights(out)
    size_a, size_b = sum(n for _, n in a.values()), sum(n for _, n in b.values())
    if size_b <= GROWTH * size_a + 4096:
        return None
    producers = {o: n for g in accounting.graphs(src.graph) for n in g.node for o in n.output}
    grown: list[manifest_types.Grown] = []
    for name, (dt, nbytes) in sorted(b.items(), key=lambda kv: -kv[1][1]):
        if name in a and a[name][1] >= nbytes:
            continue
        node = producers.get(name)
        chain: list[str] = []
        while node is not None and len(chain) < 4:  # walk back to the stored weight
            chain.append(node.op_type)
            node = next((producers[i] for i in node.input if i in producers), None)
        grown.append({"initializer": name, "dtype": onnx.TensorProto.DataType.Name(dt).lower(), "bytes": nbytes,
                      "pattern": " <- ".join(chain) or "fused"})
    return {"weights_before": size_a, "weights_after": size_b, "growth": round(size_b / max(1, size_a), 2),
            "grown": grown[:10]}


def _domains(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        d = node.domain or "ai.onnx"
        counts[d] = counts.get(d, 0) + 1
    return dict(sorted(counts.items()))




def _size(path: Path) -> int:
    """Bytes of the model at `path`, its external data included."""
    return modelfiles.of(path, hashed=False).size


def run(src: Path, settings: Settings, usable: list[Provider], missing: dict[str, str], work: Path,
        external: bool = False) -> OptimizeResult:
    """external: ORT writes the optimized model's weights as external data (<name>.data beside it)."""
    ort = runtime.import_ort()

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
                notes.append(f"{compiling[0]} compiles subgraphs at session creation, and ORT {COMPILED_AT_LOAD}"
                             " into a graph: the artifact holds the portable basic-level graph, which the "
                             "provider compiles when the artifact is loaded")

    names, opts = runtime.ort_provider_args(tuple(providers))
    disabled = list(settings.disabled_optimizers)
    if settings.constant_folding == "off" and FOLDING not in disabled:
        disabled.append(FOLDING)

    def optimized(path: Path, disabled: list[str]) -> Path:
        path.parent.mkdir(exist_ok=True)
        so = runtime.session_options(settings, level)
        so.optimized_model_filepath = str(path)
        if external:  # a graph of any size: ORT writes every tensor over 1 KB into one file beside it
            so.add_session_config_entry(runtime.EXTERNAL_FILE, f"{path.name}.data")
            so.add_session_config_entry(runtime.EXTERNAL_MIN, "1024")
        ort.InferenceSession(str(src), so, providers=names, provider_options=opts, disabled_optimizers=disabled)
        return path

    unknown = sorted(set(disabled) - options.KNOWN_OPTIMIZERS)
    if unknown:
        notes.append(f"disabled_optimizers: {', '.join(unknown)} not among the optimizers found in onnxruntime "
                     "1.31.1; ORT ignores unknown names silently (check the spelling)")
    fmt = settings.format_rule
    onnx_graph = fmt.serialization is Serialization.PROTOBUF  # ORT's flatbuffer: onnx cannot read it
    main = fmt.file  # the artifact's own names: its external data is model.onnx.data
    out = optimized(work / "optimized" / main, disabled)
    found = inflation(src, out) if FOLDING not in disabled and onnx_graph else None
    if found:
        what = ", ".join(f"{g['initializer']} ({g['dtype']}, {g['bytes'] / 1024:.0f} KB, from {g['pattern']})"
                         for g in found["grown"][:3])
        if settings.constant_folding == "auto":
            retry = optimized(work / "optimized-nofold" / main, [*disabled, FOLDING])
            before, after = _size(out), _size(retry)
            if after < before:
                found["action"] = f"optimized again with {FOLDING} disabled"
                notes.append(f"constant folding grew the weights {found['growth']}x ({what}): optimized again "
                             f"with {FOLDING} disabled ({before / 1024:.0f} KB -> {after / 1024:.0f} KB)")
                modelfiles.remove(out)
                out, disabled = retry, [*disabled, FOLDING]
            else:
                modelfiles.remove(retry)
                found["action"] = "kept: disabling it did not make the artifact smaller"
                notes.append(f"the weights grew {found['growth']}x at optimization ({what}), not by constant "
                             "folding: disabling it did not help, kept")
        else:
            found["action"] = "kept (constant_folding = \"on\")"
            notes.append(f"constant folding grew the weights {found['growth']}x ({what}); kept because "
                         "constant_folding = \"on\"")

    domains = _domains(out) if onnx_graph else {}
    tied: manifest_types.TiedTo = {}
    match fmt.serialization:
        case Serialization.FLATBUFFER:  # onnx cannot read it: assume what the level can do
            if not options.LEVEL_RULES[level].portable:
                tied["providers"] = names
            if options.LEVEL_RULES[level].nchwc:
                tied["simd_level"] = machine.simd_level()
        case Serialization.PROTOBUF:  # read off the graph: contrib ops need the providers that fused them,
            if any(d.startswith("com.microsoft") for d in domains):  # NCHWc ops the SIMD width
                tied["providers"] = names
            if "com.microsoft.nchwc" in domains:
                tied["simd_level"] = machine.simd_level()
        case _:
            assert_never(fmt.serialization)
    if settings.rule.quantizer is Quantizer.FP16:
        grown = _size(out) / max(1, _size(src))
        upcast = fp16_upcast_hint(settings.rule.quantizer, level, names, grown)
        if upcast:
            notes.append(f"{upcast} (artifact {grown:.2f}x the fp16 model)")
    return OptimizeResult(path=out, requested=requested, applied=level, providers=names,
                          portable=not tied, tied_to=tied, op_domains=domains, notes=notes,
                          disabled_optimizers=disabled, inflation=found)
