"""The typed, frozen form of a loaded targets.toml: the project, its models, its targets and what each
(target, model) job is built with. Each key is declared once, as a `setting()` field here or in
ortbuild.project.sections (ortbuild.project.declare): the key tables, the JSON Schema, the reference docs, the
construction from a validated table and the build key are derived from those fields.
Stdlib + packaging only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import Requirement

from ortbuild.project import generation, kinds, precisions, providers
from ortbuild.project.declare import build_json, derived, setting
from ortbuild.project.generation import Generation, Tokens
from ortbuild.project.kinds import Kind, kind_rule
from ortbuild.project.precisions import (
    Format,
    FormatRule,
    Level,
    Platform,
    PlatformRule,
    Precision,
    PrecisionRule,
)
from ortbuild.project.providers import CustomOps, Provider
from ortbuild.project.sections import (
    Fp16,
    Fusion,
    Int4,
    Latency,
    Memory,
    PrecisionOptions,
    Quantization,
    Session,
    Size,
    TaskEval,
)

EVAL_METRICS = ("accuracy", "f1", "mae")  # built in; any other `metric` is "package.module:function"


@dataclass(frozen=True, kw_only=True)
class EvalSet:
    """[models.NAME.eval]: a labelled evaluation set, read by the `eval` gate (ortbuild.gating.measure.task_eval)
    only: none of it enters the build key (the build never reads it; the gate judges the artifact it finds)."""

    inputs: Path = setting(
        required=True, build="never",
        doc="The evaluation inputs, relative to targets.toml: an .npz keyed by input name whose arrays' first axis "
            "indexes the samples, or a directory of such .npz files (read one at a time, in name order). Read "
            "lazily, a batch at a time. Not in the build key: only the `eval` gate reads it.")
    labels: Path = setting(
        required=True, build="never",
        doc="One label per sample, in the order of `inputs`: an .npy, or an .npz holding one array. Class indices "
            "for `accuracy` and `f1`, targets of the output's shape per sample for `mae`. Not in the build key.")
    metric: str = setting(
        "accuracy", build="never",
        doc="`accuracy` (top-1: the arg-max over the output's last axis equals the label; an integer output of one "
            "value per sample is the class itself), `f1` (macro F1 over the classes in the labels and predictions, "
            "binary included), `mae` (mean absolute error of the output against the label: lower is better), or "
            "a custom metric `\"package.module:function\"` importable from the project's folder or the "
            "environment, called as `function(predictions, labels) -> float` with the output rows of the samples "
            "(higher is better unless the function has `higher_is_better = False`).")
    output: str = setting("", build="never", doc="The output the metric reads; empty: the model's first output.")
    batch: int = setting(
        0, maximum=1 << 20, build="never",
        doc="Samples per run; 0: the artifact's fixed batch dimension where it has one, else 16.")
    max_samples: int = setting(0, maximum=1 << 40, build="never",
                               doc="Judge the first this many samples only; 0: all of them.")


@dataclass(frozen=True, kw_only=True)
class Model:
    """[models.NAME]: a source model and its data (paths resolved against targets.toml's folder)."""

    name: str
    path: Path = setting(required=True, build="never", rebuilds="the build key holds the model's digests",
                         doc="The source ONNX model, relative to targets.toml; or a Hugging Face-format directory "
                             "(config.json, weights, tokenizer.json) of a generative model, built with "
                             "onnxruntime-genai's model builder (docs/generative.md).")
    inputs: Path = setting(
        required=True, build="never", rebuilds="the build key holds their digest",
        doc="Golden inputs, relative to targets.toml: an .npz keyed by input name (one feed), or a "
            "directory in the ONNX layout `test_data_set_N/input_K.pb`. Every artifact must run on them. "
            "For a generative model: a UTF-8 text file of golden prompts, one per line.")
    calibration: Path | None = setting(
        None, build="never", rebuilds="the build key holds their digest where the precision calibrates",
        doc="Calibration data for int8-static, same formats as `inputs`; in an .npz the first axis of "
            "each array indexes the samples. Use realistic data: noise ruins static quantization.")
    description: str = setting("", build="never", doc="Free text.")
    expected: Path | None = setting(  # user-supplied golden outputs: the test's, not the build's
        None, build="never",
        doc="Expected (golden) outputs, relative to targets.toml: an .npz keyed by output name (for one "
            "feed), or the ONNX layout `test_data_set_N/output_K.pb` (e.g. from the training framework). "
            "Without it they are computed from the source model in fp32 on the CPU provider with "
            "optimizations disabled, and stored beside each artifact (`golden/`). `ortbuild init` records the "
            "source's outputs here (`NAME.expected.npz`) with `NAME.expected.json` beside them, naming the golden "
            "inputs they were computed from: while the inputs are those, an artifact that differs fails; with other "
            "inputs the test warns how the outputs moved and compares with the source's instead (`ortbuild init "
            "--refresh-expected` records them again). For a generative model: a UTF-8 "
            "text file of the expected continuation of each prompt, one per line (else the fp32 source's greedy "
            "continuation).")
    custom_ops: tuple[CustomOps, ...] = setting(
        (), kind="strings", build="never", rebuilds="each of its jobs' settings hold the libraries",
        doc="Custom-operator libraries the model needs (its ops outside ONNX's domains): each a pip requirement "
            "pinned with `==` of a Python package whose module's `get_library_path()` gives the library, e.g. "
            "`onnxruntime-extensions==0.15.2`, or the path of a shared library (`.so`, `.dylib`, `.dll`) "
            "relative to targets.toml. nox installs the packages into the target's virtualenv; every session "
            "the build and the tests open registers them; the manifest records each (name, version, sha256) "
            "and the loaders check that sha256 before registering it (a path library ships beside the "
            "artifact). See docs/diagnose.md.")
    heldout: Path | None = setting(
        None, build="never",
        doc="A generative model's held-out text (UTF-8, relative to targets.toml) for the token gate's perplexity "
            "(`[targets.X.tokens] max_ppl_increase`); unset: perplexity is not judged.")
    kind: Kind = derived("onnx", build="never", spelled=kinds.spelled)  # of its `path` (kinds.kind_of)
    eval: EvalSet | None = setting(
        None, table="model_eval", build="never",
        doc="A labelled evaluation set `[models.NAME.eval]` for the `eval` gate, judged against each target's "
            "`[targets.NAME.eval] max_drop` (docs/testing.md, Task accuracy on labelled data).")


@dataclass(frozen=True, kw_only=True)
class Gates:
    """What `ortbuild test` checks an artifact against: the gate keys of a target. Budgets never rebuild."""

    accuracy: Mapping[str, Any] = setting(  # the validated [accuracy] table (rule keys, `outputs`)
        factory=dict, kind="table", table="accuracy", build="never",
        doc="The golden-output test's rule; defaults per precision (fp32: rtol 1e-4, atol 1e-5; fp16: "
            "cosine 0.999; int8/int4: cosine 0.99), over which the target's keys and then "
            "`outputs.NAME` tables apply. A rule follows its precision: a target (or override) whose "
            "precision differs from its parent's (int8-dynamic and int8-static count as one) does not inherit "
            "the parent's rule, only its outputs' `ignore`; `ortbuild plan` says which rule applies. "
            "See docs/testing.md and docs/targets.md.")
    latency: Latency = setting(
        factory=Latency, build="never",
        doc="Latency budgets (percentiles in ms, relative to another target), checked by `ortbuild test`.")
    size: Size = setting(factory=Size, build="never", doc="Size budgets of the artifact, checked by `ortbuild test`.")
    memory: Memory = setting(
        factory=Memory, build="never",
        doc="Peak-memory budget of a fresh process that loads the artifact through its generated Python "
            "loader, checked by `ortbuild test` (docs/testing.md, cold start and peak memory).")
    eval: TaskEval = setting(
        factory=TaskEval, build="never",
        doc="Task-accuracy budget on the model's labelled evaluation set (`[models.NAME.eval]`): the largest "
            "drop from the fp32 source, checked by `ortbuild test` (docs/testing.md, Task accuracy on labelled "
            "data).")
    tokens: Tokens = setting(
        factory=Tokens, build="never",
        doc="The token gate of a generative model: greedy agreement with the fp32 source, next-token logits "
            "along its continuation, perplexity (docs/generative.md).")
    generation: Generation = setting(
        factory=Generation, build="never",
        doc="Generation budgets of a generative model: time to first token, time per output token, tokens per "
            "second and peak memory with the KV cache (docs/generative.md).")
    kind: Kind = derived("onnx", build="never", spelled=kinds.spelled)  # its model's: its gates are its kind's
    # the rules written for another precision that this one does not inherit: "the fp32 rule of cpu-fp32"
    not_inherited: tuple[str, ...] = ()

    def accuracy_rule(self, precision: str | PrecisionRule, output: str) -> dict[str, Any]:
        """The effective rule of one output: precision defaults < target rule < the output's table."""
        rule: dict[str, Any] = dict(precisions.rule(precision).accuracy)
        rule["mismatch_fraction"] = 0.0
        rule.update({k: v for k, v in self.accuracy.items() if k != "outputs"})
        rule.update(self.accuracy.get("outputs", {}).get(output, {}))
        return rule

    @property
    def startup_budgets(self) -> dict[str, float]:
        """The budgets measured in fresh processes (ortbuild.gating.measure.startup), by kind: "cold_start" (ms) and
        "memory" (MiB); empty when neither is set."""
        pairs = (("cold_start", self.latency.cold_start_ms), ("memory", self.memory.peak_mb))
        return {kind: float(b) for kind, b in pairs if b is not None}

    def max_ratio(self, precision: str | PrecisionRule) -> float:
        r = self.size.max_ratio
        return float(r) if r is not None else precisions.rule(precision).max_size_ratio


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What one (target, model) job is built with: the target's overridable keys after overrides. Every key here
    enters the build key (`as_json`) unless declared otherwise."""

    precision: Precision = setting(
        "fp32", doc="fp32 (as is), fp16 (ORT float16 converter), int8-dynamic (`quantize_dynamic`), "
                    "int8-static (`quantize_static`, needs the model's `calibration`), int4-weight "
                    "(`MatMulNBitsQuantizer`, block-wise weight-only).")
    optimization: Level = setting(
        "all", doc="Offline graph-optimization level, applied inside the target's runtime. `basic` is "
                   "portable; `extended` ties the artifact to the providers; `layout` and `all` also tie it "
                   "to the build CPU's SIMD level (NCHWc). Compiling providers (OpenVINO, TensorRT) cannot "
                   "serialize their compiled graph: the artifact then holds the portable basic graph.")
    format: Format = setting(
        "onnx", doc="Artifact format: `onnx`, or `ort` (ORT flatbuffer format, for mobile and minimal builds: each "
                    "artifact ships its `required_operators.config` for a reduced ONNX Runtime build, and the "
                    "target's release bundle one merged config; not with providers that compile ahead of time, "
                    "CoreML allowed). See docs/targets.md, Mobile packages.")
    providers: tuple[Provider, ...] = setting(
        required=True, kind="providers",
        doc="Ordered execution providers. Each entry is a name or a table "
            "`{name = \"...\", options = {...}}` of provider options.")
    quantization: Quantization = setting(factory=Quantization, doc="Options of int8-dynamic and int8-static.")
    fp16: Fp16 = setting(factory=Fp16, doc="Options of fp16.")
    int4: Int4 = setting(factory=Int4, doc="Options of int4-weight.")
    session: Session = setting(
        factory=Session, doc="Session options recorded in the manifest and used by every session the build opens.")
    free_dimensions: Mapping[str, int] = setting(
        factory=dict, kind="dims", doc="Pin symbolic dimensions by name, e.g. `{ batch = 1 }` "
                                       "(`add_free_dimension_override_by_name`).")
    encrypt: bool = setting(
        True, doc="Encrypt the artifact (container format v1, docs/container.md) under the build's encryption "
                  "key. `false` publishes it in plaintext, recorded in the manifest; it is still signed.")
    external_data: bool = setting(
        False, doc="Store the weights in a separate file (`model.onnx.data`, encrypted like the graph); the loaders "
                   "hand it to ONNX Runtime from memory. `false` still writes external data where it is needed: for "
                   "a source that keeps its weights as external data, and where one file would pass protobuf's 2 GB "
                   "limit (the manifest's `artifact.external_data` says why). Format `onnx` only.")
    constant_folding: str = setting(
        "auto", choices=("auto", "on", "off"),
        doc="Constant folding during offline optimization. It can turn weights stored compressed (int8 or "
            "fp16 expanded by Cast/DequantizeLinear/Mul in the graph) into fp32 initializers, up to 4x the "
            "bytes. `auto` optimizes again without it when the artifact grew that way, and says so in the "
            "summary and manifest; `on` keeps ORT's behaviour; `off` always disables it.")
    disabled_optimizers: tuple[str, ...] = setting(
        (), doc="ORT graph optimizers to disable during offline optimization (`disabled_optimizers` of "
                "InferenceSession), e.g. [\"ConstantFolding\"].")
    precision_search: Literal["off", "auto"] = setting(
        "off", build="never",
        doc="`auto`: the precision is a goal, not an order. When the converted artifact fails its accuracy gate "
            "(or gives non-finite or constant outputs), the build runs the precision search (`ortbuild test "
            "--explain`'s) and ships the smallest set kept in float that passes, recorded in `targets.lock` "
            "beside targets.toml; later builds apply the lock without searching. `off`: build as written. It does "
            "not rebuild by itself: what the search keeps in float enters the build key through the settings the "
            "lock lays over. See docs/build-to-the-gates.md.")
    candidates: tuple[Mapping[str, Any], ...] = setting(
        (), kind="tables", table="candidate", build="never",
        doc="Build to the fastest artifact that passes: other precisions (and variants of them) the build may ship "
            "instead of the declared one, e.g. `[\"fp32\", { precision = \"int8-static\", quantization = { "
            "per_channel = true } }]`, each a precision name or a table of `precision` and its options table "
            "(`quantization`, `int4`, `fp16`: laid over the target's key by key). The build makes the declared "
            "artifact and each candidate, judges each by the accuracy gate (with `precision_search = \"auto\"`, "
            "repairing a failing one), times each passing one against fp32 on this machine (paired, interleaved "
            "runs), and ships the fastest, the smallest of those that are as fast; a reduced precision measured "
            "slower than fp32 ships only where fp32 is a candidate. The choice, its ratios and the CPU they were "
            "measured on go to `targets.lock`. It does not rebuild by itself: the candidate chosen enters the build "
            "key through the settings the lock lays over. See docs/build-to-the-gates.md.")
    tune: bool = setting(
        False, build="never",
        doc="The build tunes the session options (`ortbuild tune`) when `targets.lock` has no tuning for the "
            "job: the fastest setting that passes every gate is recorded in the lock and shipped. It does not "
            "rebuild by itself: the session options kept enter the build key through the lock. See "
            "docs/build-to-the-gates.md.")
    # the target's and the model's custom-operator libraries (keys of [targets.X] and [models.X])
    custom_ops: tuple[CustomOps, ...] = derived((), build="when-set")
    fusion: Fusion = setting(  # only when on: the build keys of targets without fusion stay what they were
        factory=Fusion, build="when-set",
        doc="ONNX Runtime's transformer optimizer, run before the precision step: `{ model_type = \"bert\" }` "
            "fuses attention, layer norms, GELU and embeddings into `com.microsoft` ops (Attention, "
            "SkipLayerNormalization, BiasGelu, EmbedLayerNormalization, ...), which tie the artifact to "
            "providers that have those kernels (CPU, CUDA, ROCm). Off by default. See docs/targets.md.")
    gates: Gates | None = field(default=None, compare=False)  # its keys never rebuild: not in as_json()

    def as_json(self) -> dict[str, object]:
        """The settings the build key holds (each key's `build` policy)."""
        return build_json(self)

    @property
    def rule(self) -> PrecisionRule:
        """The rule of this precision: what it needs, how it is judged and converted."""
        return precisions.rule(self.precision)

    @property
    def format_rule(self) -> FormatRule:
        """The rule of this artifact format: its file, what it can hold and ships."""
        return precisions.format_rule(self.format)

    def typed_precision_options(self) -> PrecisionOptions:
        """The typed options of this precision (its options table), or None for fp32."""
        table = self.rule.options_table
        return None if table is None else getattr(self, table)


@dataclass(frozen=True, kw_only=True)
class Target:
    """[targets.NAME]: its target-wide keys, and the settings of each of its models."""

    name: str
    description: str = setting("", build="never", doc="Free text.")
    runtime: str = setting(  # the flavor's pip requirement, e.g. "onnxruntime==1.31.1"
        required=True, kind="requirements", build="never",
        guard="the build refuses an environment whose flavor differs (the build key holds the installed one)",
        doc="pip requirement of the target's ONNX Runtime flavor, e.g. `onnxruntime==1.31.1`, "
            "`onnxruntime-openvino==1.24.1`, `onnxruntime-gpu==1.31.1`; or an array of the flavor and the "
            "plugin execution providers it loads, e.g. `[\"onnxruntime==1.31.1\", "
            "\"onnxruntime-ep-openvino==1.8.1\"]` (one flavor per target). nox installs them into the "
            "virtualenv of those requirements (targets that name the same share one); `ortbuild build` "
            "refuses to build a target in an environment whose flavor, plugins or versions do not match.")
    custom_ops: tuple[CustomOps, ...] = setting(  # of the target and of all its models
        (), kind="strings", build="never", rebuilds="each of its jobs' settings hold the libraries",
        doc="Custom-operator libraries every model of this target needs, added to each model's `custom_ops` "
            "(same forms).")
    require: bool = setting(
        False, build="never",
        doc="`ortbuild test` fails (instead of skipping) when this target cannot run here, e.g. on CI "
            "runners that have its hardware. Same as `--require`.")
    runner: tuple[str, ...] = setting(  # CI runner labels (`ortbuild matrix`)
        ("ubuntu-latest",), build="never",
        doc="CI runner labels of the machine that builds and tests this target (`ortbuild matrix` puts them "
            "in `runs-on`), e.g. [\"self-hosted\", \"linux\", \"gpu\"]. A `linux-aarch64` target without "
            "its own labels gets [\"ubuntu-24.04-arm\"] (GitHub's ARM runner). See docs/ci.md.")
    platform: Platform = setting(
        "native", build="never",
        doc="The platform the artifact is for: `native` (the machine that runs the tests), `linux-x86_64`, "
            "`linux-aarch64`, or an x86-64 level: `x86-64-v2` (SSE4.2), `x86-64-v3` (AVX2), `x86-64-v4` "
            "(AVX-512), `x86-64-v4-vnni` (AVX-512 with VNNI). Where it is not this machine's, `ortbuild test` "
            "runs the golden gate through the generated Python loader under emulation (qemu-user: aarch64 on "
            "that platform's ONNX Runtime wheel, set up once and cached; an x86-64 level older than this CPU's "
            "on qemu's model of that level's CPU) and SKIPS the latency, cold-start and memory gates "
            "(emulation says nothing about the device's speed); on a CPU of that platform or level every gate "
            "runs; on an older x86-64 CPU, or a level qemu cannot emulate (AVX-512), the target is SKIPPED "
            "with the reason (docs/targets.md#platforms). Such a target's `optimization` is `basic` or "
            "`extended` (`layout`/`all` tie it to the build CPU).")
    models: tuple[str, ...] = setting(  # resolved model names, in [models] order
        ("*",), build="never", doc="Glob patterns (fnmatch) of the model names this applies to.")
    settings: Mapping[str, Settings]  # per model name
    plugins: tuple[str, ...] = ()    # pip requirements of the plugin EPs the flavor loads (providers.PLUGINS)

    kind: Kind = "onnx"              # the kind of its models (a target builds one kind)

    @property
    def requirements(self) -> tuple[str, ...]:
        """Everything the target's environment installs: the flavor, its plugin EPs, its custom-op packages, and what
        its kind of model needs (a generative model's: the model builder and onnxruntime-genai)."""
        return (self.runtime, *self.plugins, *(c.spec for c in self.custom_ops if c.package),
                *generation.requirements_for(self.runtime, kind_rule(self.kind).requirements))

    def session(self, kind: str) -> str:
        """The nox session of this target for `kind` (build, test, release): its kind of model's (KindRule.session)."""
        return kind_rule(self.kind).session(kind, self.name)

    @property
    def runtime_text(self) -> str:
        """The requirements as one line (messages, tables): `pip install` takes it as is."""
        return " ".join(self.requirements)

    def plugin_for(self, provider: str) -> providers.PluginEP | None:
        """The plugin EP of this target that provides `provider`, if it comes from one."""
        for req in self.plugins:
            plugin = providers.PLUGINS[Requirement(req).name.lower()]
            if plugin.provider == provider:
                return plugin
        return None

    @property
    def providers(self) -> tuple[Provider, ...]:
        """The target-level providers (the first model's, which equal the target's unless overridden)."""
        return next(iter(self.settings.values())).providers

    @property
    def tags(self) -> list[str]:
        """nox tags: primary provider short name, every precision it builds, and its platform unless native
        (`nox -t linux-aarch64`)."""
        ep = self.providers[0].name.removesuffix("ExecutionProvider").lower()
        precs = {s.precision for s in self.settings.values()}
        emulated = [] if self.platform_rule.native else [self.platform]
        tag = kind_rule(self.kind).tag
        return [ep, *sorted(precs | {p.split("-")[0] for p in precs}), *emulated, *([tag] if tag else [])]

    @property
    def platform_rule(self) -> PlatformRule:
        """The rule of this target's platform: where it runs, how it is emulated here."""
        return precisions.platform_rule(self.platform)


@dataclass(frozen=True, kw_only=True)
class Project:
    file: Path
    name: str = setting(required=True, build="never", doc="Project name, recorded in every manifest.")
    version: str = setting(required=True, build="never", doc="Project version, recorded in every manifest.")
    description: str = setting("", build="never", doc="Free text.")
    models: Mapping[str, Model]
    targets: Mapping[str, Target]
    epoch: int = setting(  # rollback counter: signed into every manifest, loaders pin a minimum
        0, build="never", rebuilds="the build key holds it (sealing)",
        doc="Rollback counter, signed into every manifest: raise it when an older artifact must no longer "
            "load. Each generated loader refuses an artifact whose epoch is below the one it was generated "
            "with, and `release` an artifact below it; lowering it below the epoch of the artifacts in dist/ "
            "is an error unless `--allow-epoch-decrease` (docs/container.md, rollback).")
    cache: str = setting(
        "", build="never",
        doc="Shared build cache: oci://host[:port]/repository or a directory (relative to targets.toml). Before "
            "building a job, its build key is looked up there; a hit is verified with the signing key and used, "
            "a build is stored there after. Sealed artifacts only. --cache and $ORTBUILD_CACHE take precedence, "
            "--no-cache turns it off (docs/cache.md).")

    @property
    def root(self) -> Path:
        return self.file.parent
