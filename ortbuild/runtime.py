"""What this environment can run: ONNX Runtime itself (imported lazily: `import_ort`), sessions on a target's
providers and plugin EPs, provider probes (cached per environment), custom-op libraries, and whether an
artifact fits here (ortbuild.artifact.fit). The installed flavor and requirements: ortbuild.installed; the CPU:
ortbuild.machine (a few of their names still pass through here for modules not yet importing them directly)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata as md
import io
import json
import os
import socket
import sys
import tempfile
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild.errors import RuntimeMismatch, first_line
from ortbuild.files import atomic_write, sha256_file
from ortbuild.installed import (
    installed_flavor,
    package_problem,
)
from ortbuild.machine import cpu_model
from ortbuild.project import options
from ortbuild.project.config import CustomOps, Provider, Settings

if TYPE_CHECKING:
    import onnxruntime


def import_ort() -> types.ModuleType:
    """The onnxruntime module, with ONNX Runtime's telemetry events disabled in this process before any session.

    1.31 keeps a local event store (onnxruntime.db under the user's cache directory) whose SessionCreation events
    name the graph and producer of every model a session opens: ortbuild opens decrypted models, so every
    session it (or a quantizer it calls) creates runs after this call. docs/container.md, telemetry."""
    onnxruntime = importlib.import_module("onnxruntime")

    global _TELEMETRY_OFF
    if not _TELEMETRY_OFF:
        off = getattr(onnxruntime, "disable_telemetry_events", None)
        if off is not None:
            off()
        _TELEMETRY_OFF = True
    return onnxruntime


# session config keys that make ORT write an optimized model's weights as external data
EXTERNAL_FILE = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN = "session.optimized_model_external_initializers_min_size_in_bytes"

_TELEMETRY_OFF = False
_REGISTERED: set[str] = set()  # providers whose plugin library this process registered with ONNX Runtime


def register_plugin(plugin: options.PluginEP) -> None:
    """Register a plugin EP's library with ONNX Runtime (once per process)."""
    ort = import_ort()

    if plugin.provider in _REGISTERED:
        return
    try:
        library = str(importlib.import_module(plugin.module).get_library_path())
    except (ImportError, OSError, AttributeError) as e:
        raise RuntimeMismatch(f"{plugin.provider} comes from the plugin {plugin.package}, which cannot be loaded "
                              f"here: {first_line(e, 200)}", f"install {plugin.package} (nox does it)") from None
    try:
        ort.register_execution_provider_library(plugin.provider, library)
    except Exception as e:  # ORT's own exception types
        if "already registered" not in str(e):
            raise RuntimeMismatch(f"{plugin.package}: ONNX Runtime cannot load {library}: {first_line(e, 200)}",
                                  "reinstall the plugin at the version the target pins") from None
    _REGISTERED.add(plugin.provider)


def plugin_devices(plugin: options.PluginEP, device_type: str) -> tuple[list[onnxruntime.OrtEpDevice], str | None]:
    """The plugin's EP devices of `device_type` here, or ([], why there are none)."""
    ort = import_ort()

    register_plugin(plugin)
    every = ort.get_ep_devices()
    offered = [d for d in every if d.ep_name == plugin.provider]
    chosen = [d for d in offered if d.device.type.name == device_type]
    if chosen:
        return chosen, None
    cpu = next((d.device for d in every if d.device.type.name == "CPU"), None)
    here = f"this machine's CPU is {cpu_model()}" + (f" (vendor {cpu.vendor}, id {cpu.vendor_id:#06x})" if cpu else "")
    kinds = sorted({d.device.type.name for d in offered})
    return [], (f"{plugin.provider} ({plugin.package}) offers no {device_type} device here"
                + (f" (only {', '.join(kinds)})" if kinds else "") + f": it supports {plugin.devices}; {here}")


def plugin_options(provider: Provider) -> dict[str, str]:
    """A plugin EP's options as add_provider_for_devices takes them (device_type only selects the device)."""
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in provider.options.items()
            if k != "device_type"}


