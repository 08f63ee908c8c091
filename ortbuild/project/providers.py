"""Execution providers: the runtimes (pip flavors and plugin EPs) that offer them, their options, the options
ortbuild refuses or sets itself; a provider as a target lists it (`Provider`) and a custom-op library (`CustomOps`).
Stdlib-only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortbuild.project.session_keys import INT_MAX

# pip distributions that provide the `onnxruntime` module, and the providers each can offer. CoreML: the macOS
# wheels of `onnxruntime` (1.31.1 macosx_14_0_arm64 holds the CoreML EP's code; the Linux wheels only its name).
# XNNPACK and NNAPI: no wheel on PyPI (below, MOBILE_PROVIDERS).
RUNTIMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("CPUExecutionProvider", "AzureExecutionProvider", "CoreMLExecutionProvider"),
    "onnxruntime-gpu": ("CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-openvino": ("OpenVINOExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-directml": ("DmlExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-qnn": ("QNNExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-rocm": ("ROCMExecutionProvider", "MIGraphXExecutionProvider", "CPUExecutionProvider"),
}


# The execution providers of ONNX Runtime's mobile packages, and where each ships: what a `format = "ort"` package
# (model.ort + required_operators.config, docs/targets.md "Mobile packages") is meant for. Checked 2026-11-26 in
# onnxruntime 1.31.1's wheels for Linux x86_64 and aarch64 (manylinux_2_28) and macOS arm64: none holds the
# XNNPACK EP (no XNNPACK string beyond the provider's name and the "XNNPACK ... execution provider is not supported
# in this build" alias; `get_available_providers()` on x86_64: Azure, CPU), none the NNAPI EP; the macOS one holds
# CoreML's. ORT's docs: XNNPACK ships in onnxruntime-android (Maven) and onnxruntime-objc / onnxruntime-c
# (CocoaPods), NNAPI in onnxruntime-android, CoreML in the iOS pods.
MOBILE_PROVIDERS: dict[str, str] = {
    "XnnpackExecutionProvider": "onnxruntime-android (Maven) and onnxruntime-objc / onnxruntime-c (CocoaPods), or a "
                                "build of ONNX Runtime with --use_xnnpack",
    "NnapiExecutionProvider": "onnxruntime-android (Maven), or an Android build of ONNX Runtime with --use_nnapi",
    "CoreMLExecutionProvider": "onnxruntime-objc / onnxruntime-c (CocoaPods) and the macOS onnxruntime wheels, or a "
                               "build of ONNX Runtime with --use_coreml",
}


@dataclass(frozen=True)
class PluginEP:
    """An execution provider shipped as a plugin library for stock `onnxruntime` (ORT's EP ABI): a pip package
    whose Python module's get_library_path() gives the library to `register_execution_provider_library`."""

    package: str                     # the pip distribution, e.g. onnxruntime-ep-openvino
    module: str                      # its import name
    provider: str                    # the provider name it registers
    flavors: tuple[str, ...]         # the ONNX Runtime flavors it plugs into
    devices: str                     # which hardware it offers devices for (its factory filters them)


PLUGINS: dict[str, PluginEP] = {p.package: p for p in (
    PluginEP("onnxruntime-ep-openvino", "onnxruntime_ep_openvino", "OpenVINOExecutionProvider", ("onnxruntime",),
             "Intel CPUs, GPUs and NPUs only (PCI vendor 0x8086)"),
)}
# Custom-operator packages whose import name is not the distribution name with "-" -> "_" (their module's
# get_library_path() gives the shared library to `register_custom_ops_library`)
CUSTOM_OP_MODULES: dict[str, str] = {"onnxruntime-extensions": "onnxruntime_extensions"}
LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")


@dataclass(frozen=True)
class Provider:
    """An execution provider as a target lists it: its name and provider options."""

    name: str
    options: Mapping[str, str | int | float | bool] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "options": dict(self.options)}


@dataclass(frozen=True)
class CustomOps:
    """A custom-operator library: a pinned pip package whose module gives it (`get_library_path()`), or a file."""

    spec: str                        # as written in targets.toml
    package: str = ""                # pip distribution (package form), e.g. onnxruntime-extensions
    version: str = ""                # its pinned version
    module: str = ""                 # its import name
    path: Path | None = None         # the library file (path form), resolved against targets.toml

    @property
    def name(self) -> str:
        return self.package or (self.path.name if self.path else self.spec)

    def as_json(self) -> dict[str, str]:
        return {"package": self.package, "version": self.version} if self.package else {"path": self.spec}


