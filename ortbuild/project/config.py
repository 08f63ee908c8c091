"""Load targets.toml into a frozen, validated Project.

Layers, lowest first: option defaults -> the `extends` chain (parent first) -> the target's own keys ->
its `[[overrides]]` whose `models` globs match, in order. Every error is a ConfigError naming the file,
the table/key and, where a name is close, "did you mean ...?".

Stdlib + packaging only: the noxfile imports this module to generate one session per target.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from ortbuild import paths
from ortbuild.errors import ConfigError
from ortbuild.project import evalsets, generation, options, precisions
from ortbuild.project.checker import Checker, did_you_mean, matches, merge, providers_of, short_repr, type_name
from ortbuild.project.declare import build
from ortbuild.project.kindchecks import MODEL_CHECKS, SETTINGS_CHECKS
from ortbuild.project.kinds import Kind, kind_of, kind_rule
from ortbuild.project.layering import INHERITED, NOT_INHERITED, overridden, resolve_extends
from ortbuild.project.providers import CustomOps, Provider
from ortbuild.project.runtimes import check_providers, effective_providers, parse_runtime
from ortbuild.project.sections import (
    FasterThan,
    Fp16,
    Fusion,
    Int4,
    Latency,
    PrecisionOptions,
    Quantization,
    Session,
    Size,
    as_plain,
)
from ortbuild.project.settings import Gates, Model, Project, Settings, Target
from ortbuild.project.validation import (
    check_custom_op_versions,
    check_custom_ops,
    check_relative_budgets,
    check_settings,
)

__all__ = [
    "DEFAULT_FILE", "INHERITED", "NOT_INHERITED", "CustomOps", "FasterThan", "Fp16", "Fusion", "Gates", "Int4",
    "Latency", "Model", "PrecisionOptions", "Project", "Provider", "Quantization", "Session", "Settings", "Size",
    "Target", "as_plain", "did_you_mean", "load", "matches", "merge", "toml_key",
]

DEFAULT_FILE = "targets.toml"


def load_pasted(file: Path, text: str) -> Project:
    """The project of `file` with `text` (printed `[[targets.X.overrides]]` tables) pasted in: its tables merged as
    data after each target's own overrides, as load_with_overrides does (nothing is written: a read-only project
    is fine). A ConfigError where the text is not valid TOML or the result does not load."""
    try:
        extra = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(file), "", f"the printed tables are not valid TOML: {e}") from None
    return load_with_overrides(file, {t: v.get("overrides", []) for t, v in extra.get("targets", {}).items()})


def toml_key(name: str) -> str:
    """`name` as a TOML key in what ortbuild writes for targets.toml: bare where it can be, else quoted (a model,
    target or output name may hold dots, which would split a bare key)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


# ------------------------------------------------------------------------------------------ loading

def _toml_hint(error: str) -> str | None:
    """What to do about TOML's "Cannot declare ... twice": most often a table written inline (`latency = { p90_ms =
    50 }`) and then extended by a header (`[targets.X.latency.server]`), which TOML forbids."""
    if "Cannot declare" not in error:
        return None
    return ("a table written inline (`latency = { ... }`) cannot get more keys from a `[...]` header below it, nor a "
            "header twice: write the table once, either inline with all its keys or as a header "
            "(`[targets.X.latency]`) with its sub-tables as further headers (`[targets.X.latency.server]`)")


def load(path: str | Path = DEFAULT_FILE, *, check_files: bool = True) -> Project:
    """Parse and validate a targets.toml. check_files=False skips file-existence checks (nox -l)."""
    file = Path(path)
    shown = str(path)
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
        raise ConfigError(shown, "", f"not valid TOML: {e}", _toml_hint(str(e))) from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise ConfigError(shown, "", "nested too deeply to parse",
                          "targets.toml needs at most a few levels of tables and arrays") from None
    return _project(file, shown, data, check_files)


def load_with_overrides(file: Path, overrides: Mapping[str, Sequence[Mapping[str, object]]]) -> Project:
    """The project of `file` (its files checked already) with more `[[targets.X.overrides]]` tables after the
    target's own (targets.lock's entries), merged as data: nothing is written, whichever way the file writes its
    overrides (an array of tables or an inline array)."""
    shown = str(file)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(shown, "", f"cannot read: {e}") from None
    for target, tables in overrides.items():
        t = data.get("targets", {}).get(target)
        if not isinstance(t, dict):
            raise ConfigError(shown, f"targets.{target}", "no such target")
        own = t.get("overrides", [])
        t["overrides"] = [*(own if isinstance(own, list) else [own]), *(dict(x) for x in tables)]
    return _project(file, shown, data, check_files=False)