def open_session(model: str | bytes, so: onnxruntime.SessionOptions, providers: Sequence[Provider],
                 plugins: Mapping[str, options.PluginEP] | None = None) -> onnxruntime.InferenceSession:
    """An InferenceSession on `providers`; those in `plugins` (provider -> its plugin EP) are added through
    their EP devices (the only way ONNX Runtime takes a plugin EP), the CPU provider being their fallback."""
    ort = import_ort()

    plugins = plugins or {}
    via_plugin = [p for p in providers if p.name in plugins]
    if not via_plugin:
        names, opts = ort_provider_args(tuple(providers))
        return ort.InferenceSession(model, so, providers=names, provider_options=opts)
    for p in via_plugin:
        add_plugin_provider(so, p, plugins[p.name])
    return ort.InferenceSession(model, so)


def add_plugin_provider(so: onnxruntime.SessionOptions, provider: Provider, plugin: options.PluginEP) -> None:
    """Add a plugin EP to session options through its devices of the provider's `device_type`."""
    devices, why = plugin_devices(plugin, str(provider.options.get("device_type", "CPU")))
    if why:
        raise RuntimeMismatch(why)
    so.add_provider_for_devices(devices, plugin_options(provider))


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


def probe_provider(provider: Provider, plugin: options.PluginEP | None = None) -> str | None:
    """None if `provider` really works here (a session on it runs), else the reason it does not.

    get_available_providers() is not enough: onnxruntime-gpu lists CUDA and TensorRT on a machine
    without a GPU, and session creation then falls back to the CPU with only a warning. A plugin EP
    (`plugin`) works where it offers a device of the provider's `device_type`.
    """
    if provider.name == "CPUExecutionProvider" and installed_flavor() is not None:
        return None  # every flavor has it; importing ORT to ask costs a no-op build most of its time
    ort = import_ort()

    if plugin is not None:
        try:
            _, why = plugin_devices(plugin, str(provider.options.get("device_type", "CPU")))
        except RuntimeMismatch as e:
            return e.message
        if why:
            return why
    elif provider.name not in ort.get_available_providers():
        flavor = installed_flavor()
        shown = f"{flavor.distribution} {flavor.version}" if flavor else "this onnxruntime"
        return f"{provider.name} is not in {shown}"
    if provider.name == "CPUExecutionProvider":
        return None
    so = ort.SessionOptions()
    with _captured_stderr() as log:  # ORT reports why a provider failed only on the C++ stderr
        try:
            sess = open_session(_probe_model(), so, [provider], {provider.name: plugin} if plugin else None)
            ok = provider.name in sess.get_providers()
            error = ""
        except Exception as e:  # ORT raises its own exception types; any failure means "not usable"
            ok, error = False, first_line(e, 300)
    if ok:
        return None
    detail = error or _first_error(log.getvalue())
    return (f"{provider.name} is installed but cannot run here"
            + (f" ({detail})" if detail else " (no device, or its libraries are missing)"))


_DEVICE_DISTS = ("nvidia-", "tensorrt", "openvino", "onnxruntime-ep-")  # their versions change probe answers
def provider_here(name: str) -> str | None:
    """None when provider `name` runs in this environment (built into its flavor, or through a plugin EP
    installed here), else why not (`ortbuild targets`)."""
    flavor = installed_flavor()
    if flavor is None:
        return "no ONNX Runtime is installed here"
    for plugin in options.PLUGINS.values():
        if plugin.provider == name and flavor.distribution in plugin.flavors:
            try:
                md.version(plugin.package)
            except md.PackageNotFoundError:
                continue
            return probe_provider(Provider(name), plugin)
    return probe_provider(Provider(name))


PROBE_CACHE = ".ortbuild-probes.json"   # in the environment's prefix (each nox venv has its own)
PROBE_CACHE_SECONDS = 24 * 3600


