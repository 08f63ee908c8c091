"""The single source of every targets.toml key: names, kinds, defaults and docs.

It drives validation (ortbuild.project.config), the shipped JSON Schema (ortbuild/targets.schema.json) and the
reference docs (docs/targets-reference.md). Regenerate the last two with `ortbuild schema --write`.
This module is stdlib-only: the noxfile imports it (through ortbuild.project.config) before any venv exists.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

INT_MAX = 2**31 - 1       # what ONNX Runtime's int options take
NUMBER_MAX = 1e12         # numbers are finite: TOML's inf and nan are refused


@dataclass(frozen=True)
class PrecisionRule:
    """What a precision is: the table holding its options, and what it needs."""

    name: str
    options_table: str | None        # the target sub-table read by this precision (None: no options)
    quantized: bool = False          # the quantizers' int8 path (pre-processing, opset >= 13)
    needs_calibration: bool = False  # needs the model's `calibration` data
    # the golden test's default rule (under [targets.X.accuracy]); fp32 is elementwise, the reduced
    # precisions are judged by task metrics (cosine similarity, top-1 agreement), not elementwise
    accuracy: tuple[tuple[str, float], ...] = (("cosine", 0.99),)
    max_size_ratio: float = 1.0      # the size gate's default: a reduced precision never outgrows its source


FP32_ACCURACY = (("rtol", 1e-4), ("atol", 1e-5))


# The one place that knows the precision names; everything else asks these rules.
PRECISION_RULES: dict[str, PrecisionRule] = {r.name: r for r in (
    PrecisionRule("fp32", None, accuracy=FP32_ACCURACY, max_size_ratio=1.1),
    PrecisionRule("fp16", "fp16", accuracy=(("cosine", 0.999),)),
    PrecisionRule("int8-dynamic", "quantization", quantized=True),
    PrecisionRule("int8-static", "quantization", quantized=True, needs_calibration=True),
    PrecisionRule("int4-weight", "int4"),
)}
PRECISIONS = tuple(PRECISION_RULES)
FP32, FP16, INT8_DYNAMIC, INT8_STATIC, INT4_WEIGHT = PRECISIONS


@dataclass(frozen=True)
class LevelRule:
    """What an optimization level does to the graph, and what that ties the artifact to."""

    name: str
    ort_enum: str                    # the onnxruntime.GraphOptimizationLevel member
    portable: bool                   # standard ONNX ops only: any provider can load the result
    nchwc: bool                      # may hold NCHWc ops laid out for the build CPU's SIMD width


# The one place that knows the optimization levels, in increasing order.
LEVEL_RULES: dict[str, LevelRule] = {r.name: r for r in (
    LevelRule("disable", "ORT_DISABLE_ALL", portable=True, nchwc=False),
    LevelRule("basic", "ORT_ENABLE_BASIC", portable=True, nchwc=False),
    LevelRule("extended", "ORT_ENABLE_EXTENDED", portable=False, nchwc=False),
    LevelRule("layout", "ORT_ENABLE_LAYOUT", portable=False, nchwc=True),
    LevelRule("all", "ORT_ENABLE_ALL", portable=False, nchwc=True),
)}
LEVELS = tuple(LEVEL_RULES)
PORTABLE_LEVEL = "basic"  # the highest level whose graph any provider loads


def cap_level(level: str) -> str:
    """The level, at most the highest portable one (for portable and compiling-provider builds)."""
    return level if LEVEL_RULES[level].portable else PORTABLE_LEVEL

FORMATS = ("onnx", "ort")

# The model types of ONNX Runtime's transformer optimizer (`fusion.model_type`): the keys of
# onnxruntime.transformers.optimizer.MODEL_TYPES in onnxruntime 1.31.1 (tests/test_fusion.py compares them with
# the installed module), in its order. "off" (the default) runs no fusion.
FUSION_OFF = "off"
FUSION_MODEL_TYPES = ("bart", "bert", "bert_tf", "bert_keras", "clip", "conformer", "gpt2", "gpt2_tf", "gpt_neox",
                      "phi", "qwen3", "sam2", "swin", "tnlr", "t5", "unet", "vae", "vit", "mmdit")
# The types whose num_heads and hidden_size the optimizer infers from the graph (0); the others need both
# (onnxruntime.transformers.optimizer.optimize_by_fusion warns and fuses with wrong sizes otherwise).
FUSION_INFERS_SIZES = frozenset({"bert", "t5", "swin", "unet", "vae", "clip", "sam2", "mmdit"})

# pip distributions that provide the `onnxruntime` module, and the providers each can offer.
RUNTIMES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("CPUExecutionProvider", "AzureExecutionProvider", "CoreMLExecutionProvider"),
    "onnxruntime-gpu": ("CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-openvino": ("OpenVINOExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-directml": ("DmlExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-qnn": ("QNNExecutionProvider", "CPUExecutionProvider"),
    "onnxruntime-rocm": ("ROCMExecutionProvider", "MIGraphXExecutionProvider", "CPUExecutionProvider"),
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
# weights) as plaintext files, or decrypt them with a library of their own; ortbuild compiles at build time
# and ships the result inside the encrypted artifact instead.
PLAINTEXT_OPTIONS: dict[str, dict[str, str]] = {
    "TensorrtExecutionProvider": {
        o: "TensorRT engines hold the weights: ortbuild builds the engine at build time (EPContext) and ships it "
           "inside the encrypted artifact, never as a plaintext file"
        for o in ("trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
                  "trt_dump_ep_context_model", "trt_ep_context_file_path", "trt_ep_context_embed_mode",
                  "trt_engine_decryption_enable", "trt_engine_decryption_lib_path",
                  "trt_weight_stripped_engine_enable", "trt_onnx_model_folder_path")},
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

# Session config keys found in the onnxruntime 1.31.1 binary (../shared/research/ort.md, appendix B).
# ORT accepts misspelled keys silently, so ortbuild refuses anything not listed here.
SESSION_CONFIG_KEYS = frozenset({
    "ep.context_embed_mode", "ep.context_enable", "ep.context_file_path",
    "ep.context_model_external_initializers_file_name", "ep.enable_weightless", "ep.cuda.fpa_intb_gemm",
    "ep.cuda.fpa_intb_profile_m", "ep.cuda.gqa_workspace_max_total_sequence_length", "mlas.disable_kleidiai",
    "mlas.kleidiai.conv_igemm_max_work", "mlas.nchwc_depthwise_sliding",
    "mlas.nchwc_pointwise_conv_max_input_channel_batch", "mlas.qnbit.force_fp32", "mlas.use_lut_gemm",
    "optimization.constant_folding_max_output_size_in_bytes", "optimization.disable_specified_optimizers",
    "optimization.enable_cast_chain_elimination", "optimization.enable_gelu_approximation",
    "optimization.minimal_build_optimizations", "session.allow_released_opsets_only",
    "session.collect_node_memory_stats_to_file", "session.debug_layout_transformation",
    "session.disable_aot_function_inlining", "session.disable_cpu_ep_fallback",
    "session.disable_double_qdq_remover", "session.disable_model_compile", "session.disable_prepacking",
    "session.disable_qdq_constant_folding", "session.disable_quant_qdq", "session.dynamic_block_base",
    "session.enable_quant_qdq_cleanup", "session.fail_on_suboptimal_compiled_model",
    "session.force_spinning_stop", "session.function_expansion_byte_limit",
    "session.function_expansion_node_limit", "session.graph_optimizations_loop_level",
    "session.inter_op.allow_spinning", "session.inter_op.spin_backoff_max", "session.inter_op.spin_duration_us",
    "session.intra_op.allow_spinning", "session.intra_op.spin_backoff_max", "session.intra_op.spin_duration_us",
    "session.intra_op_thread_affinities", "session.layer_assignment_settings", "session.log_id",
    "session.max_shape_override", "session.model_external_initializers_file_folder_path",
    "session.node_partition_config_file", "session.prepack.enable_parallel",
    "session.qdq_matmulnbits_accuracy_level", "session.qdq_matmulnbits_block_size", "session.qdqisint8allowed",
    "session.record_ep_graph_assignment_info", "session.resource_cuda_partitioning_settings",
    "session.set_denormal_as_zero", "session.strict_shape_type_inference",
    "session.strict_workspace_verification", "session.use_device_allocator_for_initializers",
    "session.use_env_allocators", "session.use_external_initializer_file_buffers_directly",
    "session.use_per_session_threads", "session.x64quantprecision",
})
# The kind of each session config value (ORT parses the string; a wrong kind is ignored or fails late).
# "0/1": a flag; "int": a non-negative integer; anything not listed is free text.
CONFIG_FLAGS = frozenset({
    "ep.context_enable", "ep.enable_weightless", "mlas.disable_kleidiai", "mlas.qnbit.force_fp32",
    "mlas.use_lut_gemm", "optimization.enable_cast_chain_elimination", "optimization.enable_gelu_approximation",
    "session.allow_released_opsets_only", "session.debug_layout_transformation",
    "session.disable_aot_function_inlining",
    "session.disable_cpu_ep_fallback", "session.disable_double_qdq_remover", "session.disable_model_compile",
    "session.disable_prepacking", "session.disable_qdq_constant_folding", "session.disable_quant_qdq",
    "session.enable_quant_qdq_cleanup", "session.fail_on_suboptimal_compiled_model", "session.force_spinning_stop",
    "session.inter_op.allow_spinning", "session.intra_op.allow_spinning", "session.prepack.enable_parallel",
    "session.qdqisint8allowed", "session.record_ep_graph_assignment_info", "session.set_denormal_as_zero",
    "session.strict_shape_type_inference", "session.strict_workspace_verification",
    "session.use_device_allocator_for_initializers", "session.use_env_allocators",
    "session.use_external_initializer_file_buffers_directly", "session.use_per_session_threads",
    "session.x64quantprecision", "ep.cuda.fpa_intb_gemm",
})
CONFIG_INTS = {  # key: largest value
    "ep.context_embed_mode": 1, "session.graph_optimizations_loop_level": 2,
    "session.qdq_matmulnbits_accuracy_level": 4,
    "session.qdq_matmulnbits_block_size": 256, "session.dynamic_block_base": 1 << 20,
    "session.function_expansion_byte_limit": INT_MAX, "session.function_expansion_node_limit": INT_MAX,
    "session.inter_op.spin_backoff_max": 1 << 20, "session.intra_op.spin_backoff_max": 1 << 20,
    "session.inter_op.spin_duration_us": 10_000_000, "session.intra_op.spin_duration_us": 10_000_000,
    "optimization.constant_folding_max_output_size_in_bytes": 1 << 40, "ep.cuda.fpa_intb_profile_m": INT_MAX,
    "ep.cuda.gqa_workspace_max_total_sequence_length": INT_MAX, "mlas.kleidiai.conv_igemm_max_work": INT_MAX,
    "mlas.nchwc_pointwise_conv_max_input_channel_batch": INT_MAX,
}


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


def provider_option_problem(provider: str, name: str, value: Any) -> str | None:
    """Why `name = value` is not a valid option of `provider`, or None (also None for unchecked providers)."""
    known = PROVIDER_OPTIONS.get(provider)
    if known is None:
        return None
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
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
        if not ok:
            return "must be a JSON object in a string, e.g. '{\"CPU\": {\"INFERENCE_PRECISION_HINT\": \"f32\"}}'"
    return None


def config_value_problem(key: str, value: str) -> str | None:
    """Why `value` is not valid for session config `key`, by the key's kind, or None."""
    if key in CONFIG_FLAGS and value not in ("0", "1"):
        return f"must be \"0\" or \"1\", got {value!r}"
    if key in CONFIG_INTS and (not value.isdigit() or int(value) > CONFIG_INTS[key]):
        return f"must be an integer from 0 to {CONFIG_INTS[key]} (as a string), got {value!r}"
    return None


