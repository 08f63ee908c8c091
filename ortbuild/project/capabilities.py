"""What ortbuild does with each execution provider a user may name: one table, three readers.

config refuses the providers marked unsupported (with the message below), docs/targets.md is generated from
this table (`ortbuild schema --write`), and `ortbuild targets` prints it with this machine's answers.
Stdlib only: the noxfile imports it (through ortbuild.project.config) before any venv exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortbuild.project.providers import MOBILE_PROVIDERS

VERIFIED, PARTLY, UNVERIFIED, UNSUPPORTED = "verified", "verified where its hardware is", "unverified", "not supported"


@dataclass(frozen=True)
class Capability:
    label: str                       # what users call it
    providers: tuple[str, ...]       # ONNX Runtime provider names
    runtime: str                     # the pip packages that provide it (a targets.toml `runtime`)
    status: str                      # VERIFIED, PARTLY, UNVERIFIED or UNSUPPORTED
    portable: str                    # what ortbuild builds on a machine without the provider's hardware
    with_hardware: str               # what it adds where the provider runs
    verified: str                    # where and when it was verified, honestly
    reason: str = ""                 # UNSUPPORTED: why (part of the config error)


PORTABLE = "precision step + basic-level graph (any provider loads it); tests SKIPPED with the reason"


def _mobile(provider: str, short: str) -> str:
    """Why a mobile-only EP is refused, and what to build for it instead."""
    return (f"it ships in {MOBILE_PROVIDERS[provider]}. A mobile package is meant for it: build this target with "
            'providers = ["CPUExecutionProvider"] and format = "ort" (model.ort and required_operators.config, '
            f"for a reduced ONNX Runtime build: docs/targets.md, Mobile packages), and register {short} in the app")


CAPABILITIES: tuple[Capability, ...] = (
    Capability("CPU", ("CPUExecutionProvider",), "onnxruntime==1.31.1 (every flavor has it)", VERIFIED,
               "everything: precision, optimization at any level, golden, latency and size gates",
               "-", "every CI run (x86-64, 2 vCPU); the examples' targets cpu-*"),
    Capability("OpenVINO", ("OpenVINOExecutionProvider",),
               'runtime = ["onnxruntime==1.31.1", "onnxruntime-ep-openvino==1.8.1"] (compiled artifact); '
               "or onnxruntime-openvino==1.24.1 (graph compiled at every load)", PARTLY,
               PORTABLE,
               "plugin: an EPContext artifact with OpenVINO's compiled blob embedded, encrypted, loaded with "
               "session.disable_model_compile = 1; fp32 targets pin INFERENCE_PRECISION_HINT = f32",
               "the plugin offers devices on Intel hardware only: on AMD CPUs (this project's 2026-11-23 "
               "session machine) the target is SKIPPED with that reason; the compile-and-reload recipe was "
               "verified on an Intel Xeon (AMX) with 1.31.1 + 1.8.1. onnxruntime-openvino 1.24.1: tested "
               "here (tests-openvino); its EPContext models do not reload"),
    Capability("CUDA", ("CUDAExecutionProvider",), "onnxruntime-gpu==1.31.1", UNVERIFIED, PORTABLE,
               "optimization at the target's level on the GPU; defaults cudnn_conv_algo_search = EXHAUSTIVE "
               "and use_tf32 = false (stated in the manifest)",
               "not on a GPU yet: docs/gpu-results.md"),
    Capability("TensorRT", ("TensorrtExecutionProvider",), "onnxruntime-gpu==1.31.1 (+ TensorRT libraries)",
               UNVERIFIED, PORTABLE,
               "the engine built at build time into an EPContext artifact, encrypted; engine caches and "
               "plaintext dumps refused", "not on a GPU yet: docs/gpu-results.md"),
    Capability("DirectML", ("DmlExecutionProvider",), "onnxruntime-directml (Windows only)", UNVERIFIED,
               PORTABLE + ", on Windows", "optimization at the target's level",
               "never: no Windows machine here"),
    Capability("CoreML", ("CoreMLExecutionProvider",), "onnxruntime (macOS wheels); iOS: onnxruntime-objc / "
               "onnxruntime-c (CocoaPods)", UNVERIFIED,
               PORTABLE + " (tested here: the Linux wheel has no CoreML)",
               "optimization at the target's level; with format = \"ort\", a mobile package (the basic-level .ort "
               "and its required_operators.config)",
               "the portable path only, in the test suite (a CoreML mobile package in tests/test_operators.py)"),
    Capability("ROCm / MIGraphX", ("ROCMExecutionProvider", "MIGraphXExecutionProvider"),
               "onnxruntime-rocm / onnxruntime-migraphx", UNVERIFIED, PORTABLE,
               "optimization at the target's level", "never: no AMD GPU here"),
    Capability("QNN", ("QNNExecutionProvider",), "onnxruntime-qnn", UNVERIFIED, PORTABLE,
               "optimization at the target's level", "never: no Qualcomm NPU here"),
    Capability("NNAPI", ("NnapiExecutionProvider",), "none on PyPI: onnxruntime-android (Maven)", UNSUPPORTED,
               "-", "-", "-", _mobile("NnapiExecutionProvider", "NNAPI")),
    Capability("XNNPACK", ("XnnpackExecutionProvider",), "none on PyPI: onnxruntime-android (Maven), "
               "onnxruntime-objc / onnxruntime-c (CocoaPods)", UNSUPPORTED, "-", "-", "-",
               _mobile("XnnpackExecutionProvider", "XNNPACK")),
    Capability("WebGPU", ("WebGpuExecutionProvider",), "onnxruntime-ep-webgpu (plugin) / onnxruntime-webgpu",
               UNSUPPORTED, "-", "-", "-",
               "no GPU here to verify it, and its Python plugin (onnxruntime-ep-webgpu 0.4) is pre-1.0"),
)

# The other names ONNX Runtime knows: refused with the same kind of message.
OTHERS: dict[str, str] = {
    "NvTensorRTRTXExecutionProvider": "RTX-class GPUs, and no GPU here to verify it",
    "DnnlExecutionProvider": "no ONNX Runtime wheel on PyPI ships it",
    "AzureExecutionProvider": "it calls a remote endpoint: there is no local artifact to build",
    "VitisAIExecutionProvider": "AMD Ryzen AI / Xilinx devices, none here to verify it",
    "CANNExecutionProvider": "Huawei Ascend devices, none here to verify it",
    "ACLExecutionProvider": "no ONNX Runtime wheel on PyPI ships it",
    "ArmNNExecutionProvider": "no ONNX Runtime wheel on PyPI ships it",
    "JsExecutionProvider": "the WebAssembly/JavaScript build only (onnxruntime-web)",
    "SNPEExecutionProvider": "deprecated by ONNX Runtime in favour of QNN",
    "RknpuExecutionProvider": "no ONNX Runtime wheel on PyPI ships it",
}


def of(provider: str) -> Capability | None:
    return next((c for c in CAPABILITIES if provider in c.providers), None)


def unsupported(provider: str) -> str | None:
    """The config error's message for a provider ortbuild does not support yet, or None."""
    cap = of(provider)
    reason = cap.reason if cap is not None and cap.status == UNSUPPORTED else OTHERS.get(provider)
    if reason and provider in MOBILE_PROVIDERS:  # checked in 1.31.1's Linux (x86_64, aarch64) and macOS wheels
        return f"{provider} is in no ONNX Runtime wheel on PyPI, so no target's runtime offers it: {reason}"
    return f"{provider} is not supported by ortbuild yet: {reason}" if reason else None


def supported() -> list[str]:
    return [p for c in CAPABILITIES if c.status != UNSUPPORTED for p in c.providers]


def markdown() -> str:
    """The table of docs/targets.md (between its generated-table markers)."""
    rows = ["| EP | runtime (pip) | status | built without its hardware | added where it runs | verified |",
            "|---|---|---|---|---|---|"]
    for c in CAPABILITIES:
        status = c.status if c.status != UNSUPPORTED else f"{UNSUPPORTED}: `{unsupported(c.providers[0])}`"
        rows.append(f"| {c.label} (`{'`, `'.join(c.providers)}`) | {c.runtime} | {status} | {c.portable} | "
                    f"{c.with_hardware} | {c.verified} |")
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- generated from ortbuild/project/capabilities.py: begin -->", "<!-- generated: end -->"


def spliced(document: str) -> str:
    """`document` (docs/targets.md) with the table between its markers regenerated."""
    if BEGIN not in document or END not in document:
        raise ValueError(f"the capability table's markers are missing: {BEGIN} ... {END}")
    head, rest = document.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{markdown()}{END}{rest.split(END, 1)[1]}"
