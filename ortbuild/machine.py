"""This machine's CPU: its model, the ISA flags that change what ONNX Runtime's CPU kernels do, and the vector
width (SIMD level) that `layout`/`all` artifacts are tied to. Stdlib only."""

from __future__ import annotations

import functools
import platform
from typing import Any

# ISA flags that change what ORT's CPU kernels (MLAS) do; the rest of /proc/cpuinfo is noise.
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "i8mm", "sve", "sve2", "bf16", "fphp", "asimdhp",
)



@functools.cache
def cpu_flags() -> frozenset[str]:
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
                    break
    except OSError:
        pass
    return frozenset(flags)


def simd_level(flags: frozenset[str] | None = None) -> str:
    """The vector width ORT's NCHWc layout is built for: it is baked into `layout`/`all` artifacts."""
    f = cpu_flags() if flags is None else flags
    arch = platform.machine().lower()
    if arch in ("x86_64", "amd64"):
        if "avx512f" in f:
            return "x86_64-avx512"
        if "avx2" in f:
            return "x86_64-avx2"
        return "x86_64-sse"
    return arch or "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "system": platform.system(),
        "simd_level": simd_level(),
        "isa_flags": sorted(cpu_flags() & set(_ISA_FLAGS)),
        "python": platform.python_version(),
    }