# Graph optimizer names found in the onnxruntime 1.31.1 binary (for `disabled_optimizers`). ORT ignores an
# unknown name silently, so the build notes any name not listed here.
KNOWN_OPTIMIZERS = frozenset([
    "#", "noqa:", "SIM905", "AttentionFusion", "BiasDropoutFusion", "BiasGeluFusion", "BiasSkipLayerNormFusion",
    "BiasSoftmaxFusion", "CastChainElimination", "CastElimination", "CommonSubexpressionElimination",
    "ConstantFolding", "ConstantSharing", "ConvActivationFusion", "ConvAddActivationFusion", "ConvAddFusion",
    "ConvBNFusion", "ConvMulFusion", "DivMulFusion", "DoubleQDQPairsRemover", "DynamicQuantizeMatMulFusion",
    "EliminateDropout", "EliminateIdentity", "EliminateSlice", "EmbedLayerNormFusion", "ExpandElimination",
    "FastGeluFusion", "FuseReluClip", "GatherToSliceFusion", "GeluApproximation", "GeluFusion",
    "GemmActivationFusion", "GemmSumFusion", "GemmTransposeFusion", "GroupQueryAttentionFusion",
    "LabelEncoderFusion", "LayerNormFusion", "MatMulActivationFusion", "MatMulAddFusion",
    "MatMulIntegerToFloatFusion", "MatMulNBitsMlpFusion", "MatMulNBitsQkvFusion", "MatMulScaleFusion",
    "MatmulTransposeFusion", "NchwcTransformer", "NhwcTransformer", "NoopElimination", "NotWhereFusion",
    "QDQFinalCleanupTransformer", "QDQPropagationTransformer", "QDQS8ToU8Transformer",
    "QDQSelectorActionTransformer", "QuickGeluFusion", "RemoveDuplicateCastTransformer", "ReshapeFusion",
    "SimplifiedLayerNormFusion", "SkipLayerNormFusion", "SliceConcatToSpaceToDepthFusion", "TransposeOptimizer",
    "UnsqueezeElimination",
])

