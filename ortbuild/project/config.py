"""Load targets.toml into a frozen, validated Project.

Layers, lowest first: option defaults -> the `extends` chain (parent first) -> the target's own keys ->
its `[[overrides]]` whose `models` globs match, in order. Every error is a ConfigError naming the file,
the table/key and, where a name is close, "did you mean ...?".

Stdlib + packaging only: the noxfile imports this module to generate one session per target.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ortbuild import paths
from ortbuild.errors import ConfigError
from ortbuild.project import capabilities, options

DEFAULT_FILE = "targets.toml"
INHERITED = "\0inherited"  # marks overrides a target inherits through `extends`
# what a target or override notes about the accuracy rules it did not inherit across precisions (`ortbuild plan`)
NOT_INHERITED = "\0accuracy-not-inherited"


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

    model_type: str = options.FUSION_OFF
    num_heads: int = 0               # 0: inferred from the graph
    hidden_size: int = 0

    @property
    def enabled(self) -> bool:
        return self.model_type != options.FUSION_OFF


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
class Gates:
    """What `ortbuild test` checks an artifact against. Not part of the build key: budgets never rebuild."""

    accuracy: Mapping[str, Any]      # the validated [accuracy] table (rule keys, `outputs`)
    latency: Latency
    size: Size
    # the rules written for another precision that this one does not inherit: "the fp32 rule of cpu-fp32"
    not_inherited: tuple[str, ...] = ()

    def accuracy_rule(self, precision: str, output: str) -> dict[str, Any]:
        """The effective rule of one output: precision defaults < target rule < the output's table."""
        rule: dict[str, Any] = dict(options.PRECISION_RULES[precision].accuracy)
        rule["mismatch_fraction"] = 0.0
        rule.update({k: v for k, v in self.accuracy.items() if k != "outputs"})
        rule.update(self.accuracy.get("outputs", {}).get(output, {}))
        return rule

    def max_ratio(self, precision: str) -> float:
        r = self.size.max_ratio
        return float(r) if r is not None else options.PRECISION_RULES[precision].max_size_ratio


PrecisionOptions = Quantization | Fp16 | Int4 | None


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

    precision: str
    optimization: str
    format: str
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
    def rule(self) -> options.PrecisionRule:
        return options.PRECISION_RULES[self.precision]

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
    plugins: tuple[str, ...] = ()    # pip requirements of the plugin EPs the flavor loads (options.PLUGINS)
    custom_ops: tuple[CustomOps, ...] = ()  # of the target and of all its models

    @property
    def requirements(self) -> tuple[str, ...]:
        """Everything the target's environment installs: the flavor, its plugin EPs, its custom-op packages."""
        return (self.runtime, *self.plugins, *(c.spec for c in self.custom_ops if c.package))

    @property
    def runtime_text(self) -> str:
        """The requirements as one line (messages, tables): `pip install` takes it as is."""
        return " ".join(self.requirements)

    def plugin_for(self, provider: str) -> options.PluginEP | None:
        """The plugin EP of this target that provides `provider`, if it comes from one."""
        for req in self.plugins:
            plugin = options.PLUGINS[Requirement(req).name.lower()]
            if plugin.provider == provider:
                return plugin
        return None

    @property
    def providers(self) -> tuple[Provider, ...]:
        """The target-level providers (the first model's, which equal the target's unless overridden)."""
        return next(iter(self.settings.values())).providers

    @property
    def tags(self) -> list[str]:
        """nox tags: primary provider short name, and every precision it builds."""
        ep = self.providers[0].name.removesuffix("ExecutionProvider").lower()
        precs = {s.precision for s in self.settings.values()}
        return [ep, *sorted(precs | {p.split("-")[0] for p in precs})]


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


# ----------------------------------------------------------------------------------------- helpers