def _project(file: Path, shown: str, data: dict[str, Any], check_files: bool) -> Project:
    """The validated project of a parsed targets.toml."""
    chk = Checker(shown)
    for key in data:
        if key not in ("project", "models", "targets"):
            raise chk.fail(key, f"unknown top-level table '{key}'"
                                f"{did_you_mean(key, ['project', 'models', 'targets'])}",
                           "the top-level tables are [project], [models.NAME] and [targets.NAME]")
    for key in ("project", "models", "targets"):
        if key not in data:
            raise chk.fail(key, f"missing [{key}] table", "see docs/targets-reference.md")
        if not isinstance(data[key], dict):
            raise chk.fail(key, f"must be a table, got {type_name(data[key])}")

    proj = chk.table(data["project"], "project", "project")
    for k in ("name", "version"):
        if k not in proj:
            raise chk.fail("project", f"missing required key '{k}'")

    root = file.parent.resolve()  # model paths become absolute: build steps may change directory
    models = _load_models(chk, data["models"], root, check_files)
    targets = _load_targets(chk, data["targets"], models, root, check_files)
    return Project(file=file, name=proj["name"], version=proj["version"],
                   description=proj.get("description", ""), models=models, targets=targets,
                   epoch=proj.get("epoch", 0), cache=proj.get("cache", ""))


def _path_problem(rel: str) -> str | None:
    """Why a path string from targets.toml can name no file on any system (else None; the file's own checks
    come later): a NUL byte ends a path in every OS call."""
    if "\0" in rel:
        return "holds a NUL byte (\\u0000), which no file name can hold"
    return None


def _load_models(chk: Checker, raw: dict[str, Any], root: Path, check_files: bool) -> dict[str, Model]:
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
        kind: Kind = kind_of(root / table["path"]) if isinstance(table.get("path"), str) else "onnx"
        rule = kind_rule(kind)
        # a model not made yet (a generative one, made on first use by the project's generator): its files are
        # checked when a job builds it (Builder.prepare says how to make it), not for every command on other models
        unmade = rule.made_on_first_use and not (root / table["path"]).exists()
        for k in ("path", "inputs", "calibration", "expected", "heldout"):
            rel = table.get(k)
            if rel is not None and (bad := _path_problem(rel)):
                raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} {bad}", "paths are relative to the directory of "
                                                                       "targets.toml")
            p = (root / rel) if rel is not None else None
            if p is not None and not check_files and (too_long := paths.length_problem(p)):
                raise chk.fail(f"{where}.{k}", too_long)  # with check_files, input_problem() says it
            if unmade:
                pass
            elif check_files and p is not None and rule.directory and k == "path":
                if (problem := generation.directory_problem(p)) is not None:
                    raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} {problem}", rule.path_hint)
            elif check_files and p is not None:
                problem = paths.input_problem(p, limit=paths.MAX_MODEL_BYTES) if k == "path" else \
                    paths.input_problem(p, limit=paths.MAX_DATA_BYTES, directory_ok=True)
                if problem == "does not exist":
                    raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} does not exist (looked for {p})",
                                   "paths are relative to the directory of targets.toml")
                if problem:
                    raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} {problem}",
                                   rule.path_hint if k == "path" else rule.data_hint)
            found[k] = p
        path, inputs = found["path"], found["inputs"]
        assert path is not None and inputs is not None
        MODEL_CHECKS[kind](chk, where, table, found, check_files and not unmade)
        models[name] = Model(name=name, path=path, inputs=inputs, calibration=found["calibration"],
                             heldout=found["heldout"], kind=kind,
                             description=table.get("description", ""), expected=found["expected"],
                             custom_ops=_custom_ops(chk, f"{where}.custom_ops", table.get("custom_ops", []), root,
                                                    check_files),
                             eval=evalsets.eval_set(chk, f"{where}.eval", table.get("eval"), root, check_files))
    _check_loader_modules(chk, models)
    return models


def _check_loader_modules(chk: Checker, models: dict[str, Model]) -> None:
    """Each model's Python loader is the module paths.loader_module(name), so an app imports several side by side:
    two names that differ only in '-', '.' and '_' would give two loaders one module name."""
    seen: dict[str, str] = {}
    for name in models:
        module = paths.loader_module(name)
        if (other := seen.setdefault(module, name)) != name:
            raise chk.fail(f"models.{name}", f"models '{other}' and '{name}' would both have the Python loader module "
                                             f"'{module}' ('-' and '.' become '_' in it), so one app could not "
                                             "import both",
                           "rename one of them (names differing in more than '-', '.' and '_')")