# Keys ortbuild sets itself from other options: setting them by hand would contradict the manifest.
RESERVED_CONFIG_KEYS = {
    "session.optimized_model_filepath": "ortbuild sets it to its private temp dir during the optimize step",
    "session.save_model_format": "use the target key `format`",
    "session.load_model_format": "use the target key `format`",
    "session.graph_optimization_level": "use the target key `optimization`",
    "session.intra_op_num_threads": "use [targets.X.session] intra_op_num_threads",
    "session.inter_op_num_threads": "use [targets.X.session] inter_op_num_threads",
    "session.execution_mode": "use [targets.X.session] execution_mode",
    "session.enable_mem_pattern": "use [targets.X.session] enable_mem_pattern",
    "session.enable_cpu_mem_arena": "use [targets.X.session] enable_cpu_mem_arena",
    "session.use_deterministic_compute": "use [targets.X.session] use_deterministic_compute",
    "session.enable_profiling": "profiling writes files outside the build; not supported in artifacts",
    "session.use_ort_model_bytes_directly": "unsafe from Python (the buffer must outlive the session)",
    "session.use_ort_model_bytes_for_initializers": "segfaults from Python in 1.31.1",
}


@dataclass(frozen=True, kw_only=True)
class Key:
    """One key of one table. `kind` is one of KINDS; `table` names the sub-table spec of table kinds."""

    name: str
    kind: str
    doc: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] = ()
    table: str | None = None
    maximum: float | None = None     # integer/number kinds: the largest value (None: INT_MAX / NUMBER_MAX)



KINDS = ("string", "integer", "number", "boolean", "strings", "requirements", "providers", "config", "dims", "table",
         "tables", "named")  # named: a table of NAME = sub-table

_MODELS_KEY = Key(name="models", kind="strings", default=["*"],
                  doc="Glob patterns (fnmatch) of the model names this applies to.")

