"""What this environment can run: the installed ONNX Runtime flavor, its usable providers, the CPU."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata as md
import io
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from . import options
from .config import Provider, Settings, Target
from .errors import RuntimeMismatch, first_line

# ISA flags that change what ORT's CPU kernels (MLAS) do; the rest of /proc/cpuinfo is noise.
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "i8mm", "sve", "sve2", "bf16", "fphp", "asimdhp",
)


@dataclass(frozen=True)
class Flavor:
    distribution: str
    version: str

    def as_json(self) -> dict[str, str]:
        return {"distribution": self.distribution, "version": self.version}


def installed_flavor() -> Flavor | None:
    """The pip distribution that provides `onnxruntime` here, or None."""
    found = []
    for name in options.RUNTIMES:
        try:
            found.append(Flavor(name, md.version(name)))
        except md.PackageNotFoundError:
            continue
    if len(found) > 1:
        names = ", ".join(f.distribution for f in found)
        raise RuntimeMismatch(
            f"several ONNX Runtime flavors are installed together ({names}); they overwrite each other's "
            "`onnxruntime` module", "use one virtualenv per flavor: `nox -s build` does that for you")
    return found[0] if found else None


def runtime_problem(target: Target) -> str | None:
    """Why this environment cannot build `target` (wrong flavor or version), or None if it can."""
    how = f"run `nox -s 'build({target.name})'`, which installs {target.runtime} in the target's own virtualenv"
    return requirement_problem(target.name, target.runtime, how)


def requirement_problem(name: str, requirement: str, how: str) -> str | None:
    """Why this environment's ONNX Runtime does not satisfy `requirement` (a target's runtime), or None."""
    req = Requirement(requirement)
    have = installed_flavor()
    if have is None:
        return f"no ONNX Runtime is installed here; {name} needs {requirement}; {how}"
    if have.distribution != req.name.lower() or not req.specifier.contains(Version(have.version), prereleases=True):
        return f"{name} needs {requirement}, this environment has {have.distribution} {have.version}; {how}"
    return None


@functools.cache
def _probe_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return bytes(model.SerializeToString())


def ort_provider_args(providers: tuple[Provider, ...]) -> tuple[list[str], list[dict[str, str]]]:
    """Providers in the form InferenceSession takes: names, and options with string values."""
    names = [p.name for p in providers]
    opts = [{k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in p.options.items()}
            for p in providers]
    return names, opts


def probe_provider(provider: Provider) -> str | None:
    """None if `provider` really works here (a session on it runs), else the reason it does not.

    get_available_providers() is not enough: onnxruntime-gpu lists CUDA and TensorRT on a machine
    without a GPU, and session creation then falls back to the CPU with only a warning.
    """
    if provider.name == "CPUExecutionProvider" and installed_flavor() is not None:
        return None  # every flavor has it; importing ORT to ask costs a no-op build most of its time
    import onnxruntime as ort

    if provider.name not in ort.get_available_providers():
        flavor = installed_flavor()
        shown = f"{flavor.distribution} {flavor.version}" if flavor else "this onnxruntime"
        return f"{provider.name} is not in {shown}"
    if provider.name == "CPUExecutionProvider":
        return None
    names, opts = ort_provider_args((provider,))
    so = ort.SessionOptions()
    with _captured_stderr() as log:  # ORT reports why a provider failed only on the C++ stderr
        try:
            sess = ort.InferenceSession(_probe_model(), so, providers=names, provider_options=opts)
            ok = provider.name in sess.get_providers()
            error = ""
        except Exception as e:  # ORT raises its own exception types; any failure means "not usable"
            ok, error = False, first_line(e, 300)
    if ok:
        return None
    detail = error or _first_error(log.getvalue())
    return (f"{provider.name} is installed but cannot run here"
            + (f" ({detail})" if detail else " (no device, or its libraries are missing)"))


PROBE_CACHE = ".ortbuild-probes.json"   # in the environment's prefix (each nox venv has its own)
PROBE_CACHE_SECONDS = 24 * 3600


@functools.cache  # one per process: the environment does not change under a running build
def _environment_fingerprint() -> str:
    """What a provider probe's answer depends on besides the provider: the runtime's files, the GPU/driver
    side of the machine, the library search path, this boot. Any change means probing again."""
    import hashlib
    import json
    import socket
    from pathlib import Path

    flavor = installed_flavor()
    parts: dict[str, Any] = {"flavor": flavor.as_json() if flavor else None, "host": socket.gethostname()}
    for f in ("/proc/sys/kernel/random/boot_id", "/proc/driver/nvidia/version"):
        with contextlib.suppress(OSError):
            parts[f] = Path(f).read_text()
    parts["env"] = {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "PATH", "CUDA_PATH")}
    stats = []
    for pattern in ("/dev/nvidia*", "/dev/dri/*", "/etc/ld.so.cache"):
        for p in sorted(Path("/").glob(pattern.lstrip("/"))):
            with contextlib.suppress(OSError):
                st = p.stat()
                stats.append((str(p), st.st_mtime_ns, st.st_size))
    parts["devices"] = stats
    parts["dists"] = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions()
                            if str(d.metadata["Name"] or "").lower().startswith(("nvidia-", "tensorrt", "openvino")))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cached_probe(provider: Provider, *, refresh: bool = False) -> str | None:
    """probe_provider(), remembered per environment while its fingerprint holds (at most a day). A no-op
    build then needs no ONNX Runtime session at all; `ortbuild build --force` probes again."""
    import json
    import time
    from pathlib import Path

    if provider.name == "CPUExecutionProvider":
        return probe_provider(provider)
    path = Path(sys.prefix) / PROBE_CACHE
    key = f"{provider.name} {json.dumps(dict(provider.options), sort_keys=True)}"
    fingerprint = _environment_fingerprint()
    try:
        cache = json.loads(path.read_text())
        fresh = (isinstance(cache, dict) and cache.get("fingerprint") == fingerprint
                 and isinstance(cache.get("answers"), dict)
                 and time.time() - float(cache.get("time", 0)) < PROBE_CACHE_SECONDS)
    except (OSError, ValueError, TypeError):
        fresh = False
    if not fresh:
        cache = {"fingerprint": fingerprint, "time": time.time(), "answers": {}}
    answers = cache["answers"]
    if refresh or key not in answers:
        answers[key] = probe_provider(provider)
        with contextlib.suppress(OSError):  # a read-only environment just probes every time
            from .manifest import atomic_write

            atomic_write(path, json.dumps(cache, indent=1).encode())
    answer: str | None = answers[key]
    return answer


def _first_error(log: str) -> str:
    for line in log.splitlines():
        for marker in ("with error: ", "Failed to create "):
            if marker in line:
                return line[line.index(marker):].removeprefix("with error: ").strip()[:200]
    return ""


@contextlib.contextmanager
def _captured_stderr() -> Iterator[io.StringIO]:
    """Capture file descriptor 2 (native code writes there directly) into a StringIO."""
    buf = io.StringIO()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield buf
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            buf.write(tmp.read().decode("utf-8", "replace"))


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



def session_options(settings: Settings, level: str) -> Any:
    """An ort.SessionOptions from a target's settings (threads, modes, config entries, free dims)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    enum_name = options.LEVEL_RULES[level].ort_enum
    if not hasattr(ort.GraphOptimizationLevel, enum_name):  # ORT_ENABLE_LAYOUT arrived in 1.23
        raise RuntimeMismatch(f"optimization '{level}' needs onnxruntime >= 1.23 ({enum_name})",
                              "use optimization = \"all\" or \"extended\" with this runtime")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, enum_name)
    s = settings.session
    so.intra_op_num_threads = s.intra_op_num_threads
    so.inter_op_num_threads = s.inter_op_num_threads
    so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if s.execution_mode == "parallel"
                         else ort.ExecutionMode.ORT_SEQUENTIAL)
    so.enable_mem_pattern = s.enable_mem_pattern
    so.enable_cpu_mem_arena = s.enable_cpu_mem_arena
    so.use_deterministic_compute = s.use_deterministic_compute
    for key, value in s.config.items():
        so.add_session_config_entry(key, value)
    for dim, size in settings.free_dimensions.items():
        so.add_free_dimension_override_by_name(dim, size)
    return so
