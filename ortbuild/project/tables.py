"""The keys of every targets.toml table: names, kinds, defaults and docs (the spec validation, the JSON Schema
and the reference docs are generated from). Stdlib-only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ortbuild.project.precisions import FORMATS, LEVELS, PLATFORMS, PRECISIONS

# The model types of ONNX Runtime's transformer optimizer (`fusion.model_type`): the keys of
# onnxruntime.transformers.optimizer.MODEL_TYPES in onnxruntime 1.31.1 (tests/test_fusion.py compares them with
# the installed module), in its order. "off" (the default) runs no fusion.
FUSION_OFF = "off"
FUSION_MODEL_TYPES = ("bart", "bert", "bert_tf", "bert_keras", "clip", "conformer", "gpt2", "gpt2_tf", "gpt_neox",
                      "phi", "qwen3", "sam2", "swin", "tnlr", "t5", "unet", "vae", "vit", "mmdit")
# The types whose num_heads and hidden_size the optimizer infers from the graph (0); the others need both
# (onnxruntime.transformers.optimizer.optimize_by_fusion warns and fuses with wrong sizes otherwise).
FUSION_INFERS_SIZES = frozenset({"bert", "t5", "swin", "unet", "vae", "clip", "sam2", "mmdit"})


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
                "with, and `release` an artifact below it; lowering it below the epoch of the artifacts in dist/ "
                "is an error unless `--allow-epoch-decrease` (docs/container.md, rollback)."),
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
            doc="Artifact format: `onnx`, or `ort` (ORT flatbuffer format, for mobile and minimal builds: each "
                "artifact ships its `required_operators.config` for a reduced ONNX Runtime build, and the target's "
                "release bundle one merged config; not with providers that compile ahead of time, CoreML allowed). "
                "See docs/targets.md, Mobile packages."),
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
                "in `runs-on`), e.g. [\"self-hosted\", \"linux\", \"gpu\"]. A `linux-aarch64` target without "
                "its own labels gets [\"ubuntu-24.04-arm\"] (GitHub's ARM runner). See docs/ci.md."),
        Key(name="platform", kind="string", default="native", choices=PLATFORMS,
            doc="The platform the artifact is for: `native` (the machine that runs the tests), `linux-x86_64` or "
                "`linux-aarch64`. Where it is not this machine's, `ortbuild test` runs the golden gate through the "
                "generated Python loader on that platform's ONNX Runtime wheel under emulation (qemu-user; set "
                "up once and cached, docs/targets.md) and SKIPS the latency, cold-start and memory gates (emulation "
                "says nothing about the device's speed); on a runner of that platform every gate runs. Such a "
                "target's `optimization` is `basic` or `extended` (`layout`/`all` tie it to the build CPU)."),
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
        Key(name="memory", kind="table", table="memory", default={},
            doc="Peak-memory budget of a fresh process that loads the artifact through its generated Python "
                "loader, checked by `ortbuild test` (docs/testing.md, cold start and peak memory)."),
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
                "accuracy, latency, size, memory. Later matches win; tables merge key by key."),
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
        Key(name="cold_start_ms", kind="number", default=None, maximum=3_600_000,
            doc="Budget of the median cold start, in ms: in a fresh Python process, importing the generated loader "
                "(and onnxruntime with it), `load()` (verify, decrypt, session creation) and the first run on the "
                "first golden data set, measured inside the process. Judged over fresh processes (the first look "
                "at 8, then 16 and 32) at `confidence`; see docs/testing.md."),
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
    "memory": (
        Key(name="peak_mb", kind="number", default=None, maximum=1 << 20,
            doc="Budget of the median peak resident memory (RSS high-water mark, VmHWM), in MiB, of a fresh Python "
                "process that imports the generated loader, loads the artifact and runs the first golden data set "
                "three times. Measured in the same fresh processes as `latency.cold_start_ms`, at the target's "
                "`latency.confidence`."),
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
    "disabled_optimizers", "accuracy", "latency", "size", "memory")
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