TABLES: dict[str, tuple[Key, ...]] = {
    "project": (
        Key(name="name", kind="string", required=True, doc="Project name, recorded in every manifest."),
        Key(name="version", kind="string", required=True, doc="Project version, recorded in every manifest."),
        Key(name="description", kind="string", default="", doc="Free text."),
        Key(name="epoch", kind="integer", default=0,
            doc="Rollback counter, signed into every manifest: raise it when an older artifact must no longer "
                "load. Each generated loader refuses an artifact whose epoch is below the one it was generated "
                "with (docs/container.md, rollback protection)."),
    ),
    "model": (
        Key(name="path", kind="string", required=True,
            doc="The source ONNX model, relative to targets.toml."),
        Key(name="inputs", kind="string", required=True,
            doc="Golden inputs, relative to targets.toml: an .npz keyed by input name (one feed), or a "
                "directory in the ONNX layout `test_data_set_N/input_K.pb`. Every artifact must run on them."),
        Key(name="calibration", kind="string", default=None,
            doc="Calibration data for int8-static, same formats as `inputs`; in an .npz the first axis of "
                "each array indexes the samples. Use realistic data: noise ruins static quantization."),
        Key(name="expected", kind="string", default=None,
            doc="Expected (golden) outputs, relative to targets.toml: an .npz keyed by output name (for one "
                "feed), or the ONNX layout `test_data_set_N/output_K.pb` (e.g. from the training framework). "
                "Without it they are computed from the source model in fp32 on the CPU provider with "
                "optimizations disabled, and stored beside each artifact (`golden/`)."),
        Key(name="custom_ops", kind="strings", default=[],
            doc="Custom-operator libraries the model needs (its ops outside ONNX's domains): each a pip requirement "
                "pinned with `==` of a Python package whose module's `get_library_path()` gives the library, e.g. "
                "`onnxruntime-extensions==0.15.2`, or the path of a shared library (`.so`, `.dylib`, `.dll`) "
                "relative to targets.toml. nox installs the packages into the target's virtualenv; every session "
                "the build and the tests open registers them; the manifest records each (name, version, sha256) "
                "and the loaders check that sha256 before registering it (a path library ships beside the "
                "artifact). See docs/diagnose.md."),
        Key(name="description", kind="string", default="", doc="Free text."),
    ),
    "target": (
        Key(name="extends", kind="string", default=None,
            doc="Name of another target whose keys this one inherits (tables merge key by key, lists "
                "are replaced). Chains are allowed, cycles are an error."),
        Key(name="description", kind="string", default="", doc="Free text."),
        Key(name="runtime", kind="requirements", required=True,
            doc="pip requirement of the target's ONNX Runtime flavor, e.g. `onnxruntime==1.31.1`, "
                "`onnxruntime-openvino==1.24.1`, `onnxruntime-gpu==1.31.1`; or an array of the flavor and the "
                "plugin execution providers it loads, e.g. `[\"onnxruntime==1.31.1\", "
                "\"onnxruntime-ep-openvino==1.8.1\"]` (one flavor per target). nox installs them into the "
                "target's own virtualenv; `ortbuild build` refuses to build a target in an environment "
                "whose flavor, plugins or versions do not match."),
        Key(name="providers", kind="providers", required=True,
            doc="Ordered execution providers. Each entry is a name or a table "
                "`{name = \"...\", options = {...}}` of provider options."),
        Key(name="custom_ops", kind="strings", default=[],
            doc="Custom-operator libraries every model of this target needs, added to each model's `custom_ops` "
                "(same forms)."),
        Key(name="precision", kind="string", default="fp32", choices=PRECISIONS,
            doc="fp32 (as is), fp16 (ORT float16 converter), int8-dynamic (`quantize_dynamic`), "
                "int8-static (`quantize_static`, needs the model's `calibration`), int4-weight "
                "(`MatMulNBitsQuantizer`, block-wise weight-only)."),
        Key(name="optimization", kind="string", default="all", choices=LEVELS,
            doc="Offline graph-optimization level, applied inside the target's runtime. `basic` is "
                "portable; `extended` ties the artifact to the providers; `layout` and `all` also tie it "
                "to the build CPU's SIMD level (NCHWc). Compiling providers (OpenVINO, TensorRT) cannot "
                "serialize their compiled graph: the artifact then holds the portable basic graph."),
        Key(name="format", kind="string", default="onnx", choices=FORMATS,
            doc="Artifact format: `onnx`, or `ort` (ORT flatbuffer format, for mobile/minimal builds; "
                "not with compiling providers)."),
        Key(name="encrypt", kind="boolean", default=True,
            doc="Encrypt the artifact (container format v1, docs/container.md) under the build's encryption "
                "key. `false` publishes it in plaintext, recorded in the manifest; it is still signed."),
        Key(name="external_data", kind="boolean", default=False,
            doc="Store the weights in a separate file (`model.onnx.data`, encrypted like the graph); the loaders "
                "hand it to ONNX Runtime from memory. `false` still writes external data where it is needed: for "
                "a source that keeps its weights as external data, and where one file would pass protobuf's 2 GB "
                "limit (the manifest's `artifact.external_data` says why). Format `onnx` only."),
        Key(name="constant_folding", kind="string", default="auto", choices=("auto", "on", "off"),
            doc="Constant folding during offline optimization. It can turn weights stored compressed (int8 or "
                "fp16 expanded by Cast/DequantizeLinear/Mul in the graph) into fp32 initializers, up to 4x the "
                "bytes. `auto` optimizes again without it when the artifact grew that way, and says so in the "
                "summary and manifest; `on` keeps ORT's behaviour; `off` always disables it."),
        Key(name="disabled_optimizers", kind="strings", default=[],
            doc="ORT graph optimizers to disable during offline optimization (`disabled_optimizers` of "
                "InferenceSession), e.g. [\"ConstantFolding\"]."),
        Key(name="require", kind="boolean", default=False,
            doc="`ortbuild test` fails (instead of skipping) when this target cannot run here, e.g. on CI "
                "runners that have its hardware. Same as `--require`."),
        Key(name="runner", kind="strings", default=["ubuntu-latest"],
            doc="CI runner labels of the machine that builds and tests this target (`ortbuild matrix` puts them "
                "in `runs-on`), e.g. [\"self-hosted\", \"linux\", \"gpu\"]. See docs/ci.md."),
        _MODELS_KEY,
        Key(name="accuracy", kind="table", table="accuracy", default={},
            doc="The golden-output test's rule; defaults per precision (fp32: rtol 1e-4, atol 1e-5; fp16: "
                "cosine 0.999; int8/int4: cosine 0.99), over which the target's keys and then "
                "`outputs.NAME` tables apply. A rule follows its precision: a target (or override) whose "
                "precision differs from its parent's (int8-dynamic and int8-static count as one) does not inherit "
                "the parent's rule, only its outputs' `ignore`; `ortbuild plan` says which rule applies. "
                "See docs/testing.md and docs/targets.md."),
        Key(name="latency", kind="table", table="latency", default={},
            doc="Latency budgets (percentiles in ms, relative to another target), checked by `ortbuild test`."),
        Key(name="size", kind="table", table="size", default={},
            doc="Size budgets of the artifact, checked by `ortbuild test`."),
        Key(name="quantization", kind="table", table="quantization", default={},
            doc="Options of int8-dynamic and int8-static."),
        Key(name="fp16", kind="table", table="fp16", default={}, doc="Options of fp16."),
        Key(name="int4", kind="table", table="int4", default={}, doc="Options of int4-weight."),
        Key(name="fusion", kind="table", table="fusion", default={},
            doc="ONNX Runtime's transformer optimizer, run before the precision step: `{ model_type = \"bert\" }` "
                "fuses attention, layer norms, GELU and embeddings into `com.microsoft` ops (Attention, "
                "SkipLayerNormalization, BiasGelu, EmbedLayerNormalization, ...), which tie the artifact to "
                "providers that have those kernels (CPU, CUDA, ROCm). Off by default. See docs/targets.md."),
        Key(name="session", kind="table", table="session", default={},
            doc="Session options recorded in the manifest and used by every session the build opens."),
        Key(name="free_dimensions", kind="dims", default={},
            doc="Pin symbolic dimensions by name, e.g. `{ batch = 1 }` "
                "(`add_free_dimension_override_by_name`)."),
        Key(name="overrides", kind="tables", table="override", default=[],
            doc="Ordered per-model overrides: each `[[targets.X.overrides]]` has `models` (globs) and any "
                "of the keys precision, optimization, format, providers, free_dimensions, quantization, "
                "fp16, int4, fusion, session, encrypt, external_data, constant_folding, disabled_optimizers, "
                "accuracy, latency, size. Later matches win; tables merge key by key."),
    ),
    "override": (
        Key(name="models", kind="strings", required=True, doc="Glob patterns of the models it applies to."),
        # the remaining keys are copied from "target" below
    ),
    "accuracy": (),  # the rule keys (ACCURACY_RULE below) and `outputs`
    "output_accuracy": (),  # the rule keys, and `ignore`
    "latency": (
        Key(name="p50_ms", kind="number", default=None, maximum=3_600_000, doc="Budget of the median latency, in ms."),
        Key(name="p90_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the 90th percentile latency, in ms."),
        Key(name="p99_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the 99th percentile latency, in ms."),
        Key(name="faster_than", kind="table", table="faster_than", default=None,
            doc="A relative budget measured in the same run, interleaved: `{ target = \"cpu-fp32\", ratio = "
                "1.5 }` means this target's median latency times 1.5 is at most that target's (same model). "
                "Holds across machines of different speed. The other target must run in this runtime. "
                "Not inherited through `extends`."),
        Key(name="data_sets", kind="named", table="latency_data_set", default={},
            doc="Budgets of one golden data set `[targets.X.latency.data_sets.test_data_set_N]` (the model's "
                "`inputs` directory holds one `test_data_set_N/` per shape), over the budgets above key by key. "
                "Every data set is timed; a name no model of the target has is an error."),
        Key(name="confidence", kind="number", default=0.99, maximum=0.999999,
            doc="Confidence of every verdict (distribution-free binomial bounds on the percentile), every look "
                "of the sequential plan accounted for."),
        Key(name="min_samples", kind="integer", default=0, maximum=1_000_000,
            doc="Samples taken before the first look (no verdict stops sampling earlier); with a budget still "
                "undecided, sampling goes on to at least this many. 0: the first look at 20 samples, and "
                "undecided budgets go on to at least 100 and 1.5x the fewest samples that can bound the tightest "
                "budgeted percentile (44 for p90, 459 for p99 at 0.99)."),
        Key(name="min_seconds", kind="number", default=1.0, maximum=3600,
            doc="With a budget still undecided (or no budget), sampling lasts at least this long; a decided "
                "verdict stops it at the next look."),
        Key(name="warmup_runs", kind="integer", default=5, maximum=100_000,
            doc="Untimed runs after the first one (session creation and the first run are reported apart)."),
        Key(name="retry_wait_seconds", kind="number", default=30.0, maximum=3600,
            doc="A FAIL measured under load (more runnable threads than CPUs) or drift is measured again once "
                "the load has fallen, after waiting at most this long (0: at once); still under load, it is "
                "INCONCLUSIVE."),
    ),
    "latency_data_set": (
        Key(name="p50_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the median latency on this data set, in ms."),
        Key(name="p90_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the 90th percentile latency on this data set, in ms."),
        Key(name="p99_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the 99th percentile latency on this data set, in ms."),
    ),
    "faster_than": (
        Key(name="target", kind="string", required=True, doc="The target to compare with (same model)."),
        Key(name="ratio", kind="number", required=True, maximum=1000,
            doc="Its median latency divided by this target's must be at least this (0.8: at most 1.25x slower)."),
    ),
    "size": (
        Key(name="max_ratio", kind="number", default=None, maximum=1000,
            doc="Largest artifact size / source size (all files). Default 1.1 for fp32, 1.0 for the reduced "
                "precisions: an artifact bigger than its source is usually folded constants. 4 KB are allowed on top "
                "(the container header and graph metadata of very small models)."),
        Key(name="max_mb", kind="number", default=None, maximum=1 << 20,
            doc="Largest artifact size in MiB (all files)."),
    ),
    "quantization": (
        Key(name="format", kind="string", default="qdq", choices=("qdq", "qoperator"),
            doc="int8-static graph format. QDQ is ORT's recommendation for CPU and the only one TensorRT "
                "takes. int8-dynamic is always QOperator-style (DynamicQuantizeLinear + MatMulInteger)."),
        Key(name="per_channel", kind="boolean", default=True, doc="Per-channel weight scales."),
        Key(name="weight_type", kind="string", default="int8", choices=("int8", "uint8"),
            doc="Weight type. S8 weights are the fast path on x86 (U8 weights gave no speed-up)."),
        Key(name="activation_type", kind="string", default="uint8", choices=("int8", "uint8"),
            doc="Activation type of int8-static (U8 activations / S8 weights is ORT's x86 advice)."),
        Key(name="reduce_range", kind="boolean", default=False,
            doc="7-bit weights; can help accuracy on CPUs without VNNI."),
        Key(name="op_types", kind="strings", default=[],
            doc="Op types to quantize, e.g. [\"MatMul\"]. Empty: every type the quantizer supports."),
        Key(name="exclude_nodes", kind="strings", default=[], doc="Node names to keep in float."),
        Key(name="calibration_method", kind="string", default="minmax",
            choices=("minmax", "entropy", "percentile", "distribution"), doc="int8-static calibration."),
        Key(name="preprocess", kind="boolean", default=True,
            doc="Run `quant_pre_process` (symbolic shape inference + basic optimization) first."),
    ),
    "fp16": (
        Key(name="keep_io_types", kind="boolean", default=True,
            doc="Keep float32 graph inputs and outputs (Casts are inserted inside)."),
        Key(name="op_block_list", kind="strings", default=[],
            doc="Op types kept in float32, added to the converter's default block list."),
        Key(name="node_block_list", kind="strings", default=[], doc="Node names kept in float32."),
    ),
    "int4": (
        Key(name="block_size", kind="integer", default=32, maximum=256,
            doc="Quantization block size (16, 32, 64, 128 or 256)."),
        Key(name="symmetric", kind="boolean", default=True, doc="Symmetric (no zero point) blocks."),
        Key(name="accuracy_level", kind="integer", default=0, maximum=4,
            doc="MatMulNBits compute type: 0 = runtime default, 1 fp32, 2 fp16, 3 bf16, 4 int8."),
        Key(name="exclude_nodes", kind="strings", default=[], doc="Node names to keep in float."),
    ),
    "fusion": (
        Key(name="model_type", kind="string", default=FUSION_OFF, choices=(FUSION_OFF, *FUSION_MODEL_TYPES),
            doc="`off`, or the model type of ONNX Runtime's transformer optimizer "
                "(`onnxruntime.transformers.optimizer.optimize_model`, its Python fusions: `opt_level = 0`; ORT's "
                "own graph optimizations run later, at the target's `optimization` level): `bert` for BERT-like "
                "encoders (MiniLM, RoBERTa, DistilBERT), `gpt2`, `t5`, `vit`, ... A fusion that fuses nothing is "
                "noted and the source is kept. Not with compiling providers (OpenVINO, TensorRT, ...); skipped, "
                "with a note, in portable builds."),
        Key(name="num_heads", kind="integer", default=0, maximum=4096,
            doc="Attention heads; 0: inferred from the graph (bert, t5, swin, unet, vae, clip, sam2, mmdit). The "
                "other model types need it and `hidden_size`."),
        Key(name="hidden_size", kind="integer", default=0, maximum=1 << 20,
            doc="Hidden size; 0: inferred from the graph, like `num_heads` (give both or neither)."),
    ),
    "session": (
        Key(name="intra_op_num_threads", kind="integer", default=0, maximum=1024,
            doc="0 = ORT's default (physical cores)."),
        Key(name="inter_op_num_threads", kind="integer", default=0, maximum=1024,
            doc="Used only with execution_mode parallel."),
        Key(name="execution_mode", kind="string", default="sequential", choices=("sequential", "parallel"),
            doc="ORT execution mode."),
        Key(name="enable_mem_pattern", kind="boolean", default=True, doc="Memory pattern planning."),
        Key(name="enable_cpu_mem_arena", kind="boolean", default=True,
            doc="CPU arena; off returns memory after bursts of varying shapes."),
        Key(name="use_deterministic_compute", kind="boolean", default=False, doc="Deterministic kernels."),
        Key(name="config", kind="config", default={},
            doc="Session config entries (`add_session_config_entry`), e.g. "
                "`{ \"session.intra_op.allow_spinning\" = \"0\" }`. Keys are checked against an allowlist "
                "of the keys in onnxruntime 1.31.1, because ORT accepts misspelled keys silently."),
    ),
}

