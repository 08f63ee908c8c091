"""The sub-tables of a target, each key declared once (ortbuild.project.declare): the precision options
(`quantization`, `fp16`, `int4`), `fusion`, `session`, and the budgets `latency`, `size`, `memory`,
`eval`.
Stdlib-only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from ortbuild.project.declare import build, plain, setting
from ortbuild.project.precisions import OptionsTable

# The model types of ONNX Runtime's transformer optimizer (`fusion.model_type`): the keys of
# onnxruntime.transformers.optimizer.MODEL_TYPES in onnxruntime 1.31.1 (tests/test_fusion.py compares them with
# the installed module), in its order. "off" (the default) runs no fusion.
FUSION_OFF = "off"
FUSION_MODEL_TYPES = ("bart", "bert", "bert_tf", "bert_keras", "clip", "conformer", "gpt2", "gpt2_tf", "gpt_neox",
                      "phi", "qwen3", "sam2", "swin", "tnlr", "t5", "unet", "vae", "vit", "mmdit")
# The types whose num_heads and hidden_size the optimizer infers from the graph (0); the others need both
# (onnxruntime.transformers.optimizer.optimize_by_fusion warns and fuses with wrong sizes otherwise).
FUSION_INFERS_SIZES = frozenset({"bert", "t5", "swin", "unet", "vae", "clip", "sam2", "mmdit"})
MS_MAX = 3_600_000                   # a latency budget: at most an hour


@dataclass(frozen=True)
class Quantization:
    """[targets.X.quantization]: options of int8-dynamic and int8-static."""

    format: Literal["qdq", "qoperator"] = setting(
        "qdq", doc="int8-static graph format. QDQ is ORT's recommendation for CPU and the only one TensorRT "
                   "takes. int8-dynamic is always QOperator-style (DynamicQuantizeLinear + MatMulInteger).")
    per_channel: bool = setting(True, doc="Per-channel weight scales.")
    weight_type: Literal["int8", "uint8"] = setting(
        "int8", doc="Weight type. S8 weights are the fast path on x86 (U8 weights gave no speed-up).")
    activation_type: Literal["int8", "uint8"] = setting(
        "uint8", doc="Activation type of int8-static (U8 activations / S8 weights is ORT's x86 advice).")
    reduce_range: bool = setting(False, doc="7-bit weights; can help accuracy on CPUs without VNNI.")
    op_types: tuple[str, ...] = setting(
        (), doc="Op types to quantize, e.g. [\"MatMul\"]. Empty: every type the quantizer supports.")
    exclude_nodes: tuple[str, ...] = setting((), doc="Node names to keep in float.")
    calibration_method: Literal["minmax", "entropy", "percentile", "distribution"] = setting(
        "minmax", doc="int8-static calibration.")
    preprocess: bool = setting(
        True, doc="Run `quant_pre_process` (symbolic shape inference + basic optimization) first.")
    recipe: Literal["auto", "none"] = setting(
        "auto", build="when-set",
        doc="int8-static's starting point. `auto`: a graph with attention gets the transformer recipe (MatMul and "
            "Gemm quantized, or `op_types`; their outputs and the attention's MatMuls of two activations left in "
            "float: docs/targets.md#int8-static-of-transformers); other graphs, ORT's defaults. `none`: "
            "`quantize_static`'s defaults for every graph.")


@dataclass(frozen=True)
class Fp16:
    """[targets.X.fp16]: options of fp16."""

    keep_io_types: bool = setting(True, doc="Keep float32 graph inputs and outputs (Casts are inserted inside).")
    op_block_list: tuple[str, ...] = setting(
        (), doc="Op types kept in float32, added to the converter's default block list.")
    node_block_list: tuple[str, ...] = setting((), doc="Node names kept in float32.")


@dataclass(frozen=True)
class Int4:
    """[targets.X.int4]: options of int4-weight."""

    block_size: int = setting(32, maximum=256, doc="Quantization block size (16, 32, 64, 128 or 256).")
    symmetric: bool = setting(True, doc="Symmetric (no zero point) blocks.")
    accuracy_level: int = setting(
        0, maximum=4, doc="MatMulNBits compute type: 0 = runtime default, 1 fp32, 2 fp16, 3 bf16, 4 int8.")
    exclude_nodes: tuple[str, ...] = setting((), doc="Node names to keep in float.")


@dataclass(frozen=True)
class Fusion:
    """[targets.X.fusion]: ONNX Runtime's transformer optimizer, run before the precision step (steps/fusion.py)."""

    model_type: str = setting(
        FUSION_OFF, choices=(FUSION_OFF, *FUSION_MODEL_TYPES),
        doc="`off`, or the model type of ONNX Runtime's transformer optimizer "
            "(`onnxruntime.transformers.optimizer.optimize_model`, its Python fusions: `opt_level = 0`; ORT's "
            "own graph optimizations run later, at the target's `optimization` level): `bert` for BERT-like "
            "encoders (MiniLM, RoBERTa, DistilBERT), `gpt2`, `t5`, `vit`, ... A fusion that fuses nothing is "
            "noted and the source is kept. Not with compiling providers (OpenVINO, TensorRT, ...); skipped, "
            "with a note, in portable builds.")
    num_heads: int = setting(
        0, maximum=4096, doc="Attention heads; 0: inferred from the graph (bert, t5, swin, unet, vae, clip, sam2, "
                             "mmdit). The other model types need it and `hidden_size`.")
    hidden_size: int = setting(
        0, maximum=1 << 20, doc="Hidden size; 0: inferred from the graph, like `num_heads` (give both or neither).")

    @property
    def enabled(self) -> bool:
        return self.model_type != FUSION_OFF