PLUGIN_DEVICE_TYPES = ("CPU", "GPU", "NPU")  # `device_type` of a plugin EP: which of its devices to use

# Options of the OpenVINO plugin EP (onnxruntime-ep-openvino 1.8.1, from its option parser). It selects the
# device from the EP device it is given (ortbuild picks it by `device_type`), and it ignores other options of
# the onnxruntime-openvino flavor with only a warning: ortbuild refuses those, saying where they go instead.
PLUGIN_OPTIONS: dict[str, frozenset[str]] = {
    "OpenVINOExecutionProvider": frozenset({"device_type", "load_config", "reshape_input", "enable_qdq_optimizer",
                                            "enable_opencl_throttling", "enable_causallm"}),
}
PLUGIN_IGNORED: dict[str, dict[str, str]] = {
    "OpenVINOExecutionProvider": {
        "precision": 'load_config = \'{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}\' (f32, bf16 or f16)',
        "num_of_threads": 'load_config = \'{"CPU": {"INFERENCE_NUM_THREADS": "2"}}\'',
        "num_streams": 'load_config = \'{"CPU": {"NUM_STREAMS": "1"}}\'',
        "model_priority": 'load_config = \'{"CPU": {"MODEL_PRIORITY": "LOW"}}\'',
        "cache_dir": "nothing: ortbuild ships the compiled blob inside the encrypted artifact (a cache_dir "
                     "would write it in plaintext)",
        "device_id": 'device_type = "CPU", "GPU" or "NPU" (the plugin picks the device from that)',
        "device_luid": 'device_type = "CPU", "GPU" or "NPU" (the plugin picks the device from that)',
        "disable_dynamic_shapes": "free_dimensions (fix the dimensions at build time)",
    },
}
PRECISION_HINTS = ("f32", "bf16", "f16")  # OpenVINO's INFERENCE_PRECISION_HINT values

# Provider options ortbuild refuses on any runtime: they write engines, blobs or subgraphs (which hold the
# weights) as plaintext files, decrypt them with a library of their own, or read, write or load other files;
# ortbuild compiles at build time and ships the result inside the encrypted artifact instead. (OpenVINO's
# load_config is checked for the same: FILE_WORDS below.)
PLAINTEXT_OPTIONS: dict[str, dict[str, str]] = {
    "TensorrtExecutionProvider": {
        o: "TensorRT engines hold the weights: ortbuild builds the engine at build time (EPContext) and ships it "
           "inside the encrypted artifact, never as a plaintext file"
        for o in ("trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
                  "trt_dump_ep_context_model", "trt_ep_context_file_path", "trt_ep_context_embed_mode",
                  "trt_engine_decryption_enable", "trt_engine_decryption_lib_path",
                  "trt_weight_stripped_engine_enable", "trt_onnx_model_folder_path")} | {
        "trt_timing_cache_enable": "TensorRT writes its timing cache as a file (in the working directory unless "
                                   "trt_timing_cache_path says where): provider options never write files",
        "trt_timing_cache_path": "names a file TensorRT reads and writes: provider options never name files",
        "trt_int8_calibration_table_name": "names a file TensorRT reads: ortbuild calibrates int8 from the target's "
                                           "calibration data (precision int8-static) instead",
        "trt_extra_plugin_lib_paths": "loads shared libraries (runs their code) from the paths it names: use "
                                      "custom_ops, whose libraries come from a pinned package",
    },
    "OpenVINOExecutionProvider": {
        "cache_dir": "OpenVINO's model cache holds the compiled blob (and the weights) in plaintext: targets with "
                     "the OpenVINO plugin ship the compiled blob inside the encrypted artifact instead",
    },
}

# Defaults ortbuild sets when a target does not state them (recorded in the manifest with the other options):
# cuDNN's DEFAULT conv algorithm search leaves Tensor Cores unused (7-8x slower than TensorRT on a Jetson Orin
# Nano in a user report); TF32 (on by default in the CUDA EP) computes fp32 MatMul/Conv with a 10-bit
# mantissa, outside fp32 tolerances: ortbuild turns it off unless the target says use_tf32 = true.
PROVIDER_DEFAULTS: dict[str, dict[str, Any]] = {
    "CUDAExecutionProvider": {"cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": False},
}

# Providers whose compiled form ortbuild builds at build time and ships as an EPContext model (the compiled
# blob or engine embedded, encrypted like every artifact); loaded with session.disable_model_compile = 1.
EPCONTEXT_PROVIDERS = frozenset({"OpenVINOExecutionProvider", "TensorrtExecutionProvider"})

