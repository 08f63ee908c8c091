"""The typed, frozen form of a loaded targets.toml: the project, its models, its targets and what each
(target, model) job is built with. Stdlib + packaging only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from ortbuild.project import precisions, providers
from ortbuild.project.precisions import Format, Level, OptionsTable, Precision, PrecisionRule
from ortbuild.project.tables import FUSION_OFF


@dataclass(frozen=True)
class Provider:
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
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


@dataclass(frozen=True)
class Model:
    name: str
    path: Path
    inputs: Path
    calibration: Path | None
    description: str = ""
    expected: Path | None = None     # user-supplied golden outputs
    custom_ops: tuple[CustomOps, ...] = ()


@dataclass(frozen=True)
class Quantization:
    """[targets.X.quantization]: options of int8-dynamic and int8-static."""

    format: str
    per_channel: bool
    weight_type: str
    activation_type: str
    reduce_range: bool
    op_types: tuple[str, ...]
    exclude_nodes: tuple[str, ...]
    calibration_method: str
    preprocess: bool


@dataclass(frozen=True)
class Fp16:
    """[targets.X.fp16]: options of fp16."""

    keep_io_types: bool
    op_block_list: tuple[str, ...]
    node_block_list: tuple[str, ...]


@dataclass(frozen=True)
class Int4:
    """[targets.X.int4]: options of int4-weight."""

    block_size: int
    symmetric: bool
    accuracy_level: int
    exclude_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Fusion:
    """[targets.X.fusion]: ONNX Runtime's transformer optimizer, run before the precision step (steps/fusion.py)."""

    model_type: str = FUSION_OFF
    num_heads: int = 0               # 0: inferred from the graph
    hidden_size: int = 0

    @property
    def enabled(self) -> bool:
        return self.model_type != FUSION_OFF


@dataclass(frozen=True)
class Session:
    """[targets.X.session]: the session options every session of the build (and the loaders) opens with."""

    intra_op_num_threads: int
    inter_op_num_threads: int
    execution_mode: str
    enable_mem_pattern: bool
    enable_cpu_mem_arena: bool
    use_deterministic_compute: bool
    config: Mapping[str, str]

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "config": dict(self.config)}


@dataclass(frozen=True)
class FasterThan:
    target: str
    ratio: float


@dataclass(frozen=True)
class Latency:
    """[targets.X.latency]: budgets and the sample plan of the latency test."""

    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    faster_than: FasterThan | None
    confidence: float
    min_samples: int
    min_seconds: float
    warmup_runs: int
    retry_wait_seconds: float
    data_sets: Mapping[str, Mapping[str, float]]  # golden data set name -> its budgets, over the ones above
    cold_start_ms: float | None = None  # median of import + load + first run in fresh processes (gating.startup)

    def budgets(self, data_set: str | None = None) -> dict[float, float]:
        """{percentile (0-1): budget in ms} of the percentiles that have one (on `data_set`: its own budgets
        over the target's, key by key)."""
        own = self.data_sets.get(data_set, {}) if data_set is not None else {}
        pairs = ((0.5, own.get("p50_ms", self.p50_ms)), (0.9, own.get("p90_ms", self.p90_ms)),
                 (0.99, own.get("p99_ms", self.p99_ms)))
        return {p: float(b) for p, b in pairs if b is not None}


@dataclass(frozen=True)
class Size:
    max_ratio: float | None
    max_mb: float | None


@dataclass(frozen=True)
class Memory:
    """[targets.X.memory]: the peak RSS budget of a fresh process that loads and runs the artifact."""

    peak_mb: float | None = None


@dataclass(frozen=True)
class Gates:
    """What `ortbuild test` checks an artifact against. Not part of the build key: budgets never rebuild."""

    accuracy: Mapping[str, Any]      # the validated [accuracy] table (rule keys, `outputs`)
    latency: Latency
    size: Size
    memory: Memory = Memory()
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
        """The budgets measured in fresh processes (ortbuild.gating.startup), by kind: "cold_start" (ms) and
        "memory" (MiB); empty when neither is set."""
        pairs = (("cold_start", self.latency.cold_start_ms), ("memory", self.memory.peak_mb))
        return {kind: float(b) for kind, b in pairs if b is not None}

    def max_ratio(self, precision: str | PrecisionRule) -> float:
        r = self.size.max_ratio
        return float(r) if r is not None else precisions.rule(precision).max_size_ratio