ACCURACY_RULE = (
    Key(name="rtol", kind="number", default=None, maximum=1e6,
        doc="Elementwise rule |actual - expected| <= atol + rtol * |expected| (fp32 default 1e-4)."),
    Key(name="atol", kind="number", default=None, maximum=1e6,
        doc="Elementwise absolute tolerance (fp32 default 1e-5)."),
    Key(name="mismatch_fraction", kind="number", default=0.0, maximum=1,
        doc="Fraction of elements allowed to break the elementwise rule (e.g. 0.02 for detection masks)."),
    Key(name="cosine", kind="number", default=None, maximum=1,
        doc="Least cosine similarity of actual and expected (flattened); fp16 default 0.999, int8/int4 0.99."),
    Key(name="top1", kind="number", default=None, maximum=1,
        doc="Least fraction of rows whose arg-max over the last axis (the classes) agrees with the golden one. "
            "Set it on classifier outputs (`[targets.X.accuracy.outputs.logits] top1 = 0.99`)."),
    Key(name="top5", kind="number", default=None, maximum=1,
        doc="Least fraction of rows whose expected arg-max is among the actual top 5."),
)
TABLES["accuracy"] = (*ACCURACY_RULE, Key(
    name="outputs", kind="named", table="output_accuracy", default={},
    doc="Per-output rules `[targets.X.accuracy.outputs.NAME]`, over the target's rule. Integer, boolean "
        "and string outputs (and the keys of sequence/map outputs) always match exactly."))
