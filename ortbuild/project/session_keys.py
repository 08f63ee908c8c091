"""Session config keys of ONNX Runtime that a target may set, their kinds, and those ortbuild reserves.

Stdlib-only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

import re

INT_MAX = 2**31 - 1       # what ONNX Runtime's int options take
NUMBER_MAX = 1e12         # numbers are finite: TOML's inf and nan are refused

# Session config keys found in the onnxruntime 1.31.1 binary (../shared/research/ort.md, appendix B).
# ORT accepts misspelled keys silently, so ortbuild refuses anything not listed here (SESSION_CONFIG_KEYS below:
# these less the keys that touch files).
ORT_CONFIG_KEYS = frozenset({
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
MAX_CONFIG_VALUE = 8192   # characters: ORT refuses a longer value when the session is made ("Config value is longer")

_DUMP = ("dumps the compiled model, its engine or its weights as plaintext files; ortbuild compiles EPContext "
         "artifacts itself, in memory, and ships them inside the encrypted artifact")
# Session config keys that make ONNX Runtime write, read or dump files (from onnxruntime_session_options_config_keys.h
# of 1.31 and its docs: every key whose value is a path, or that writes a file on its own). A key that names a path
# would let targets.toml, a lock entry or a signed manifest make every build, test and deployed app read or overwrite
# that file; they are not options. Where an artifact needs one (EPContext compilation), ortbuild sets it in memory.
FILE_CONFIG_KEYS: dict[str, str] = {
    "session.collect_node_memory_stats_to_file": "ONNX Runtime creates or truncates that path and writes a CSV on "
                                                 "the first run, in every build, test and app that opens the artifact",
    "session.node_partition_config_file": "ONNX Runtime reads any path it names",
    "session.model_external_initializers_file_folder_path": "ONNX Runtime reads external data from that folder; "
                                                            "ortbuild passes an artifact's weights in memory",
    "session.debug_layout_transformation": "writes post_layout_transform_step_N.onnx (the plaintext model) into the "
                                           "working directory",
    "ep.context_enable": _DUMP, "ep.context_file_path": _DUMP, "ep.context_embed_mode": _DUMP,
    "ep.context_model_external_initializers_file_name": _DUMP, "ep.enable_weightless": _DUMP,
}
# session.resource_cuda_partitioning_settings is "limit in KB,file name": the limit is an option, the file (read
# beside the model) is not
PARTITIONING = "session.resource_cuda_partitioning_settings"
SESSION_CONFIG_KEYS = ORT_CONFIG_KEYS - FILE_CONFIG_KEYS.keys()
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



def config_value_problem(key: str, value: str) -> str | None:
    """Why `value` is not valid for session config `key`, by the key's kind, or None."""
    if len(value) > MAX_CONFIG_VALUE:
        return f"is {len(value)} characters long; ONNX Runtime takes at most {MAX_CONFIG_VALUE}"
    if key == PARTITIONING and not re.fullmatch(r"[0-9]{0,15},", value):
        return (f"must be \"LIMIT_KB,\" (a memory limit, the file part empty), got {value!r}: the file part names a "
                "file ONNX Runtime reads beside the model, which ortbuild does not ship")
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