@dataclass(frozen=True)
class Session:
    """[targets.X.session]: the session options every session of the build (and the loaders) opens with."""

    intra_op_num_threads: int = setting(0, maximum=1024, doc="0 = ORT's default (physical cores).")
    inter_op_num_threads: int = setting(0, maximum=1024, doc="Used only with execution_mode parallel.")
    execution_mode: Literal["sequential", "parallel"] = setting("sequential", doc="ORT execution mode.")
    enable_mem_pattern: bool = setting(True, doc="Memory pattern planning.")
    enable_cpu_mem_arena: bool = setting(True, doc="CPU arena; off returns memory after bursts of varying shapes.")
    use_deterministic_compute: bool = setting(False, doc="Deterministic kernels.")
    config: Mapping[str, str] = setting(
        factory=dict, kind="config",
        doc="Session config entries (`add_session_config_entry`), e.g. "
            "`{ \"session.intra_op.allow_spinning\" = \"0\" }`. Keys are checked against an allowlist "
            "of the keys in onnxruntime 1.31.1, because ORT accepts misspelled keys silently.")

    def as_json(self) -> dict[str, object]:
        """All of the options, as the manifest records them."""
        out = plain(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True)
class FasterThan:
    target: str = setting(required=True, build="never", doc="The target to compare with (same model).")
    ratio: float = setting(
        required=True, maximum=1000, build="never",
        doc="Its median latency divided by this target's must be at least this (0.8: at most 1.25x slower).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "ratio", float(self.ratio))  # TOML may write it as an integer


@dataclass(frozen=True)
class Offline:
    """[targets.X.latency.offline]: throughput at a batch, as MLPerf Offline (ortbuild.gating.measure.offline)."""

    batch: int = setting(
        1, maximum=65_536, build="never",
        doc="Samples per `run` call: the golden inputs stacked along the first axis where the model's first axis "
            "is dynamic, else single-sample runs, at most `workers` at a time (the report says which).")
    min_samples_per_second: float | None = setting(
        None, maximum=1e9, build="never",
        doc="Budget: the median samples per second over fixed windows of the run is at least this. None: "
            "measured and reported, not judged.")
    min_seconds: float = setting(
        10.0, maximum=3600, build="never",
        doc="The shortest run (MLPerf asks 600 s; a CI machine cannot): 20 windows of `window_seconds`, the "
            "fewest whose median a 0.99 bound can judge with every look of the plan accounted for. Undecided at "
            "the minimum, sampling goes on to twice as long.")
    window_seconds: float = setting(
        0.5, maximum=600, build="never",
        doc="The length of the windows whose rates the verdict judges (each run call's samples are spread over "
            "the windows its time overlaps): long enough to hold several calls, short enough for 20 in a run.")
    workers: int = setting(
        0, maximum=1024, build="never",
        doc="Concurrent `run` calls on the one session (stacked batches, or single samples where the batch cannot "
            "be stacked: never more than `batch`); 0: the number of CPUs.")


@dataclass(frozen=True)
class Server:
    """[targets.X.latency.server]: a latency percentile at a query rate, as MLPerf Server
    (ortbuild.gating.measure.server)."""

    qps: float = setting(
        0.0, maximum=1e6, build="never",
        doc="Required (above 0; may be inherited through `extends`). Queries per second: Poisson arrivals at "
            "this rate from a fixed seed, queued to a pool of concurrent "
            "`run` calls on one session; each query's latency is measured from its scheduled arrival (queueing "
            "counts, as in MLPerf LoadGen).")
    p99_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                   doc="Budget of the 99th percentile query latency at `qps`, in ms.")
    p90_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                   doc="Budget of the 90th percentile query latency at `qps`, in ms.")
    min_seconds: float = setting(
        10.0, maximum=3600, build="never",
        doc="The shortest run before a PASS (MLPerf asks 600 s and 270336 queries; a CI machine cannot): long "
            "enough for the queue of a model of up to ~10 ms per run to settle at 90% utilisation. A FAIL may stop "
            "earlier. Besides, a PASS needs the queries that can bound the percentile (528 for p99 at 0.99).")
    min_queries: int = setting(
        0, maximum=10_000_000, build="never",
        doc="The fewest queries before a PASS (0: what min_seconds at `qps` gives, and at least what bounds the "
            "percentile); undecided there, the run goes on to 1.5x the queries that can bound the percentile.")
    seed: int = setting(0, maximum=2**31 - 1, build="never",
                        doc="Seed of the arrival times (numpy default_rng(seed).exponential): the same schedule "
                            "every run, so two artifacts meet the same load.")
    workers: int = setting(
        0, maximum=1024, build="never",
        doc="Concurrent `run` calls on the one session (ONNX Runtime's run releases the GIL and is thread-safe); "
            "0: the number of CPUs.")
    peak_precision: float = setting(
        0.1, maximum=1, build="never",
        doc="`ortbuild test --find-peak`: the bisection stops when the highest passing and the lowest failing QPS "
            "are within this fraction of each other.")


