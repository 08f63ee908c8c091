"""This machine's CPU: its model, the ISA flags that change what ONNX Runtime's CPU kernels do, and the vector
width (SIMD level) that `layout`/`all` artifacts are tied to; whether the hardware of a GPU/accelerator
runtime is present (`stand_in`). Stdlib and packaging only (the noxfile imports it before any venv exists)."""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import platform
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


@dataclass(frozen=True)
class X86Level:
    """An x86-64 microarchitecture level (the psABI's x86-64-v2/-v3/-v4; a VNNI variant, for int8): the CPU flags
    it requires, as /proc/cpuinfo spells them, and the CPU model qemu-user emulates it with (None: qemu's TCG
    cannot run its instructions: AVX-512)."""

    name: str
    flags: frozenset[str]
    says: str                         # what it adds, in words
    qemu_cpu: str | None


_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
# oldest first; a CPU is at the newest level whose flags it has all of
X86_LEVELS: tuple[X86Level, ...] = (
    X86Level("x86-64-v2", _V2, "SSE4.2, no AVX", "Nehalem-v2"),
    X86Level("x86-64-v3", _V3, "AVX2 and FMA, no AVX-512", "Haswell-noTSX"),
    X86Level("x86-64-v4", _V4, "AVX-512 without VNNI", None),
    X86Level("x86-64-v4-vnni", _V4 | {"avx512_vnni"}, "AVX-512 with VNNI", None),
)


def x86_level(flags: frozenset[str] | None = None, arch: str | None = None) -> X86Level | None:
    """This machine's x86-64 level (None: not an x86-64 machine, or older than x86-64-v2)."""
    f = cpu_flags() if flags is None else flags
    if (arch or platform.machine()).lower() not in ("x86_64", "amd64"):
        return None
    found = [lv for lv in X86_LEVELS if lv.flags <= f]
    return found[-1] if found else None


def x86_level_named(name: str) -> X86Level:
    return next(lv for lv in X86_LEVELS if lv.name == name)


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
        "x86_level": (lv.name if (lv := x86_level()) else None),
        "isa_flags": sorted(cpu_flags() & set(_ISA_FLAGS)),
        "python": platform.python_version(),
    }


# ------------------------------------------------------------------------------- accelerators (stand-ins)

@functools.cache  # the hardware does not change while ortbuild runs: read once per process
def nvidia_absent() -> str | None:
    """Why no NVIDIA GPU can run here (no driver, no device node), or None where one may."""
    if os.path.exists("/proc/driver/nvidia/version") or glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi"):
        return None
    return "no NVIDIA GPU here (no driver: /proc/driver/nvidia/version, /dev/nvidia* and nvidia-smi are absent)"


@functools.cache
def intel_absent() -> str | None:
    """Why the OpenVINO runtimes offer no device here (not an Intel CPU, and no Intel GPU or NPU), or None."""
    vendor = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    if vendor == "GenuineIntel" or glob.glob("/dev/accel/accel*"):
        return None
    for v in glob.glob("/sys/class/drm/card*/device/vendor"):
        with contextlib.suppress(OSError), open(v, encoding="ascii") as f:
            if f.read().strip() == "0x8086":
                return None
    if platform.system() != "Linux":
        return None  # nothing to read: assume it may run
    return (f"OpenVINO offers devices on Intel CPUs, GPUs and NPUs only; this machine's CPU is {cpu_model()}"
            f"{f' ({vendor})' if vendor else ''}, with no Intel GPU or NPU")


@dataclass(frozen=True)
class StandIn:
    """A target's requirements with its hardware runtime replaced by the CPU flavor of the same ONNX Runtime
    version, where that hardware is absent: its portable artifacts are built with that (nox does by default)."""

    requirements: tuple[str, ...]    # what is installed instead (the CPU flavor first)
    left_out: tuple[str, ...]        # the hardware requirements not installed
    reason: str                      # the hardware that is absent


# the hardware flavors and plugin EPs, and what tells that their hardware is absent
_NEEDS: dict[str, Callable[[], str | None]] = {
    "onnxruntime-gpu": nvidia_absent, "onnxruntime-openvino": intel_absent, "onnxruntime-ep-openvino": intel_absent,
    "onnxruntime-genai-cuda": nvidia_absent}
# a hardware package that has a CPU package of the same version to stand in for it (the flavor: onnxruntime)
_CPU_PACKAGE = {"onnxruntime-genai-cuda": "onnxruntime-genai"}


def stand_in(requirements: Sequence[str]) -> StandIn | None:
    """`requirements` (a target's: its flavor first) without the hardware runtimes whose hardware is absent here,
    the flavor replaced by `onnxruntime` at the same version; None where nothing would be left out."""
    if not requirements:
        return None
    reasons: list[str] = []
    left_out: list[str] = []
    kept: list[str] = []
    for i, text in enumerate(requirements):
        req = Requirement(text)
        check = _NEEDS.get(canonicalize_name(req.name))
        why = check() if check else None
        if why is None:
            kept.append(text)
            continue
        left_out.append(text)
        reasons += [why] if why not in reasons else []
        cpu = "onnxruntime" if i == 0 else _CPU_PACKAGE.get(canonicalize_name(req.name))
        if cpu is not None:  # the flavor (or genai's CUDA package): the CPU package at the same version
            kept.append(cpu + text.strip()[len(req.name):].lstrip())  # its version, as written
    if not left_out:
        return None
    return StandIn(tuple(kept), tuple(left_out), "; ".join(reasons))


def available_memory(default: int = 4 << 30) -> int:
    """Bytes of memory available to start new work without swapping (MemAvailable of /proc/meminfo; `default`
    where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return default


def resident() -> int:
    """This process's resident set now, in bytes (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextlib.contextmanager
def memory_cap(extra: int) -> Iterator[None]:
    """Within: this process's address space limited (RLIMIT_AS, soft) to what it maps now plus `extra` bytes, where
    that is below the limit it has, so an allocation past it fails (ONNX Runtime: "Failed to allocate memory",
    Python: MemoryError) instead of the machine swapping or its OOM killer ending the process. Restored after."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, IndexError):
        yield
        return
    cap = mapped + extra
    if (soft != resource.RLIM_INFINITY and soft <= cap) or (hard != resource.RLIM_INFINITY and hard < cap):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
