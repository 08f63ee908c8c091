"""The compile step (compiling providers): compile ahead of time into an EPContext model.

OpenVINO (as a plugin EP) and TensorRT compile subgraphs at session creation, which costs the user seconds at
every load. ONNX Runtime's compile API (`ModelCompiler`) runs that compilation at build time and returns, in
memory, an ONNX model whose `EPContext` nodes embed the compiled blob or engine. The build seals it like any
artifact (the blob holds the weights: it is never written in plaintext outside the build's private temp dir);
loaders open it with session.disable_model_compile = 1, which fails instead of compiling again.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from ortbuild import machine, runtime
from ortbuild.artifact import manifest_types
from ortbuild.project import options
from ortbuild.project.config import Provider, Settings

EP_CONTEXT = "EPContext"


@dataclass(frozen=True)
class CompileResult:
    path: Path | None                # the EPContext model; None when the provider compiled no node
    provider: str
    device: str
    ep_context_nodes: int            # nodes holding a compiled partition
    other_nodes: int                 # nodes left to other providers (the CPU fallback)
    seconds: float
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> manifest_types.Compiled:
        return {"provider": self.provider, "device": self.device, "ep_context_nodes": self.ep_context_nodes,
                "other_nodes": self.other_nodes, "embedded": True, "seconds": round(self.seconds, 3)}

    @property
    def compiled(self) -> bool:
        """The provider compiled some node: the artifact is the EPContext model."""
        return self.path is not None

    def manifest_section(self) -> manifest_types.Compiled | None:
        return self.as_json() if self.compiled else None

    def amend(self, optimization: manifest_types.Optimization) -> manifest_types.Optimization:
        """A compiled blob is native code for its provider, device and CPU: the artifact is tied to them and no
        longer portable."""
        if not self.compiled:
            return optimization
        tied = optimization.tied_to.copy()
        tied["providers"] = sorted({*tied.get("providers", []), self.provider})
        tied["compiled_for"] = {"provider": self.provider, "device": self.device, "cpu": machine.cpu_model(),
                                "simd_level": machine.simd_level()}
        return dataclasses.replace(optimization, portable=False, tied_to=tied)


def provider_to_compile(usable: list[Provider], plugins: dict[str, options.PluginEP]) -> Provider | None:
    """The provider this build compiles for: the first usable one that compiles ahead of time. OpenVINO only as
    the plugin EP (the EPContext models of onnxruntime-openvino 1.24.1 do not reload: docs/targets.md)."""
    for p in usable:
        if p.name in options.EPCONTEXT_PROVIDERS and (p.name != "OpenVINOExecutionProvider" or p.name in plugins):
            return p
    return None


def run(src: Path, settings: Settings, provider: Provider, plugins: dict[str, options.PluginEP], work: Path,
        ) -> CompileResult:
    import onnx
    ort = runtime.import_ort()

    so = runtime.session_options(settings, "disable")  # the graph was optimized by the optimize step
    if provider.name in plugins:
        runtime.add_plugin_provider(so, provider, plugins[provider.name])
    else:
        _, opts = runtime.ort_provider_args((provider,))
        so.add_provider(provider.name, opts[0])
    t0 = time.perf_counter()
    compiled = ort.ModelCompiler(so, str(src), embed_compiled_data_into_model=True).compile_to_bytes()
    seconds = time.perf_counter() - t0
    model = onnx.load_from_string(compiled)
    nodes = [n for n in model.graph.node if n.op_type == EP_CONTEXT]
    device = str(provider.options.get("device_type", "GPU" if "Tensorrt" in provider.name else "CPU"))
    if not nodes:
        return CompileResult(None, provider.name, device, 0, len(model.graph.node), seconds, [
            f"{provider.name} compiled no node of this model (none of its operators is supported there): the "
            "artifact is the basic-level graph, run by the CPU provider"])
    out = work / "compiled.onnx"
    out.write_bytes(compiled)  # the build's private temp dir: sealed (encrypted) by the encrypt step
    notes = [f"compiled ahead of time for {provider.name} ({device}) in {seconds:.2f} s: an EPContext model with "
             "the compiled blob embedded, loaded with session.disable_model_compile = 1"]
    other = len(model.graph.node) - len(nodes)
    if other:
        notes.append(f"{provider.name} compiled {len(nodes)} partition(s); {other} node(s) run on the CPU "
                     "provider (unsupported there)")
    return CompileResult(out, provider.name, device, len(nodes), other, seconds, notes)