@dataclass(frozen=True)
class MultiStream:
    """[targets.X.latency.multi_stream]: several streams at once, as MLPerf MultiStream
    (ortbuild.gating.measure.multistream)."""

    streams: int = setting(
        0, maximum=1024, build="never",
        doc="Required (at least 1; may be inherited through `extends`). Samples per query, run concurrently on "
            "one session; the next query is issued when the last one "
            "completes, and a query's latency is that of its slowest sample.")
    p99_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                   doc="Budget of the 99th percentile query latency, in ms.")
    min_seconds: float = setting(
        10.0, maximum=3600, build="never",
        doc="The shortest run before a PASS (MLPerf asks 600 s and 270336 queries; a CI machine cannot); besides, "
            "a PASS needs the queries that can bound p99 (528 at 0.99). A FAIL may stop earlier.")
    min_queries: int = setting(
        0, maximum=10_000_000, build="never",
        doc="The fewest queries before a PASS (0: the fewest that can bound the percentile); undecided there, "
            "the run goes on to 1.5x that.")


ScenarioKind = Literal["offline", "server", "multi_stream"]
# the load scenarios: [targets.X.latency.KIND] and [targets.X.latency.data_sets.NAME.KIND] (their gates:
# ortbuild.gating.measure.offline, server, multistream)
SCENARIOS: dict[str, type[Offline | Server | MultiStream]] = {
    "offline": Offline, "server": Server, "multi_stream": MultiStream}


