"""The targets `ortbuild init` writes (`--target NAME`), each a TOML table body, and the models a preset of reduced
precision suits (docs/project.md)."""

from __future__ import annotations

from collections.abc import Sequence

from ortbuild.errors import UsageError
from ortbuild.project import signature

RUNTIME = "onnxruntime==1.31.1"  # the CPU flavor this ortbuild is tested with

# Targets `init --target` offers, each a TOML table body; a preset's parents come along (`extends`).
PRESETS: dict[str, tuple[str | None, str]] = {
    "cpu-fp32": (None, f'''description = "x86/ARM servers, full precision"
runtime = "{RUNTIME}"
providers = ["CPUExecutionProvider"]
precision = "fp32"
optimization = "all"
# release gates (`ortbuild test`): fp32 must match the source within rtol 1e-4 / atol 1e-5 and stay under 1.1x
# its size; add latency budgets measured on your hardware, e.g.
# latency = {{ p90_ms = 50, p99_ms = 100 }}
'''),
    "cpu-int8": ("cpu-fp32", '''description = "CPU servers, int8 weights (dynamic: no calibration data needed)"
extends = "cpu-fp32"
precision = "int8-dynamic"
# reduce_range: 7-bit weights, ORT's advice for x86 CPUs without VNNI; accuracy default: cosine >= 0.99
quantization = { per_channel = true, reduce_range = true }
# the precision is a goal: where int8 fails its accuracy rule, the build keeps the layers that break it in float
# and records them in targets.lock (commit it); docs/build-to-the-gates.md
precision_search = "auto"
# the build times int8 against fp32 on the machine it runs on and ships the faster that passes: where int8 is
# measured slower (as on some CPUs without VNNI), fp32 ships and the lock says why (docs/build-to-the-gates.md)
candidates = ["fp32"]
'''),
    "cpu-int4": ("cpu-fp32", '''description = "memory-bound CPU devices: block-wise int4 weights of MatMul nodes"
extends = "cpu-fp32"
precision = "int4-weight"
int4 = { block_size = 32, symmetric = true }
'''),
    "arm64-int8": ("cpu-int8", '''description = "ARM64 servers and boards, int8 (golden-tested here under emulation)"
extends = "cpu-int8"
platform = "linux-aarch64"
optimization = "extended"
quantization = { reduce_range = false }
# timed where it runs, not under emulation: list candidates when building on such a machine
candidates = []
'''),
    "x86-v3-int8": ("cpu-int8", '''description = "x86 servers without AVX-512 (x86-64-v3: AVX2), int8"
extends = "cpu-int8"
# ONNX Runtime picks its x86 kernels by CPUID: gated on AVX2's int8 kernels, natively on such a CPU, under qemu-user's
# Haswell model on a newer one (timing gates skipped there); docs/targets.md#platforms
platform = "x86-64-v3"
optimization = "extended"
# timed where it runs, not under emulation: list candidates when building on such a machine
candidates = []
'''),
    "mobile-int8": ("cpu-int8", '''description = "Android/iOS apps: an .ort artifact and its operator config"
extends = "cpu-int8"
format = "ort"
optimization = "basic"
# phones are ARM: full 8-bit weights, gated on ARM's int8 kernels (the aarch64 onnxruntime wheel under qemu-user);
# x86's u8s8 kernels without VNNI saturate on them
platform = "linux-aarch64"
quantization = { reduce_range = false }
# timed where it runs, not under emulation: list candidates when building on such a machine
candidates = []
'''),
    "openvino-cpu": (None, f'''description = "Intel CPUs through OpenVINO, compiled ahead of time"
runtime = ["{RUNTIME}", "onnxruntime-ep-openvino==1.8.1"]
providers = [{{ name = "OpenVINOExecutionProvider", options = {{ device_type = "CPU" }} }}, "CPUExecutionProvider"]
optimization = "all"
size = {{ max_ratio = 3.0 }}
'''),
    "cuda-fp16": (None, f'''description = "NVIDIA servers through CUDA, fp16"
runtime = "{RUNTIME.replace("onnxruntime", "onnxruntime-gpu")}"
providers = [
    {{ name = "CUDAExecutionProvider", options = {{ cudnn_conv_algo_search = "EXHAUSTIVE", use_tf32 = false }} }},
    "CPUExecutionProvider",
]
precision = "fp16"
optimization = "basic"
runner = ["self-hosted", "linux", "x64", "gpu"]
'''),
}

# The presets whose precision suits some models only: the ops whose weights it serves well, and what the others need.
SUITS: dict[str, tuple[frozenset[str], str]] = {
    "cpu-int8": (signature.DYNAMIC_OPS, "most of {whose} weights are in Conv (or other) nodes, which int8-dynamic "
                 "serves poorly; they want int8-static with `calibration` = real samples (docs/targets.md)"),
    "cpu-int4": (signature.INT4_OPS, "most of {whose} weights are not MatMul weights, the only ones int4-weight "
                 "converts"),
}


def with_parents(names: Sequence[str]) -> list[str]:
    """The presets named, with the presets they extend, parents first, each once."""
    out: list[str] = []

    def add(name: str) -> None:
        if name not in PRESETS:
            raise UsageError(f"--target {name}: not a target init knows",
                             f"choose among {', '.join(PRESETS)} (edit targets.toml for others)")
        parent = PRESETS[name][0]
        if parent:
            add(parent)
        if name not in out:
            out.append(name)

    for n in names:
        add(n)
    return out