def _custom_ops(chk: Checker, where: str, specs: list[str], root: Path, check_files: bool) -> tuple[CustomOps, ...]:
    """Parse `custom_ops`: pinned pip requirements of packages that ship a library, or library paths."""
    out: list[CustomOps] = []
    for spec in specs:
        if "/" in spec or "\\" in spec or spec.endswith(options.LIBRARY_SUFFIXES) or ".so." in spec:
            if bad := _path_problem(spec):
                raise chk.fail(where, f"custom-op library {short_repr(spec)} {bad}")
            p = root / spec
            if check_files and not p.is_file():
                raise chk.fail(where, f"custom-op library {short_repr(spec)} does not exist (looked for {p})",
                               "paths are relative to the directory of targets.toml")
            out.append(CustomOps(spec=spec, path=p))
            continue
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            raise chk.fail(where, f"{short_repr(spec)} is neither a pip requirement nor a library path "
                                  f"({', '.join(options.LIBRARY_SUFFIXES)})",
                           'e.g. "onnxruntime-extensions==0.15.2" or "libs/libmyops.so"') from None
        pins = [s for s in req.specifier if s.operator == "=="]
        if len(pins) != 1 or len(req.specifier) != 1 or "*" in pins[0].version or req.extras or req.marker:
            raise chk.fail(where, f"{short_repr(spec)} must pin one exact version with ==",
                           f"e.g. \"{req.name}==<version>\": the manifest records the library's sha256, so a "
                           "build must be reproducible")
        package = req.name.lower()
        out.append(CustomOps(spec=f"{package}=={pins[0].version}", package=package, version=pins[0].version,
                             module=options.CUSTOM_OP_MODULES.get(package, package.replace("-", "_"))))
    return tuple(dict.fromkeys(out))


def _check_name(chk: Checker, kind: str, name: str) -> None:
    problem = paths.name_problem(name)
    if problem:
        raise chk.fail(f"{kind}.{name[:40]!r}", f"{kind[:-1]} name {problem}",
                       f"names become directories under dist/; pattern {paths.NAME_PATTERN}")