@functools.cache  # one per process: the environment does not change under a running build
def _environment_fingerprint() -> str:
    """What a provider probe's answer depends on besides the provider: the runtime's files, the GPU/driver
    side of the machine, the library search path, this boot. Any change means probing again."""
    flavor = installed_flavor()
    parts: dict[str, object] = {"flavor": flavor.as_json() if flavor else None, "host": socket.gethostname()}
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
                            if str(d.metadata["Name"] or "").lower().startswith(_DEVICE_DISTS))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def cached_probe(provider: Provider, plugin: options.PluginEP | None = None, *, refresh: bool = False) -> str | None:
    """probe_provider(), remembered per environment while its fingerprint holds (at most a day). A no-op
    build then needs no ONNX Runtime session at all; `ortbuild build --force` probes again."""
    if provider.name == "CPUExecutionProvider":
        return probe_provider(provider)
    path = Path(sys.prefix) / PROBE_CACHE
    key = f"{provider.name} {json.dumps(dict(provider.options), sort_keys=True)} {plugin.package if plugin else ''}"
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
        answers[key] = probe_provider(provider, plugin)
        with contextlib.suppress(OSError):  # a read-only environment just probes every time
            atomic_write(path, json.dumps(cache, indent=1).encode(), root=Path(sys.prefix))
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


@dataclass(frozen=True)
class CustomOpLibrary:
    """A custom-op library as found in this environment: what the manifest records and the loaders check."""

    name: str                        # the package, or the library's file name
    version: str                     # the package's version ("" for a path)
    sha256: str
    path: str                        # where it is here
    module: str = ""                 # the package's import name (package form)

    def as_json(self) -> dict[str, str]:
        out = {"name": self.name, "version": self.version, "sha256": self.sha256, "library": Path(self.path).name}
        return {**out, "module": self.module} if self.module else {**out, "file": f"custom_ops/{out['library']}"}


@functools.cache
def _library_sha256(path: str, size: int, mtime: int) -> str:
    """files.sha256_file(), once per library file and version of it (size, mtime) in a process."""
    return sha256_file(Path(path))


def custom_op_libraries(ops: Sequence[CustomOps]) -> list[CustomOpLibrary]:
    """Find each custom-op library here: a package's `get_library_path()` (at its pinned version), or a file."""
    out = []
    for c in ops:
        if c.package:
            why = package_problem("this build", c.spec, f"install it: pip install {c.spec}")
            if why:
                raise RuntimeMismatch(why)
            try:
                path = str(importlib.import_module(c.module).get_library_path())
            except (ImportError, AttributeError) as e:
                raise RuntimeMismatch(f"custom_ops {c.spec}: its module '{c.module}' gives no library "
                                      f"(get_library_path()): {first_line(e)}") from None
        else:
            assert c.path is not None
            path = str(c.path)
        try:
            st = os.stat(path)
        except OSError as e:
            raise RuntimeMismatch(f"custom_ops {c.spec}: cannot read the library {path}: {e.strerror}") from None
        version = md.version(c.package) if c.package else ""
        out.append(CustomOpLibrary(c.name, version, _library_sha256(path, st.st_size, st.st_mtime_ns), path, c.module))
    return out


def register_custom_ops(so: onnxruntime.SessionOptions, ops: Sequence[CustomOps]) -> None:
    """Register the custom-op libraries with a SessionOptions (each session needs them)."""
    for lib in custom_op_libraries(ops):
        so.register_custom_ops_library(lib.path)


def session_options(settings: Settings, level: str) -> onnxruntime.SessionOptions:
    """An ort.SessionOptions from a target's settings (threads, modes, config entries, free dims, custom ops)."""
    ort = import_ort()

    so = ort.SessionOptions()
    so.log_severity_level = 3
    register_custom_ops(so, settings.custom_ops)
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