def _close(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not found:
        lowered = {c.lower(): c for c in choices}
        found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
        return lowered[found[0]] if found else None
    return found[0]


def matches(names: list[str], patterns: list[str]) -> list[str]:
    """The names any of the glob patterns (fnmatch, case-sensitive) matches, in their order."""
    return [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    c = _close(word, choices)
    if c:
        return f" (did you mean '{c}'?)"
    # a shortened name ("int8" for int8-dynamic / int8-static) is too far for difflib: offer the completions
    starts = [x for x in choices if word and x.lower().startswith(word.lower())]
    return f" (did you mean {' or '.join(repr(x) for x in starts)}?)" if 0 < len(starts) <= 3 else ""


def _shown(v: Any, limit: int = 60) -> str:
    """A value for an error message, cut short (a fuzzer's 5,000-character string is not a message)."""
    text = repr(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, where: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(self.file, where, message, hint)

    def table(self, data: Any, spec: str, where: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(where, f"must be a table, got {_type_name(data)}")
        known = options.keys(spec)
        for name, value in data.items():
            if name not in known:
                raise self.fail(where, f"unknown key '{name}'{did_you_mean(name, list(known))}",
                                f"the keys of this table are: {', '.join(known)}")
            self.value(value, known[name], f"{where}.{name}")
        if spec not in ("target", "override"):  # targets may inherit required keys through `extends`
            for k in known.values():
                if k.required and k.name not in data:
                    raise self.fail(where, f"missing required key '{k.name}'")
        return data

    def value(self, v: Any, k: options.Key, where: str) -> None:
        kind = k.kind
        if kind == "string":
            if not isinstance(v, str):
                raise self.fail(where, f"must be a string, got {_type_name(v)}")
            if k.choices and v not in k.choices:
                raise self.fail(where, f"{_shown(v)} is not one of {', '.join(k.choices)}"
                                       f"{did_you_mean(v, k.choices)}")
        elif kind == "integer":
            top = int(k.maximum if k.maximum is not None else options.INT_MAX)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
                raise self.fail(where, f"must be an integer from 0 to {top}, got {_shown(v)}")
        elif kind == "number":
            top_n = k.maximum if k.maximum is not None else options.NUMBER_MAX
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= top_n:  # nan fails too
                raise self.fail(where, f"must be a number from 0 to {top_n:g}, got {_shown(v)}")
        elif kind == "boolean":
            if not isinstance(v, bool):
                raise self.fail(where, f"must be true or false, got {v!r}",
                                "TOML booleans are lower-case and unquoted: true / false")
        elif kind == "strings":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise self.fail(where, f"must be an array of strings, got {_shown(v)}")
            if k.name == "models" and not v:
                raise self.fail(where, "selects no models (an empty list does nothing)",
                                'use ["*"] for all models, or name them')
        elif kind == "requirements":
            if not (isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(x, str) for x in v))):
                raise self.fail(where, f"must be a pip requirement or an array of them, got {_shown(v)}",
                                f'e.g. "onnxruntime==1.31.1" or {_PLUGIN_EXAMPLE}')
        elif kind == "providers":
            self.providers(v, where)
        elif kind == "config":
            self.config(v, where)
        elif kind == "dims":
            if not isinstance(v, dict):
                raise self.fail(where, f"must be a table of dimension name = size, got {_type_name(v)}")
            for dim, size in v.items():
                if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= options.INT_MAX:
                    raise self.fail(f"{where}.{dim}", f"must be an integer from 1 to {options.INT_MAX}, "
                                                      f"got {_shown(size)}")
        elif kind == "table":
            assert k.table
            self.table(v, k.table, where)
        elif kind == "tables":
            assert k.table
            if not isinstance(v, list):
                raise self.fail(where, f"must be an array of tables ([[{where}]]), got {_type_name(v)}")
            for i, item in enumerate(v):
                self.table(item, k.table, f"{where}[{i}]")
        elif kind == "named":
            assert k.table
            if not isinstance(v, dict):
                raise self.fail(where, f"must be a table of NAME = {{...}}, got {_type_name(v)}")
            for name, item in v.items():
                self.table(item, k.table, f"{where}.{name}")

    def providers(self, v: Any, where: str) -> None:
        if not isinstance(v, list) or not v:
            raise self.fail(where, "must be a non-empty array of provider names or {name=..., options={...}}")
        seen: set[str] = set()
        for i, entry in enumerate(v):
            at = f"{where}[{i}]"
            if isinstance(entry, dict):
                extra = set(entry) - {"name", "options"}
                if extra:
                    raise self.fail(at, f"unknown key '{sorted(extra)[0]}' in a provider entry",
                                    "a provider entry has only `name` and `options`")
                name = entry.get("name")
                opts = entry.get("options", {})
                if not isinstance(opts, dict) or not all(
                        isinstance(x, str | int | float | bool) for x in opts.values()):
                    raise self.fail(f"{at}.options", "must be a table of string, number or boolean values")
                if isinstance(name, str):
                    for opt, value in opts.items():
                        problem = options.provider_option_problem(name, opt, value)
                        if problem:
                            known = sorted(options.PROVIDER_OPTIONS.get(name, {}))
                            close = did_you_mean(opt, known) if problem.startswith("unknown") else ""
                            raise self.fail(f"{at}.options.{opt}", problem + close,
                                            f"{name}'s options: {', '.join(known)}" if known else
                                            "remove the options table")
            else:
                name = entry
            if not isinstance(name, str):
                raise self.fail(at, f"provider name must be a string, got {_type_name(name)}")
            if name not in options.PROVIDERS:
                raise self.fail(at, f"unknown execution provider '{name}'{did_you_mean(name, options.PROVIDERS)}",
                                "provider names are ONNX Runtime's, e.g. CPUExecutionProvider")
            if name in seen:
                raise self.fail(at, f"{name} is listed twice", "list each provider once, in priority order")
            seen.add(name)

    def config(self, v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a table of \"key\" = \"value\", got {_type_name(v)}")
        for key, value in v.items():
            at = f"{where}.\"{key}\""
            if key in options.RESERVED_CONFIG_KEYS:
                raise self.fail(at, "is set by ortbuild", options.RESERVED_CONFIG_KEYS[key])
            if key not in options.SESSION_CONFIG_KEYS:
                close = did_you_mean(key, sorted(options.SESSION_CONFIG_KEYS))
                raise self.fail(at, f"unknown session config key{close}",
                                "ONNX Runtime ignores unknown keys silently, so ortbuild refuses them; "
                                "the allowed keys are in docs/targets-reference.md")
            if not isinstance(value, str):
                raise self.fail(at, f"must be a string, got {_shown(value)}", f"quote it: \"{key}\" = \"{value}\"")
            problem = options.config_value_problem(key, value)
            if problem:
                raise self.fail(at, problem)


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge tables; any non-table value (lists included) in `top` replaces the one in `base`."""
    out = copy.deepcopy(dict(base))
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _providers(raw: list[Any]) -> tuple[Provider, ...]:
    return tuple(Provider(e) if isinstance(e, str) else Provider(e["name"], dict(e.get("options", {})))
                 for e in raw)


# ------------------------------------------------------------------------------------------ loading

def load(path: str | Path = DEFAULT_FILE, *, check_files: bool = True) -> Project:
    """Parse and validate a targets.toml. check_files=False skips file-existence checks (nox -l)."""
    file = Path(path)
    shown = str(path)
    chk = _Checker(shown)
    too_long = paths.length_problem(file)
    if too_long:
        raise ConfigError(shown[:200], "", too_long)
    try:
        if file.exists() and not file.is_file():
            raise ConfigError(shown, "", "is not a regular file", "pass -c PATH/TO/targets.toml")
        if file.exists() and file.stat().st_size > 16 << 20:
            raise ConfigError(shown, "", "is larger than 16 MiB: not a targets.toml")
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(shown, "", "file not found",
                          "run from the directory holding targets.toml, or pass -c PATH") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(shown, "", f"cannot read: {e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(shown, "", f"not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise ConfigError(shown, "", "nested too deeply to parse",
                          "targets.toml needs at most a few levels of tables and arrays") from None

    for key in data:
        if key not in ("project", "models", "targets"):
            raise chk.fail(key, f"unknown top-level table '{key}'"
                                f"{did_you_mean(key, ['project', 'models', 'targets'])}",
                           "the top-level tables are [project], [models.NAME] and [targets.NAME]")
    for key in ("project", "models", "targets"):
        if key not in data:
            raise chk.fail(key, f"missing [{key}] table", "see docs/targets-reference.md")
        if not isinstance(data[key], dict):
            raise chk.fail(key, f"must be a table, got {_type_name(data[key])}")

    proj = chk.table(data["project"], "project", "project")
    for k in ("name", "version"):
        if k not in proj:
            raise chk.fail("project", f"missing required key '{k}'")

    root = file.parent.resolve()  # model paths become absolute: build steps may change directory
    models = _load_models(chk, data["models"], root, check_files)
    targets = _load_targets(chk, data["targets"], models, root, check_files)
    return Project(file=file, name=proj["name"], version=proj["version"],
                   description=proj.get("description", ""), models=models, targets=targets,
                   epoch=proj.get("epoch", 0))


def _path_problem(rel: str) -> str | None:
    """Why a path string from targets.toml can name no file on any system (else None; the file's own checks
    come later): a NUL byte ends a path in every OS call."""
    if "\0" in rel:
        return "holds a NUL byte (\\u0000), which no file name can hold"
    return None


def _load_models(chk: _Checker, raw: dict[str, Any], root: Path, check_files: bool) -> dict[str, Model]:
    if not raw:
        raise chk.fail("models", "no models declared", "add a [models.NAME] table with path and inputs")
    models: dict[str, Model] = {}
    for name, table in raw.items():
        where = f"models.{name}"
        _check_name(chk, "models", name)
        chk.table(table, "model", where)
        for k in ("path", "inputs"):
            if k not in table:
                raise chk.fail(where, f"missing required key '{k}'")
        found: dict[str, Path | None] = {}
        for k in ("path", "inputs", "calibration", "expected"):
            rel = table.get(k)
            if rel is not None and (bad := _path_problem(rel)):
                raise chk.fail(f"{where}.{k}", f"{_shown(rel)} {bad}", "paths are relative to the directory of "
                                                                       "targets.toml")
            p = (root / rel) if rel is not None else None
            if p is not None and not check_files and (too_long := paths.length_problem(p)):
                raise chk.fail(f"{where}.{k}", too_long)  # with check_files, input_problem() says it
            if check_files and p is not None:
                problem = paths.input_problem(p, limit=paths.MAX_MODEL_BYTES) if k == "path" else \
                    paths.input_problem(p, limit=paths.MAX_DATA_BYTES, directory_ok=True)
                if problem == "does not exist":
                    raise chk.fail(f"{where}.{k}", f"{_shown(rel)} does not exist (looked for {p})",
                                   "paths are relative to the directory of targets.toml")
                if problem:
                    raise chk.fail(f"{where}.{k}", f"{_shown(rel)} {problem}",
                                   "name an ONNX model file" if k == "path" else
                                   "name an .npz file or a directory of test_data_set_N/ (docs/targets-reference.md)")
            found[k] = p
        path, inputs = found["path"], found["inputs"]
        assert path is not None and inputs is not None
        models[name] = Model(name=name, path=path, inputs=inputs, calibration=found["calibration"],
                             description=table.get("description", ""), expected=found["expected"],
                             custom_ops=_custom_ops(chk, f"{where}.custom_ops", table.get("custom_ops", []), root,
                                                    check_files))
    return models


def _custom_ops(chk: _Checker, where: str, specs: list[str], root: Path, check_files: bool) -> tuple[CustomOps, ...]:
    """Parse `custom_ops`: pinned pip requirements of packages that ship a library, or library paths."""
    out: list[CustomOps] = []
    for spec in specs:
        if "/" in spec or "\\" in spec or spec.endswith(options.LIBRARY_SUFFIXES) or ".so." in spec:
            if bad := _path_problem(spec):
                raise chk.fail(where, f"custom-op library {_shown(spec)} {bad}")
            p = root / spec
            if check_files and not p.is_file():
                raise chk.fail(where, f"custom-op library {_shown(spec)} does not exist (looked for {p})",
                               "paths are relative to the directory of targets.toml")
            out.append(CustomOps(spec=spec, path=p))
            continue
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            raise chk.fail(where, f"{_shown(spec)} is neither a pip requirement nor a library path "
                                  f"({', '.join(options.LIBRARY_SUFFIXES)})",
                           'e.g. "onnxruntime-extensions==0.15.2" or "libs/libmyops.so"') from None
        pins = [s for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1 or "*" in pins[0].version or req.extras or req.marker:
            raise chk.fail(where, f"{_shown(spec)} must pin one exact version with ==",
                           f"e.g. \"{req.name}==<version>\": the manifest records the library's sha256, so a "
                           "build must be reproducible")
        package = req.name.lower()
        out.append(CustomOps(spec=f"{package}=={pins[0].version}", package=package, version=pins[0].version,
                             module=options.CUSTOM_OP_MODULES.get(package, package.replace("-", "_"))))
    return tuple(dict.fromkeys(out))


def _check_name(chk: _Checker, kind: str, name: str) -> None:
    problem = paths.name_problem(name)
    if problem:
        raise chk.fail(f"{kind}.{name[:40]!r}", f"{kind[:-1]} name {problem}",
                       f"names become directories under dist/; pattern {paths.NAME_PATTERN}")


def _resolve_extends(chk: _Checker, raw: dict[str, Any], name: str,
                     done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The target's table merged over its `extends` chain, parent first. Iterative (chains can be long), and
    each target is resolved once (`done` keeps the results)."""
    chain = [name]
    while chain[-1] not in done and (parent := raw[chain[-1]].get("extends")) is not None:
        where = f"targets.{chain[-1]}.extends"
        if parent not in raw:
            raise chk.fail(where, f"unknown target {_shown(parent)}{did_you_mean(parent, list(raw))}")
        if parent in chain:
            loop = [*chain[chain.index(parent):], parent]
            shown = loop if len(loop) <= 8 else [*loop[:3], f"... ({len(loop) - 6} more)", *loop[-3:]]
            raise chk.fail(where, f"cycle in extends: {' -> '.join(shown)}", "remove one of the extends keys")
        chain.append(parent)
    top = chain.pop()
    merged = done.get(top) or {k: v for k, v in raw[top].items() if k != "extends"}
    done[top] = merged
    parent = top
    for child in reversed(chain):  # each child over what it inherits
        inherited = copy.deepcopy(merged)
        for o in inherited.get("overrides", []):
            o[INHERITED] = True  # an inherited override may name models this target does not build
        for part in [inherited, *inherited.get("overrides", [])]:
            if isinstance(part.get("latency"), dict):  # a relative budget names a pair of targets: not inherited
                part["latency"] = {k: v for k, v in part["latency"].items() if k != "faster_than"}
        was = inherited.get("precision", options.defaults("target")["precision"])
        if _rule_family(raw[child].get("precision", was)) != _rule_family(was):  # accuracy rules follow precision
            _not_inherited(inherited, was, parent)
            for i, o in enumerate(inherited.get("overrides", [])):
                if "precision" not in o:  # its rule was written for the parent's precision too
                    _not_inherited(o, was, f"{parent}.overrides[{i}]")
        merged = merge(inherited, raw[child])
        merged.pop("extends", None)
        done[child] = merged
        parent = child
    return copy.deepcopy(merged)


def _rule_family(precision: Any) -> tuple[Any, ...]:
    """Precisions whose accuracy rules carry over to each other: those with the same options table and default
    rule (int8-dynamic and int8-static); fp32, fp16, int8 and int4 each stand alone."""
    r = options.PRECISION_RULES.get(precision) if isinstance(precision, str) else None
    return (precision,) if r is None else (r.options_table, r.accuracy)


def _not_inherited(table: dict[str, Any], precision: str, where: str) -> None:
    """Drop the accuracy rule of `table` (a target or override table, its rule written for `precision`), keeping
    the outputs it ignores (`ignore` says what an output is, not how close it must be); note what was dropped."""
    acc = table.get("accuracy")
    if not isinstance(acc, dict) or not acc:
        return
    outputs: dict[str, Any] = acc["outputs"] if isinstance(acc.get("outputs"), dict) else {}
    ignored = {o: {"ignore": True} for o, r in outputs.items() if isinstance(r, dict) and r.get("ignore")}
    table["accuracy"] = {"outputs": ignored}
    unset = {k.name: k.default for k in options.TABLES["accuracy"]}
    if any(v != unset.get(k) for k, v in acc.items() if k != "outputs") or any(
            isinstance(r, dict) and set(r) - {"ignore"} for r in outputs.values()):
        table.setdefault(NOT_INHERITED, []).append(f"the {precision} rule of {where}")


def _load_targets(chk: _Checker, raw: dict[str, Any], models: dict[str, Model], root: Path,
                  check_files: bool) -> dict[str, Target]:
    if not raw:
        raise chk.fail("targets", "no targets declared", "add a [targets.NAME] table")
    for name, table in raw.items():
        _check_name(chk, "targets", name)
        chk.table(table, "target", f"targets.{name}")
    targets: dict[str, Target] = {}
    resolved: dict[str, dict[str, Any]] = {}
    for name in raw:
        where = f"targets.{name}"
        t = merge(options.defaults("target"), _resolve_extends(chk, raw, name, resolved))
        for k in ("runtime", "providers"):
            if k not in t:
                raise chk.fail(where, f"missing required key '{k}'", "set it here or in the target it extends")
        rt = _parse_runtime(chk, f"{where}.runtime", t["runtime"])
        _check_providers(chk, f"{where}.runtime", f"{where}.providers", rt, t["providers"])

        if not t["models"]:
            raise chk.fail(f"{where}.models", "selects no models", 'use ["*"] for all, or name the models')
        if not t["runner"] or not all(label.strip() for label in t["runner"]):
            raise chk.fail(f"{where}.runner", "needs at least one non-empty runner label",
                           'e.g. runner = ["ubuntu-latest"] or ["self-hosted", "gpu"]')
        for pat in t["models"]:
            if not matches(list(models), [pat]):
                raise chk.fail(f"{where}.models", f"pattern '{pat}' matches no model"
                                                  f"{did_you_mean(pat, list(models))}",
                               f"the models are: {', '.join(models)}")
        selected = matches(list(models), t["models"])
        target_ops = _custom_ops(chk, f"{where}.custom_ops", t["custom_ops"], root, check_files)
        for i, ov in enumerate(t["overrides"]):
            if ov.get(INHERITED):
                continue
            if "models" not in ov:
                raise chk.fail(f"{where}.overrides[{i}]", "missing required key 'models'")
            for pat in ov["models"]:
                if not matches(selected, [pat]):
                    raise chk.fail(f"{where}.overrides[{i}].models",
                                   f"pattern '{pat}' matches none of this target's models "
                                   f"({', '.join(selected)})")
        settings: dict[str, Settings] = {}
        for m in selected:
            eff = {k: t[k] for k in options.OVERRIDABLE}
            not_inherited = list(t.get(NOT_INHERITED, []))
            for ov in t["overrides"]:
                if matches([m], ov["models"]):
                    part = {k: v for k, v in ov.items() if k not in ("models", INHERITED, NOT_INHERITED)}
                    not_inherited += ov.get(NOT_INHERITED, [])
                    if "precision" in part and _rule_family(part["precision"]) != _rule_family(eff["precision"]):
                        dropped = {"accuracy": eff["accuracy"]}  # the rule so far was written for another precision
                        _not_inherited(dropped, eff["precision"], name)
                        eff["accuracy"] = dropped["accuracy"]
                        not_inherited += dropped.get(NOT_INHERITED, [])
                    eff = merge(eff, part)
            _check_providers(chk, f"{where}.providers", f"{where}.providers", rt, eff["providers"])
            _check_settings(chk, where, models[m], eff)
            eff["providers"] = _effective_providers(chk, f"{where}.providers", eff, rt)
            ops = tuple(dict.fromkeys([*target_ops, *models[m].custom_ops]))
            if ops and eff["precision"] == "int8-static":
                raise chk.fail(f"{where}.precision", f"int8-static cannot calibrate model '{m}': it needs custom "
                                                     f"ops ({', '.join(c.name for c in ops)}), and ONNX Runtime's "
                               "calibrator opens its own sessions, which cannot register them",
                               "use int8-dynamic (with quantization.preprocess = false), fp16 or int4-weight")
            if ops and eff["precision"] == "int8-dynamic" and eff["quantization"].get("preprocess", True):
                raise chk.fail(f"{where}.quantization.preprocess", f"model '{m}' needs custom ops "
                                                                   f"({', '.join(c.name for c in ops)}), and "
                               "quant_pre_process optimizes it in a session that cannot register them",
                               "set quantization = { preprocess = false } for this target or model")
            settings[m] = Settings(
                precision=eff["precision"], optimization=eff["optimization"], format=eff["format"],
                providers=_providers(eff["providers"]), quantization=typed(Quantization, eff["quantization"]),
                fp16=typed(Fp16, eff["fp16"]), int4=typed(Int4, eff["int4"]), session=typed(Session, eff["session"]),
                free_dimensions=eff["free_dimensions"], encrypt=eff["encrypt"], external_data=eff["external_data"],
                constant_folding=eff["constant_folding"], disabled_optimizers=tuple(eff["disabled_optimizers"]),
                custom_ops=ops, fusion=typed(Fusion, eff["fusion"]),
                gates=_gates(eff, tuple(dict.fromkeys(not_inherited))))
        all_ops = tuple(dict.fromkeys([*target_ops, *(c for m in selected for c in models[m].custom_ops)]))
        _check_custom_op_versions(chk, where, all_ops)
        targets[name] = Target(name=name, description=t["description"], runtime=rt.flavor,
                               models=tuple(selected), settings=settings, require=t["require"],
                               runner=tuple(t["runner"]), plugins=rt.plugins, custom_ops=all_ops)
    for name, target in targets.items():
        _check_relative_budgets(chk, name, target, targets)
    return targets


def _check_custom_op_versions(chk: _Checker, where: str, ops: tuple[CustomOps, ...]) -> None:
    """One virtualenv per target: one version of each custom-op package across its models."""
    seen: dict[str, str] = {}
    for c in ops:
        if c.package and seen.setdefault(c.package, c.version) != c.version:
            raise chk.fail(f"{where}.custom_ops", f"the models of this target need {c.package} "
                                                  f"{seen[c.package]} and {c.version}: one virtualenv holds one",
                           "pin the same version in every model's custom_ops, or build them in two targets")


def _gates(eff: dict[str, Any], not_inherited: tuple[str, ...] = ()) -> Gates:
    def filled(table: str) -> dict[str, Any]:  # every key of the table, None where unset
        return {k.name: eff[table].get(k.name, k.default) for k in options.TABLES[table]}

    lat = filled("latency")
    ft = lat.pop("faster_than")
    lat["data_sets"] = {name: dict(budgets) for name, budgets in lat["data_sets"].items()}
    return Gates(accuracy=eff["accuracy"],
                 latency=Latency(**lat, faster_than=FasterThan(ft["target"], float(ft["ratio"])) if ft else None),
                 size=Size(**filled("size")), not_inherited=not_inherited)


def _check_relative_budgets(chk: _Checker, name: str, target: Target, targets: Mapping[str, Target]) -> None:
    for m, s in target.settings.items():
        assert s.gates is not None
        lat = s.gates.latency
        where = f"targets.{name}.latency"
        if not 0.5 <= lat.confidence < 1:
            raise chk.fail(f"{where}.confidence", f"must be in [0.5, 1), got {lat.confidence}")
        ft = lat.faster_than
        if ft is None:
            continue
        if ft.target == name:
            raise chk.fail(f"{where}.faster_than.target", "names this target itself",
                           "compare with another target, e.g. the fp32 one")
        if ft.target not in targets:
            raise chk.fail(f"{where}.faster_than.target",
                           f"unknown target '{ft.target}'{did_you_mean(ft.target, list(targets))}")
        if m not in targets[ft.target].models:
            raise chk.fail(f"{where}.faster_than.target", f"target '{ft.target}' does not build model '{m}'",
                           f"limit the budget to shared models with [[targets.{name}.overrides]]")
        if ft.ratio <= 0:
            raise chk.fail(f"{where}.faster_than.ratio", "must be above 0")


_PLUGIN_EXAMPLE = '["onnxruntime==1.31.1", "onnxruntime-ep-openvino==1.8.1"]'


@dataclass(frozen=True)
class _Runtime:
    """A target's parsed `runtime`: the flavor's requirement, its plugin EPs' requirements, and which package
    provides each provider it can offer."""

    flavor: str
    plugins: tuple[str, ...]
    offered: dict[str, str]          # provider -> the flavor's name, or the plugin package providing it

    @property
    def text(self) -> str:
        return " + ".join([self.flavor, *self.plugins])

    def from_plugin(self, provider: str) -> bool:
        return self.offered.get(provider) in options.PLUGINS


def _pin_problem(req: Requirement) -> str | None:
    """Why a runtime requirement is not a plain pin (name[extras]==version), or None. Markers and direct URLs
    are refused: a marker can make pip install nothing (or another flavor), a URL installs whatever it names."""
    if req.url:
        return f"is a direct reference (@ {req.url})"
    if req.marker is not None:
        return f"has an environment marker (; {req.marker})"
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        return "does not pin one exact version with ==" if specs else "names no version"
    return None


def _pinned_version(req: Requirement) -> str:
    """The version a requirement names, for the hint (else a placeholder)."""
    versions = [s.version for s in req.specifier if s.operator in ("==", "===", ">=", "~=") and "*" not in s.version]
    return versions[0] if versions else "<version>"


def _parse_runtime(chk: _Checker, where: str, runtime: str | list[str]) -> _Runtime:
    """The target's flavor and plugin EP requirements (one flavor; plugins that plug into it)."""
    flavor_req: str | None = None
    plugins: list[str] = []
    for text in [runtime] if isinstance(runtime, str) else runtime:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            raise chk.fail(where, f"'{text}' is not a pip requirement: {e}",
                           "write it like onnxruntime==1.31.1") from None
        name = req.name.lower()
        if name not in options.PLUGINS and name not in options.RUNTIMES:
            raise chk.fail(where, f"unknown ONNX Runtime flavor or plugin EP '{req.name}'"
                                  f"{did_you_mean(name, [*options.RUNTIMES, *options.PLUGINS])}",
                           f"flavors: {', '.join(options.RUNTIMES)}; plugin EPs: {', '.join(options.PLUGINS)}")
        problem = _pin_problem(req)
        if problem:  # what nox would install and what the build checks against must be one exact release
            raise chk.fail(where, f"'{text}' {problem}: a runtime is a plain pin of one release",
                           f'write it like "{req.name}=={_pinned_version(req)}" (name, optional [extras], == and '
                           "one exact version)")
        if name in options.PLUGINS:
            if text in plugins or any(Requirement(p).name.lower() == name for p in plugins):
                raise chk.fail(where, f"{req.name} is listed twice")
            plugins.append(text)
        else:  # a flavor (options.RUNTIMES)
            if flavor_req is not None:
                raise chk.fail(where, f"lists two ONNX Runtime flavors ({flavor_req}, {text})",
                               "one flavor per target: they overwrite each other's `onnxruntime` module")
            flavor_req = text
    if flavor_req is None:
        raise chk.fail(where, "names no ONNX Runtime flavor", f"e.g. {_PLUGIN_EXAMPLE}")
    flavor = Requirement(flavor_req).name.lower()
    offered = {p: flavor for p in options.RUNTIMES[flavor]}
    for text in plugins:
        plugin = options.PLUGINS[Requirement(text).name.lower()]
        if flavor not in plugin.flavors:
            raise chk.fail(where, f"{plugin.package} plugs into {', '.join(plugin.flavors)}, not {flavor}",
                           f'e.g. runtime = ["onnxruntime==1.31.1", "{text}"]')
        if plugin.provider in offered:
            raise chk.fail(where, f"{plugin.provider} comes from both {flavor} and {plugin.package}",
                           "keep one of them")
        offered[plugin.provider] = plugin.package
    return _Runtime(flavor_req, tuple(plugins), offered)


def _check_providers(chk: _Checker, where: str, at: str, rt: _Runtime, providers: list[Any]) -> None:
    """Every listed provider is supported and offered by the runtime (errors about the runtime at `where`, about
    the list at `at`); plugin EP targets list only the plugin's provider and the CPU."""
    listed = _providers(providers)
    for p in listed:
        gap = capabilities.unsupported(p.name)
        if gap:
            raise chk.fail(at, gap, f"supported providers: {', '.join(capabilities.supported())} "
                                    "(docs/targets.md)")
        if p.name not in rt.offered:
            owner = [r for r, eps in options.RUNTIMES.items() if p.name in eps]
            owner += [pl.package for pl in options.PLUGINS.values() if p.name == pl.provider]
            hint = f"{p.name} ships in {' or '.join(owner)}" if owner else None
            raise chk.fail(where, f"{rt.text} does not provide {p.name}", hint)
    from_plugin = [p.name for p in listed if rt.from_plugin(p.name)]
    others = [p.name for p in listed if not rt.from_plugin(p.name) and p.name != "CPUExecutionProvider"]
    if from_plugin and others:
        raise chk.fail(at, f"{from_plugin[0]} (a plugin EP) cannot be combined with {others[0]} here",
                       "list the plugin EP and CPUExecutionProvider (its fallback) only")


def _effective_providers(chk: _Checker, where: str, eff: dict[str, Any], rt: _Runtime) -> list[Any]:
    """The providers as built, tested and loaded: options checked against the runtime that provides them, and
    ortbuild's safe defaults added where the target did not state them (docs/targets.md)."""
    out: list[Any] = []
    for i, p in enumerate(_providers(eff["providers"])):
        opts = dict(p.options)
        at = f"{where}[{i}].options"
        for opt, why in options.PLAINTEXT_OPTIONS.get(p.name, {}).items():
            if opt in opts:
                raise chk.fail(f"{at}.{opt}", f"is refused: {why}", f"remove {opt}")
        if rt.from_plugin(p.name):
            for opt in opts:
                if opt in options.PLUGIN_IGNORED.get(p.name, {}):
                    raise chk.fail(f"{at}.{opt}", f"the {p.name} plugin ignores it (with only a warning)",
                                   f"use {options.PLUGIN_IGNORED[p.name][opt]}")
                if opt not in options.PLUGIN_OPTIONS.get(p.name, frozenset(opts)):
                    known = sorted(options.PLUGIN_OPTIONS[p.name])
                    raise chk.fail(f"{at}.{opt}", f"unknown option of the {p.name} plugin{did_you_mean(opt, known)}",
                                   f"its options: {', '.join(known)}")
            device = str(opts.get("device_type", "CPU"))
            if device not in options.PLUGIN_DEVICE_TYPES:
                raise chk.fail(f"{at}.device_type",
                               f"'{device}' is not one of {', '.join(options.PLUGIN_DEVICE_TYPES)}",
                               "the plugin EP offers one device per kind; HETERO/MULTI/AUTO are not supported")
            opts["device_type"] = device
        if p.name == "OpenVINOExecutionProvider":
            opts = _pin_precision_hint(chk, at, opts, eff["precision"])
        for opt, value in options.PROVIDER_DEFAULTS.get(p.name, {}).items():
            opts.setdefault(opt, value)
        out.append({"name": p.name, "options": opts})
    return out


def _pin_precision_hint(chk: _Checker, at: str, opts: dict[str, Any], precision: str) -> dict[str, Any]:
    """OpenVINO's CPU plugin runs "fp32" models in bf16 on CPUs with AMX unless told otherwise: an fp32 target
    gets INFERENCE_PRECISION_HINT = f32 in load_config; a target that wants bf16/f16 states it there."""
    device = str(opts.get("device_type", "CPU"))
    if device not in options.PLUGIN_DEVICE_TYPES:
        return opts  # HETERO:/MULTI:/GPU.1 (the flavor's device strings): the target states load_config itself
    try:
        config = json.loads(str(opts.get("load_config", "{}")))
    except ValueError:
        config = None
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise chk.fail(f"{at}.load_config", "must be a JSON object of device -> {property: value}",
                       'e.g. \'{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}\'')
    props = config.setdefault(device, {})
    hint = props.get("INFERENCE_PRECISION_HINT")
    if hint is None:
        if precision != options.FP32:
            return opts  # fp16/int8 graphs: the device's default execution precision is what they ask for
        props["INFERENCE_PRECISION_HINT"] = "f32"
    elif str(hint).lower() not in options.PRECISION_HINTS:
        raise chk.fail(f"{at}.load_config", f"INFERENCE_PRECISION_HINT '{hint}' is not one of "
                                            f"{', '.join(options.PRECISION_HINTS)}")
    return {**opts, "load_config": json.dumps(config, sort_keys=True, separators=(",", ":"))}


def _check_settings(chk: _Checker, where: str, model: Model, eff: dict[str, Any]) -> None:
    if options.PRECISION_RULES[eff["precision"]].needs_calibration and model.calibration is None:
        raise chk.fail(f"{where}.precision",
                       f"{eff['precision']} needs calibration data, and model '{model.name}' has none",
                       f"add `calibration = \"...npz\"` to [models.{model.name}], or use int8-dynamic "
                       "for this model (an [[overrides]] entry)")
    bs = eff["int4"].get("block_size", 32)
    if bs not in (16, 32, 64, 128, 256):
        raise chk.fail(f"{where}.int4.block_size", f"{bs} is not one of 16, 32, 64, 128, 256")
    if eff["int4"].get("accuracy_level", 0) > 4:
        raise chk.fail(f"{where}.int4.accuracy_level", "must be 0-4")
    if eff["external_data"] and eff["format"] == "ort":
        raise chk.fail(f"{where}.external_data", "format 'ort' cannot hold external data",
                       "use format = \"onnx\" with external_data = true")
    compiling = [p.name for p in _providers(eff["providers"]) if p.name in options.COMPILING_PROVIDERS]
    if eff["format"] == "ort" and compiling:
        raise chk.fail(f"{where}.format", f"format 'ort' cannot hold graphs for {compiling[0]}",
                       "use format = \"onnx\" for compiling providers")
    _check_fusion(chk, f"{where}.fusion", model, eff["fusion"], compiling)


def _check_fusion(chk: _Checker, where: str, model: Model, fusion: dict[str, Any], compiling: list[str]) -> None:
    """[targets.X.fusion] (after overrides): the sizes the model type needs, and providers that can run the result."""
    kind = fusion.get("model_type", options.FUSION_OFF)
    if kind == options.FUSION_OFF:
        return
    heads, hidden = fusion.get("num_heads", 0), fusion.get("hidden_size", 0)
    example = f'fusion = {{ model_type = "{kind}", num_heads = 12, hidden_size = 768 }}'
    if bool(heads) != bool(hidden):
        raise chk.fail(where, f"gives {'num_heads' if heads else 'hidden_size'} alone (model '{model.name}')",
                       f"give both num_heads and hidden_size (the model's), or neither (0: inferred), e.g. {example}")
    if not heads and kind not in options.FUSION_INFERS_SIZES:
        raise chk.fail(f"{where}.model_type", f"'{kind}' needs num_heads and hidden_size (model '{model.name}'): "
                                              "ONNX Runtime's optimizer infers them for "
                       f"{', '.join(sorted(options.FUSION_INFERS_SIZES))} only",
                       f"give the model's attention heads and hidden size, e.g. {example}")
    if heads and hidden % heads:
        raise chk.fail(f"{where}.hidden_size", f"{hidden} is not a multiple of num_heads = {heads}",
                       "give the model's hidden size and its number of attention heads")
    if compiling:
        raise chk.fail(f"{where}.model_type", f"fusion '{kind}' cannot be used with {compiling[0]} (model "
                                              f"'{model.name}'): the fused graph holds com.microsoft ops (Attention, "
                       "SkipLayerNormalization, ...) that ONNX Runtime's CPU, CUDA and ROCm providers run, while a "
                       "compiling provider gets the portable basic-level graph and fuses it itself",
                       'set fusion = { model_type = "off" } for this target (or this model, in an '
                       "[[overrides]] entry); fusion is for CPU and CUDA targets")