TABLES["output_accuracy"] = (*ACCURACY_RULE, Key(
    name="ignore", kind="boolean", default=False, doc="Do not compare this output (say why in a comment)."))

OVERRIDABLE = (  # the keys of a target that can differ per model (the rest are target-wide)
    "precision", "optimization", "format", "providers", "free_dimensions",
    "quantization", "fp16", "int4", "fusion", "session", "encrypt", "external_data", "constant_folding",
    "disabled_optimizers", "accuracy", "latency", "size")
TABLES["override"] = TABLES["override"] + tuple(
    dataclasses.replace(k, required=False) for k in TABLES["target"] if k.name in OVERRIDABLE)


def keys(table: str) -> dict[str, Key]:
    return {k.name: k for k in TABLES[table]}


def defaults(table: str) -> dict[str, Any]:
    """Default values of a table, sub-tables filled recursively."""
    out: dict[str, Any] = {}
    for k in TABLES[table]:
        if k.kind == "table" and k.table:
            if k.default is not None:  # an optional table (default None) stays absent
                out[k.name] = defaults(k.table)
        elif k.default is not None:
            out[k.name] = json.loads(json.dumps(k.default))  # a fresh copy
    return out


# ----------------------------------------------------------------------------------------- JSON Schema

def _provider_options_schema(provider: str) -> dict[str, Any]:
    """if name == provider then its options are the documented ones, of their kinds."""
    flag = {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["0", "1", "true", "false"]},
                      {"type": "integer", "enum": [0, 1]}]}
    kinds: dict[str, dict[str, Any]] = {"flag": flag, "text": {"type": "string"}, "json": {"type": "string"}}

    def one(o: ProviderOption) -> dict[str, Any]:
        if o.kind == "choice":
            return {"type": "string", "enum": list(o.choices)}
        if o.kind == "int":
            return {"anyOf": [{"type": "integer", "minimum": -1, "maximum": o.maximum},
                              {"type": "string", "pattern": "^-?[0-9]+$"}]}
        return kinds[o.kind]
    props = {name: one(o) for name, o in PROVIDER_OPTIONS[provider].items()}
    return {"if": {"properties": {"name": {"const": provider}}},
            "then": {"properties": {"options": {"type": "object", "additionalProperties": False,
                                                "properties": props}}}}


