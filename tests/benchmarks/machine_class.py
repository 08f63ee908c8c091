"""The machine class every benchmark figure is printed with: CPU model, x86-64 level, the ISA flags that change
what ONNX Runtime's kernels and the loaders' crypto run (AVX2, AVX-512, VNNI, SHA-NI, VAES), the CPUs this process
may use, and whether the VM reports free pages to its host (then memory touched for the first time costs a host
fault: see docs/loaders.md, Memory and speed)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from ortbuild import machine

SHOWN_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "sha_ni", "vaes", "aes")
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters/page_reporting_order")


def describe() -> str:
    flags = machine.cpu_flags()
    level = machine.x86_level()
    shown = " ".join(f for f in SHOWN_FLAGS if f in flags) or "none of " + "/".join(SHOWN_FLAGS)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    vm = " (VM reports free pages to its host: first-touch memory costs host faults)" if PAGE_REPORTING.exists() else ""
    import onnxruntime

    return (f"{machine.cpu_model()}, {level.name if level else platform.machine()} ({shown}), {cpus} CPUs{vm}, "
            f"onnxruntime {onnxruntime.__version__}")