@dataclass(frozen=True)
class Latency:
    """[targets.X.latency]: budgets and the sample plan of the latency test. Budgets never rebuild."""

    p50_ms: float | None = setting(None, maximum=MS_MAX, build="never", doc="Budget of the median latency, in ms.")
    p90_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                   doc="Budget of the 90th percentile latency, in ms.")
    p99_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                   doc="Budget of the 99th percentile latency, in ms.")
    # median of import + load + first run in fresh processes (gating.startup)
    cold_start_ms: float | None = setting(
        None, maximum=MS_MAX, build="never",
        doc="Budget of the median cold start, in ms: in a fresh Python process, importing the generated loader "
            "(and onnxruntime with it), `load()` (verify, decrypt, session creation) and the first run on the "
            "first golden data set, measured inside the process. Judged over fresh processes (the first look "
            "at 8, then 16 and 32) at `confidence`; see docs/testing.md.")
    faster_than: FasterThan | None = setting(
        None, build="never", inherited=False,
        doc="A relative budget measured in the same run, interleaved: `{ target = \"cpu-fp32\", ratio = "
            "1.5 }` means this target's median latency times 1.5 is at most that target's (same model). "
            "Holds across machines of different speed. The other target must run in this runtime. "
            "Not inherited through `extends`.")
    # golden data set name -> its budgets (p50_ms, ...) over the ones above, and its scenario tables (offline, ...)
    # over the target's: the tables as written, read through budgets() and scenario()
    data_sets: Mapping[str, Mapping[str, Any]] = setting(
        factory=dict, kind="named", table="latency_data_set", build="never",
        doc="Budgets of one golden data set `[targets.X.latency.data_sets.test_data_set_N]` (the model's "
            "`inputs` directory holds one `test_data_set_N/` per shape), over the budgets above key by key, and "
            "its load scenarios (`[targets.X.latency.data_sets.test_data_set_N.server]`, ...) over the target's. "
            "Every data set is timed; a name no model of the target has is an error.")
    confidence: float = setting(
        0.99, maximum=0.999999, build="never",
        doc="Confidence of every verdict (distribution-free binomial bounds on the percentile), every look "
            "of the sequential plan accounted for.")
    min_samples: int = setting(
        0, maximum=1_000_000, build="never",
        doc="Samples taken before the first look (no verdict stops sampling earlier); with a budget still "
            "undecided, sampling goes on to at least this many. 0: the first look at 20 samples, and "
            "undecided budgets go on to at least 100 and 1.5x the fewest samples that can bound the tightest "
            "budgeted percentile (44 for p90, 459 for p99 at 0.99). With no budget, the runs taken (0: a brief "
            "measurement, at most 50 runs or 1 s).")
    min_seconds: float = setting(
        1.0, maximum=3600, build="never",
        doc="With a budget still undecided, sampling lasts at least this long; a decided verdict stops it at "
            "the next look. Without a budget it is not waited for (a brief measurement: see `min_samples`).")
    warmup_runs: int = setting(
        5, maximum=100_000, build="never",
        doc="Untimed runs after the first one (session creation and the first run are reported apart); with no "
            "budget, at most 1 s of them.")
    offline: Offline | None = setting(
        None, build="never", table="latency_offline",
        doc="Throughput at a batch (MLPerf Offline), judged on every golden data set (a data set's own "
            "`data_sets.NAME.offline` over it key by key): see docs/testing.md.")
    server: Server | None = setting(
        None, build="never", table="latency_server",
        doc="A latency percentile at a Poisson query rate (MLPerf Server), judged on every golden data set (a "
            "data set's own `data_sets.NAME.server` over it key by key); "
            "`ortbuild test --find-peak` searches the highest rate that meets it: see docs/testing.md.")
    multi_stream: MultiStream | None = setting(
        None, build="never", table="latency_multi_stream",
        doc="Several concurrent streams (MLPerf MultiStream), judged on every golden data set (a data set's own "
            "`data_sets.NAME.multi_stream` over it key by key): see docs/testing.md.")
    retry_wait_seconds: float = setting(
        30.0, maximum=3600, build="never",
        doc="A FAIL measured under load (more runnable threads than CPUs) or drift is measured again once "
            "the load has fallen, after waiting at most this long (0: at once); still under load, it is "
            "INCONCLUSIVE.")

    def budgets(self, data_set: str | None = None) -> dict[float, float]:
        """{percentile (0-1): budget in ms} of the percentiles that have one (on `data_set`: its own budgets
        over the target's, key by key)."""
        own = self.data_sets.get(data_set, {}) if data_set is not None else {}
        pairs = ((0.5, own.get("p50_ms", self.p50_ms)), (0.9, own.get("p90_ms", self.p90_ms)),
                 (0.99, own.get("p99_ms", self.p99_ms)))
        return {p: float(b) for p, b in pairs if b is not None}

    @overload
    def scenario(self, kind: Literal["offline"], data_set: str | None = None) -> Offline | None: ...
    @overload
    def scenario(self, kind: Literal["server"], data_set: str | None = None) -> Server | None: ...
    @overload
    def scenario(self, kind: Literal["multi_stream"], data_set: str | None = None) -> MultiStream | None: ...

    def scenario(self, kind: ScenarioKind, data_set: str | None = None) -> Offline | Server | MultiStream | None:
        """The load scenario `kind` on `data_set`: its own `data_sets.NAME.KIND` table over the target's, key by key
        (its own alone where the target has none); the target's where the data set has none; None where neither
        declares it (the scenario does not run on that data set)."""
        base: Offline | Server | MultiStream | None = getattr(self, kind)
        own = self.data_sets.get(data_set, {}).get(kind) if data_set is not None else None
        if own is None:
            return base
        if base is None:
            return build(SCENARIOS[kind], own)
        return dataclasses.replace(base, **own)

    def declares(self, kind: ScenarioKind) -> bool:
        """Whether the load scenario `kind` runs on any data set: the target's table, or a data set's."""
        return getattr(self, kind) is not None or any(kind in own for own in self.data_sets.values())