PROVIDERS = (
    "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
    "NvTensorRTRTXExecutionProvider", "OpenVINOExecutionProvider", "DmlExecutionProvider",
    "CoreMLExecutionProvider", "QNNExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider",
    "XnnpackExecutionProvider", "NnapiExecutionProvider", "WebGpuExecutionProvider", "DnnlExecutionProvider",
    "AzureExecutionProvider", "VitisAIExecutionProvider", "CANNExecutionProvider", "ACLExecutionProvider",
    "ArmNNExecutionProvider", "JsExecutionProvider", "SNPEExecutionProvider", "RknpuExecutionProvider",
)
# Providers that compile subgraphs at session creation: their optimized graph cannot be serialized.
COMPILING_PROVIDERS = frozenset({
    "OpenVINOExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider",
    "QNNExecutionProvider", "MIGraphXExecutionProvider", "CoreMLExecutionProvider", "VitisAIExecutionProvider",
})


@dataclass(frozen=True)
class ProviderOption:
    """One documented provider option: its kind ("flag", "int", "choice", "text", "json") and limits."""

    kind: str
    choices: tuple[str, ...] = ()
    maximum: int = INT_MAX


_F, _I, _T = ProviderOption("flag"), ProviderOption("int"), ProviderOption("text")
# Provider options of the pinned runtimes (onnxruntime-gpu 1.31.1: CUDA and TensorRT; onnxruntime-openvino 1.24.1),
# from ORT's EP documentation and the option names in those wheels' provider libraries. Pointer-valued options
# (user streams, external allocators, byte streams) cannot come from a file and are left out. ORT accepts any
# other name silently, so ortbuild refuses it. Providers not listed here are passed through unchecked.
PROVIDER_OPTIONS: dict[str, dict[str, ProviderOption]] = {
    "CPUExecutionProvider": {},
    "CUDAExecutionProvider": {
        "device_id": ProviderOption("int", maximum=255), "gpu_mem_limit": ProviderOption("int", maximum=2**62),
        "arena_extend_strategy": ProviderOption("choice", ("kNextPowerOfTwo", "kSameAsRequested")),
        "cudnn_conv_algo_search": ProviderOption("choice", ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
        "do_copy_in_default_stream": _F, "cudnn_conv_use_max_workspace": _F, "cudnn_conv1d_pad_to_nc1d": _F,
        "enable_cuda_graph": _F, "enable_skip_layer_norm_strict_mode": _F, "prefer_nhwc": _F,
        "use_ep_level_unified_stream": _F, "use_tf32": _F, "fuse_conv_bias": _F, "sdpa_kernel": _I,
        "tunable_op_enable": _F, "tunable_op_tuning_enable": _F, "tunable_op_max_tuning_duration_ms": _I,
    },
    "TensorrtExecutionProvider": {
        "device_id": ProviderOption("int", maximum=255), "trt_max_workspace_size": ProviderOption("int", maximum=2**62),
        "trt_max_partition_iterations": _I, "trt_min_subgraph_size": _I, "trt_fp16_enable": _F, "trt_bf16_enable": _F,
        "trt_int8_enable": _F, "trt_int8_calibration_table_name": _T, "trt_int8_use_native_calibration_table": _F,
        "trt_dla_enable": _F, "trt_dla_core": ProviderOption("int", maximum=16), "trt_dump_subgraphs": _F,
        "trt_engine_cache_enable": _F, "trt_engine_cache_path": _T, "trt_engine_cache_prefix": _T,
        "trt_engine_decryption_enable": _F, "trt_engine_decryption_lib_path": _T,
        "trt_force_sequential_engine_build": _F, "trt_context_memory_sharing_enable": _F,
        "trt_layer_norm_fp32_fallback": _F, "trt_timing_cache_enable": _F, "trt_timing_cache_path": _T,
        "trt_force_timing_cache": _F, "trt_detailed_build_log": _F, "trt_build_heuristics_enable": _F,
        "trt_sparsity_enable": _F, "trt_builder_optimization_level": ProviderOption("int", maximum=5),
        "trt_auxiliary_streams": _I, "trt_tactic_sources": _T, "trt_extra_plugin_lib_paths": _T,
        "trt_profile_min_shapes": _T, "trt_profile_max_shapes": _T, "trt_profile_opt_shapes": _T,
        "trt_cuda_graph_enable": _F, "trt_dump_ep_context_model": _F, "trt_ep_context_file_path": _T,
        "trt_ep_context_embed_mode": ProviderOption("int", maximum=1), "trt_weight_stripped_engine_enable": _F,
        "trt_onnx_model_folder_path": _T, "trt_op_types_to_exclude": _T, "trt_load_user_initializer": _F,
        "trt_engine_hw_compatible": _F, "trt_preview_features": _T,
    },
    "OpenVINOExecutionProvider": {
        "device_type": _T, "precision": ProviderOption("choice", ("FP32", "FP16", "ACCURACY")),
        "num_of_threads": ProviderOption("int", maximum=1024), "num_streams": ProviderOption("int", maximum=1024),
        "cache_dir": _T, "load_config": ProviderOption("json"), "enable_opencl_throttling": _F,
        "enable_qdq_optimizer": _F, "disable_dynamic_shapes": _F,
        "model_priority": ProviderOption("choice", ("LOW", "MEDIUM", "HIGH", "DEFAULT")), "reshape_input": _T,
        "layout": _T, "device_luid": _T, "enable_causallm": _F,
    },
}


# Words in the names of OpenVINO properties (in load_config) and of options of providers ortbuild does not list
# that name a file, a folder or a library, or dump one: OpenVINO's CACHE_DIR writes the compiled blob with the
# weights in plaintext, WEIGHTS_PATH reads weights from a file.
FILE_WORDS = frozenset({"path", "paths", "dir", "directory", "file", "files", "filename", "folder", "dump", "lib",
                        "libs", "library", "cache", "blob", "save", "table", "package", "packages", "plugin",
                        "plugins"})
MAX_OPTION_VALUE = 8192  # characters of a provider option's value, as of a session config value


def touches_files(name: str) -> bool:
    """Whether an option or property name has one of FILE_WORDS among its words (split at "_", "-", "." and at
    camelCase: ModelCacheDirectory is model, cache, directory)."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", name)
    return any(word.lower() in FILE_WORDS for word in words)


def _file_properties(value: object) -> list[str]:
    """The names in OpenVINO's load_config, as decoded (JSON escapes such as \\u0043 read as the letters they are):
    every word-like token of its keys and of its strings (OpenVINO reads property maps serialized into strings, e.g.
    DEVICE_PROPERTIES) that touches_files() matches."""
    if isinstance(value, dict):
        texts = [str(k) for k in value] + [t for v in value.values() for t in _file_properties(v)]
    elif isinstance(value, list):
        texts = [t for v in value for t in _file_properties(v)]
    else:
        texts = [str(value)]
    return sorted({t for text in texts for t in re.findall(r"[A-Za-z][A-Za-z0-9_]*", text) if touches_files(t)})


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"a key is given twice ({sorted(k for k in set(keys) if keys.count(k) > 1)[0]!r})")
    return dict(pairs)


def provider_option_problem(provider: str, name: str, value: object) -> str | None:
    """Why `name = value` is not a valid option of `provider`, or None (also None for an option of an unchecked
    provider, unless its name says it touches files)."""
    known = PROVIDER_OPTIONS.get(provider)
    if len(str(value)) > MAX_OPTION_VALUE:
        return f"is {len(str(value))} characters long; at most {MAX_OPTION_VALUE}"
    if known is None:
        return (f"names a file, a folder or a library by its name ('{name}'): options that touch files are not "
                "options") if touches_files(name) else None
    if name not in known:
        if not known:
            return f"{provider} takes no provider options (ONNX Runtime ignores them silently)"
        return f"unknown {provider} option '{name}'"
    spec = known[name]
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if spec.kind == "flag" and text not in ("0", "1", "true", "false"):
        return f"must be a flag (true/false or \"0\"/\"1\"), got {value!r}"
    if spec.kind == "int" and (isinstance(value, bool) or not text.lstrip("-").isdigit()
                               or not -1 <= int(text) <= spec.maximum):
        return f"must be an integer from -1 to {spec.maximum}, got {value!r}"
    if spec.kind == "choice" and text not in spec.choices:
        return f"'{text}' is not one of {', '.join(spec.choices)}"
    if spec.kind == "json":
        try:
            ok = isinstance(json.loads(text, object_pairs_hook=_unique_keys), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            return ("must be a JSON object in a string, each key once, e.g. "
                    "'{\"CPU\": {\"INFERENCE_PRECISION_HINT\": \"f32\"}}'")
        touching = _file_properties(json.loads(text))
        if touching:
            return (f"sets {', '.join(touching)}, which names or writes files (OpenVINO's CACHE_DIR writes the "
                    "compiled blob with the weights in plaintext): ortbuild ships the compiled blob inside the "
                    "encrypted artifact; remove it")
    return None