def _key_schema(k: Key) -> dict[str, Any]:
    s: dict[str, Any]
    if k.kind == "string":
        s = {"type": "string"}
        if k.choices:
            s["enum"] = list(k.choices)
    elif k.kind == "integer":
        s = {"type": "integer", "minimum": 0, "maximum": int(k.maximum if k.maximum is not None else INT_MAX)}
    elif k.kind == "number":
        s = {"type": "number", "minimum": 0, "maximum": k.maximum if k.maximum is not None else NUMBER_MAX}
    elif k.kind == "boolean":
        s = {"type": "boolean"}
    elif k.kind == "strings":
        s = {"type": "array", "items": {"type": "string"}}
    elif k.kind == "requirements":
        s = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
    elif k.kind == "providers":
        entry = {"anyOf": [
            {"type": "string", "enum": list(PROVIDERS)},
            {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
                "name": {"type": "string", "enum": list(PROVIDERS)},
                "options": {"type": "object",
                            "additionalProperties": {"type": ["string", "integer", "number", "boolean"]}},
            }, "allOf": [_provider_options_schema(p) for p in PROVIDER_OPTIONS]},
        ]}
        s = {"type": "array", "minItems": 1, "items": entry}
    elif k.kind == "config":
        s = {"type": "object", "additionalProperties": False, "properties": {
            key: {"type": "string", "enum": ["0", "1"]} if key in CONFIG_FLAGS
            else {"type": "string", "pattern": "^[0-9]+$"} if key in CONFIG_INTS else {"type": "string"}
            for key in sorted(SESSION_CONFIG_KEYS)}}
    elif k.kind == "dims":
        s = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}}
    elif k.kind == "table":
        s = {"$ref": f"#/$defs/{k.table}"}
    elif k.kind == "tables":
        s = {"type": "array", "items": {"$ref": f"#/$defs/{k.table}"}}
    elif k.kind == "named":
        s = {"type": "object", "additionalProperties": {"$ref": f"#/$defs/{k.table}"}}
    else:  # pragma: no cover - guarded by test_options
        raise ValueError(k.kind)
    s["description"] = k.doc
    if k.default is not None and k.kind not in ("table", "tables", "named"):
        s["default"] = k.default
    return s