@dataclass(frozen=True)
class Size:
    max_ratio: float | None = setting(
        None, maximum=1000, build="never",
        doc="Largest artifact size / source size (all files). Default 1.1 for fp32, 1.0 for the reduced "
            "precisions: an artifact bigger than its source is usually folded constants. 4 KB are allowed on top "
            "(the container header and graph metadata of very small models).")
    max_mb: float | None = setting(None, maximum=1 << 20, build="never",
                                   doc="Largest artifact size in MiB (all files).")


@dataclass(frozen=True)
class Memory:
    """[targets.X.memory]: the peak RSS budget of a fresh process that loads and runs the artifact."""

    peak_mb: float | None = setting(
        None, maximum=1 << 20, build="never",
        doc="Budget of the median peak resident memory (RSS high-water mark, VmHWM), in MiB, of a fresh Python "
            "process that imports the generated loader, loads the artifact and runs the first golden data set "
            "three times. Measured in the same fresh processes as `latency.cold_start_ms`, at the target's "
            "`latency.confidence`.")


@dataclass(frozen=True)
class TaskEval:
    """[targets.X.eval]: the task-accuracy budget of the models' labelled evaluation sets ([models.X.eval]), judged
    by the `eval` gate (ortbuild.gating.measure.task_eval). Budgets never rebuild."""

    max_drop: float | None = setting(
        None, maximum=1e9, build="never",
        doc="The largest allowed drop of the model's task metric (`[models.X.eval] metric`) from the fp32 source "
            "model's on the same samples, in the metric's units: 0.01 is one point of accuracy or F1; for `mae` "
            "(lower is better) the drop is the increase of the error. PASS when the drop's upper bound at "
            "`confidence` is at most this, FAIL when its lower bound is above it, else INCONCLUSIVE (with how "
            "many samples would probably decide). Unset: no eval gate. Every model of the target it applies to "
            "needs a `[models.X.eval]` (limit it with `[[targets.X.overrides]]`). See docs/testing.md, Task "
            "accuracy on labelled data.")
    confidence: float = setting(
        0.95, maximum=0.999999, build="never",
        doc="Confidence of each one-sided bound of the drop (from 0.5): an exact paired bound from the discordant "
            "counts for `accuracy`, a paired bootstrap (2000 resamples, fixed seed) for the other metrics.")

    def __post_init__(self) -> None:
        if self.max_drop is not None:
            object.__setattr__(self, "max_drop", float(self.max_drop))  # TOML may write it as an integer
        object.__setattr__(self, "confidence", float(self.confidence))


PrecisionOptions = Quantization | Fp16 | Int4 | None
# the typed options of each precision options table (PrecisionRule.options_table)
OPTIONS_TYPES: dict[OptionsTable, type[Quantization] | type[Fp16] | type[Int4]] = {
    "quantization": Quantization, "fp16": Fp16, "int4": Int4}


def as_plain(settings: Quantization | Fp16 | Int4 | Fusion) -> dict[str, object]:
    """The JSON form of typed sub-settings (tuples become lists), as build keys and manifests record it."""
    out = plain(settings)
    assert isinstance(out, dict)
    return out