PrecisionOptions = Quantization | Fp16 | Int4 | None
# the typed options of each precision options table (PrecisionRule.options_table)
OPTIONS_TYPES: dict[OptionsTable, type[Quantization] | type[Fp16] | type[Int4]] = {
    "quantization": Quantization, "fp16": Fp16, "int4": Int4}


def typed(cls: type[Any], table: Mapping[str, Any]) -> Any:
    """A sub-settings dataclass from its (validated, defaults-filled) table; lists become tuples."""
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})


def as_plain(settings: Quantization | Fp16 | Int4 | Fusion) -> dict[str, Any]:
    """The JSON form of typed sub-settings (tuples become lists), as build keys and manifests record it."""
    plain: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(settings)))
    return plain


@dataclass(frozen=True)
class Settings:
    """What one (target, model) job is built with: the target's keys after overrides."""

    precision: Precision
    optimization: Level
    format: Format
    providers: tuple[Provider, ...]
    quantization: Quantization
    fp16: Fp16
    int4: Int4
    session: Session
    free_dimensions: Mapping[str, int]
    encrypt: bool = True
    external_data: bool = False
    constant_folding: str = "auto"
    disabled_optimizers: tuple[str, ...] = ()
    custom_ops: tuple[CustomOps, ...] = ()  # the target's and the model's custom-operator libraries
    fusion: Fusion = Fusion()        # off unless [targets.X.fusion] model_type is set
    gates: Gates | None = field(default=None, compare=False)  # not in as_json(): budgets never rebuild

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(json.dumps({
            "precision": self.precision,
            "optimization": self.optimization,
            "format": self.format,
            "providers": [p.as_json() for p in self.providers],
            "quantization": as_plain(self.quantization),
            "fp16": as_plain(self.fp16),
            "int4": as_plain(self.int4),
            "session": self.session.as_json(),
            "free_dimensions": dict(self.free_dimensions),
            "encrypt": self.encrypt,
            "external_data": self.external_data,
            "constant_folding": self.constant_folding,
            "disabled_optimizers": list(self.disabled_optimizers),
            **({"custom_ops": [c.as_json() for c in self.custom_ops]} if self.custom_ops else {}),
            # only when on: the build keys of targets without fusion stay what they were
            **({"fusion": as_plain(self.fusion)} if self.fusion.enabled else {}),
        }))
        return out

    @property
    def rule(self) -> PrecisionRule:
        """The rule of this precision: what it needs, how it is judged and converted."""
        return precisions.rule(self.precision)

    def typed_precision_options(self) -> PrecisionOptions:
        """The typed options of this precision (its options table), or None for fp32."""
        table = self.rule.options_table
        return None if table is None else getattr(self, table)

    def precision_options(self) -> dict[str, Any]:
        """The same as a JSON-able dict (recorded in manifests)."""
        opts = self.typed_precision_options()
        return {} if opts is None else as_plain(opts)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    runtime: str                     # the flavor's pip requirement, e.g. "onnxruntime==1.31.1"
    models: tuple[str, ...]          # resolved model names, in [models] order
    settings: Mapping[str, Settings]  # per model name
    require: bool = False            # `ortbuild test` fails instead of skipping when it cannot run here
    runner: tuple[str, ...] = ("ubuntu-latest",)  # CI runner labels (`ortbuild matrix`)
    plugins: tuple[str, ...] = ()    # pip requirements of the plugin EPs the flavor loads (providers.PLUGINS)
    custom_ops: tuple[CustomOps, ...] = ()  # of the target and of all its models
    platform: str = "native"         # where the artifact runs: "native" (here), "linux-x86_64", "linux-aarch64"

    @property
    def requirements(self) -> tuple[str, ...]:
        """Everything the target's environment installs: the flavor, its plugin EPs, its custom-op packages."""
        return (self.runtime, *self.plugins, *(c.spec for c in self.custom_ops if c.package))

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
        return [ep, *sorted(precs | {p.split("-")[0] for p in precs}), *([self.platform] * (self.platform != "native"))]


@dataclass(frozen=True)
class Project:
    file: Path
    name: str
    version: str
    description: str
    models: Mapping[str, Model]
    targets: Mapping[str, Target]
    epoch: int = 0                   # rollback counter: signed into every manifest, loaders pin a minimum

    @property
    def root(self) -> Path:
        return self.file.parent