def _load_targets(chk: Checker, raw: dict[str, Any], models: dict[str, Model], root: Path,
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
        own = resolve_extends(chk, raw, name, resolved)
        t = merge(options.defaults("target"), own)
        for k in ("runtime", "providers"):
            if k not in t:
                raise chk.fail(where, f"missing required key '{k}'", "set it here or in the target it extends")
        rt = parse_runtime(chk, f"{where}.runtime", t["runtime"])
        check_providers(chk, f"{where}.runtime", f"{where}.providers", rt, t["providers"])

        if not t["models"]:
            raise chk.fail(f"{where}.models", "selects no models", 'use ["*"] for all, or name the models')
        plat = precisions.platform_rule(t["platform"])
        if plat.runner is not None and _runner_platform(raw, name, resolved) is not plat:
            t["runner"] = list(plat.runner)  # labels set for another platform (or none) are not inherited
        if not t["runner"] or not all(label.strip() for label in t["runner"]):
            raise chk.fail(f"{where}.runner", "needs at least one non-empty runner label",
                           'e.g. runner = ["ubuntu-latest"] or ["self-hosted", "gpu"]')
        for pat in t["models"]:
            if not matches(list(models), [pat]):
                raise chk.fail(f"{where}.models", f"pattern '{pat}' matches no model"
                                                  f"{did_you_mean(pat, list(models))}",
                               f"the models are: {', '.join(models)}")
        selected = _selected(chk, f"{where}.models", models, t["models"])
        target_ops = _custom_ops(chk, f"{where}.custom_ops", t["custom_ops"], root, check_files)
        for i, ov in enumerate([o for o in t["overrides"] if not o.get(INHERITED)]):  # its own, after inherited
            if "models" not in ov:
                raise chk.fail(f"{where}.overrides[{i}]", "missing required key 'models'")
            for pat in ov["models"]:
                if not matches(selected, [pat]):
                    raise chk.fail(f"{where}.overrides[{i}].models",
                                   f"pattern '{pat}' matches none of this target's models "
                                   f"({', '.join(selected)})")
        settings: dict[str, Settings] = {}
        for m in selected:
            eff, not_inherited = overridden(t, name, m)
            check_providers(chk, f"{where}.providers", f"{where}.providers", rt, eff["providers"])
            SETTINGS_CHECKS[models[m].kind](chk, where, m, eff)
            check_settings(chk, where, models[m], eff)
            eff["candidates"] = _candidates(chk, where, models[m], eff)
            if not plat.nchwc and precisions.LEVEL_RULES[eff["optimization"]].nchwc:
                raise chk.fail(f"{where}.optimization", f"'{eff['optimization']}' ties the artifact to the build "
                               f"machine's CPU (NCHWc blocks for its SIMD width), and a {t['platform']} target is "
                               "built on one machine and run on another",
                               'use optimization = "extended" (or "basic") for this target')
            eff["providers"] = effective_providers(chk, f"{where}.providers", eff, rt)
            ops = tuple(dict.fromkeys([*target_ops, *models[m].custom_ops]))
            check_custom_ops(chk, where, m, eff, ops)
            gates = build(Gates, eff, not_inherited=tuple(dict.fromkeys(not_inherited)),
                          kind=models[m].kind)
            evalsets.check_target(chk, where, models[m], gates)
            settings[m] = build(Settings, eff, providers=providers_of(eff["providers"]), custom_ops=ops, gates=gates)
        all_ops = tuple(dict.fromkeys([*target_ops, *(c for m in selected for c in models[m].custom_ops)]))
        check_custom_op_versions(chk, where, all_ops)
        targets[name] = build(Target, t, name=name, runtime=rt.flavor, models=tuple(selected), settings=settings,
                              plugins=rt.plugins, custom_ops=all_ops,
                              kind=models[selected[0]].kind if selected else "onnx")
    for name, target in targets.items():
        check_relative_budgets(chk, name, target, targets)
    return targets



def _candidates(chk: Checker, where: str, model: Model, eff: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's `candidates`, each a table (a name: `{ precision = NAME }`), checked as the job's settings with it
    laid over them would be: build to the fastest artifact that passes (gating/search/fastest.py)."""
    out = [c if isinstance(c, dict) else {"precision": c} for c in eff["candidates"]]
    if out and kind_rule(model.kind).directory:  # a model builder's directory: the builder sets its precision
        raise chk.fail(f"{where}.candidates", f"model '{model.name}' is generative: its precision is built by "
                       "onnxruntime-genai's model builder, which candidates do not cover",
                       "remove `candidates` from this target (or its override for this model)")
    seen: list[dict[str, Any]] = []  # (one equal to the declared precision is that one: a lock entry's choice is)
    for i, c in enumerate(out):
        at = f"{where}.candidates[{i}]"
        if c in seen:
            raise chk.fail(at, f"{json.dumps(c)} is listed twice", "list each candidate once")
        seen.append(c)
        laid = merge(eff, c)
        check_settings(chk, at, model, laid)
    return out


def _selected(chk: Checker, where: str, models: dict[str, Model], patterns: list[str]) -> list[str]:
    """The models a target's patterns select. A wildcard never selects a generative model (a target of ONNX models
    with `models = ["*"]` does not grow an LLM when one is added): name it. A target builds one kind of model."""
    named = set(patterns)
    selected = [m for m in matches(list(models), patterns) if kind_rule(models[m].kind).wildcards or m in named]
    kinds = {models[m].kind for m in selected}
    if not selected:
        raise chk.fail(where, f"selects only generative models through wildcards ({', '.join(patterns)})",
                       "name a generative model to build it: wildcards never select one")
    if len(kinds) > 1:
        gen = [m for m in selected if not kind_rule(models[m].kind).wildcards]
        raise chk.fail(where, f"selects generative model(s) ({', '.join(gen)}) and ONNX models "
                              f"({', '.join(m for m in selected if m not in gen)}): a target builds one kind",
                       "put the generative models in a target of their own (their builds and gates differ)")
    return selected


def _runner_platform(raw: dict[str, Any], name: str,
                     resolved: dict[str, dict[str, Any]]) -> precisions.PlatformRule | None:
    """The platform of the target whose table sets the runner labels `name` gets (itself or the nearest one it
    extends); None where none sets them."""
    while name in raw and "runner" not in raw[name]:
        name = raw[name].get("extends")
        if name is None:
            return None
    # resolve_extends filled in the whole chain
    return precisions.platform_rule(resolved[name].get("platform", precisions.NATIVE))