def _table_schema(table: str, with_required: bool) -> dict[str, Any]:
    s: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {k.name: _key_schema(k) for k in TABLES[table]},
    }
    req = [k.name for k in TABLES[table] if k.required]
    if with_required and req:
        s["required"] = req
    return s


def json_schema() -> dict[str, Any]:
    # Targets may inherit required keys through `extends`, so the schema cannot require them there.
    defs = {t: _table_schema(t, with_required=t != "target") for t in TABLES}
    from ortbuild.paths import NAME_PATTERN, RESERVED_NAMES  # names become directories under dist/

    names = {"pattern": f"^{NAME_PATTERN}$", "not": {"enum": sorted(RESERVED_NAMES)}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ortbuild targets.toml",
        "type": "object",
        "additionalProperties": False,
        "required": ["project", "models", "targets"],
        "properties": {
            "project": {"$ref": "#/$defs/project"},
            "models": {"type": "object", "additionalProperties": {"$ref": "#/$defs/model"}, "propertyNames": names,
                       "description": "Source models, one table per model name."},
            "targets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/target"},
                        "propertyNames": names, "description": "Hardware targets, one table per target name."},
        },
        "$defs": defs,
    }


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------------------------------- docs

_TITLES = {
    "project": "[project]", "model": "[models.NAME]", "target": "[targets.NAME]",
    "override": "[[targets.NAME.overrides]]", "quantization": "[targets.NAME.quantization]",
    "fp16": "[targets.NAME.fp16]", "int4": "[targets.NAME.int4]", "fusion": "[targets.NAME.fusion]",
    "session": "[targets.NAME.session]",
    "accuracy": "[targets.NAME.accuracy]", "output_accuracy": "[targets.NAME.accuracy.outputs.OUTPUT]",
    "latency": "[targets.NAME.latency]", "faster_than": "[targets.NAME.latency] faster_than",
    "latency_data_set": "[targets.NAME.latency.data_sets.DATA_SET]",
    "size": "[targets.NAME.size]",
}


def _fmt_default(k: Key) -> str:
    if k.required:
        return "required"
    if k.kind in ("table", "tables", "named"):
        return {"table": "see below", "tables": "[]", "named": "{}"}[k.kind]
    if k.default is None:
        return "none"
    return "`" + json.dumps(k.default) + "`"


def reference_markdown() -> str:
    lines = [
        "# targets.toml reference",
        "",
        "Generated from `ortbuild/project/options.py` by `ortbuild schema --write`; do not edit by hand.",
        "The same source drives validation and the JSON Schema (`ortbuild/targets.schema.json`).",
        "",
    ]
    for table in TABLES:
        lines += [f"## `{_TITLES[table]}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for k in TABLES[table]:
            kind = k.kind if not k.choices else " \\| ".join(k.choices)
            doc = k.doc.replace("|", "\\|")
            lines.append(f"| `{k.name}` | {kind} | {_fmt_default(k)} | {doc} |")
        lines.append("")
    lines += [
        "## Allowed session config keys",
        "",
        "Keys accepted in `[targets.NAME.session] config` (found in the onnxruntime 1.31.1 binary):",
        "",
        ", ".join(f"`{k}`" for k in sorted(SESSION_CONFIG_KEYS)),
        "",
        "Reserved (ortbuild sets them from other keys):",
        "",
    ]
    lines += [f"- `{k}`: {why}" for k, why in sorted(RESERVED_CONFIG_KEYS.items())]
    lines += ["", "Values are strings; these must be `\"0\"` or `\"1\"`: "
              + ", ".join(f"`{k}`" for k in sorted(CONFIG_FLAGS)) + ". These must be integers (as strings): "
              + ", ".join(f"`{k}` (at most {v})" for k, v in sorted(CONFIG_INTS.items())) + ".", ""]
    lines += ["## Provider options", "",
              "Checked for these providers (ONNX Runtime accepts any name silently; ortbuild refuses unknown "
              "names and values of the wrong kind). Other providers' options are passed through unchecked.", ""]
    for provider, opts in PROVIDER_OPTIONS.items():
        shown = ", ".join(f"`{n}` ({o.kind}{': ' + '/'.join(o.choices) if o.choices else ''})"
                          for n, o in opts.items()) or "none (use `[targets.NAME.session]`)"
        lines += [f"- **{provider}**: {shown}"]
    from ortbuild.paths import NAME_RULE, RESERVED_NAMES

    lines += ["", "## Names", "", f"Target and model names are {NAME_RULE}; they become directories under `dist/`, "
              f"so path syntax is refused, and so are {', '.join(f'`{n}`' for n in sorted(RESERVED_NAMES))}.", ""]
    return "\n".join(lines)
