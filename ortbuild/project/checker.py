"""Validation of raw targets.toml tables against the key tables (ortbuild.project.tables), and the helpers every
check shares: ConfigErrors naming the file and key, "did you mean ...?", glob matching, deep merging.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from ortbuild.errors import ConfigError
from ortbuild.project import options
from ortbuild.project.providers import Provider

PLUGIN_EXAMPLE = '["onnxruntime==1.31.1", "onnxruntime-ep-openvino==1.8.1"]'


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


def short_repr(v: object, limit: int = 60) -> str:
    """A value for an error message, cut short (a fuzzer's 5,000-character string is not a message)."""
    text = repr(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def type_name(v: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


class Checker:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, where: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(self.file, where, message, hint)

    def table(self, data: object, spec: str, where: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(where, f"must be a table, got {type_name(data)}")
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

    def value(self, v: object, k: options.Key, where: str) -> None:
        kind = k.kind
        if kind == "string":
            if not isinstance(v, str):
                raise self.fail(where, f"must be a string, got {type_name(v)}")
            if k.choices and v not in k.choices:
                raise self.fail(where, f"{short_repr(v)} is not one of {', '.join(k.choices)}"
                                       f"{did_you_mean(v, k.choices)}")
        elif kind == "integer":
            top = int(k.maximum if k.maximum is not None else options.INT_MAX)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
                raise self.fail(where, f"must be an integer from 0 to {top}, got {short_repr(v)}")
        elif kind == "number":
            top_n = k.maximum if k.maximum is not None else options.NUMBER_MAX
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= top_n:  # nan fails too
                raise self.fail(where, f"must be a number from 0 to {top_n:g}, got {short_repr(v)}")
        elif kind == "boolean":
            if not isinstance(v, bool):
                raise self.fail(where, f"must be true or false, got {v!r}",
                                "TOML booleans are lower-case and unquoted: true / false")
        elif kind == "strings":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise self.fail(where, f"must be an array of strings, got {short_repr(v)}")
            if k.name == "models" and not v:
                raise self.fail(where, "selects no models (an empty list does nothing)",
                                'use ["*"] for all models, or name them')
        elif kind == "requirements":
            if not (isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(x, str) for x in v))):
                raise self.fail(where, f"must be a pip requirement or an array of them, got {short_repr(v)}",
                                f'e.g. "onnxruntime==1.31.1" or {PLUGIN_EXAMPLE}')
        elif kind == "providers":
            self.providers(v, where)
        elif kind == "config":
            self.config(v, where)
        elif kind == "dims":
            if not isinstance(v, dict):
                raise self.fail(where, f"must be a table of dimension name = size, got {type_name(v)}")
            for dim, size in v.items():
                if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= options.INT_MAX:
                    raise self.fail(f"{where}.{dim}", f"must be an integer from 1 to {options.INT_MAX}, "
                                                      f"got {short_repr(size)}")
        elif kind == "table":
            assert k.table
            self.table(v, k.table, where)
        elif kind == "tables":
            assert k.table
            if not isinstance(v, list):
                raise self.fail(where, f"must be an array of tables ([[{where}]]), got {type_name(v)}")
            for i, item in enumerate(v):
                if k.table == "candidate" and isinstance(item, str):  # a precision's name: { precision = NAME }
                    item = {"precision": item}
                self.table(item, k.table, f"{where}[{i}]")
        elif kind == "named":
            assert k.table
            if not isinstance(v, dict):
                raise self.fail(where, f"must be a table of NAME = {{...}}, got {type_name(v)}")
            for name, item in v.items():
                self.table(item, k.table, f"{where}.{name}")

    def providers(self, v: object, where: str) -> None:
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
                raise self.fail(at, f"provider name must be a string, got {type_name(name)}")
            if name not in options.PROVIDERS:
                raise self.fail(at, f"unknown execution provider '{name}'{did_you_mean(name, options.PROVIDERS)}",
                                "provider names are ONNX Runtime's, e.g. CPUExecutionProvider")
            if name in seen:
                raise self.fail(at, f"{name} is listed twice", "list each provider once, in priority order")
            seen.add(name)

    def config(self, v: object, where: str) -> None:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a table of \"key\" = \"value\", got {type_name(v)}")
        for key, value in v.items():
            at = f"{where}.\"{key}\""
            if key in options.RESERVED_CONFIG_KEYS:
                raise self.fail(at, "is set by ortbuild", options.RESERVED_CONFIG_KEYS[key])
            if key in options.FILE_CONFIG_KEYS:
                raise self.fail(at, f"touches files: {options.FILE_CONFIG_KEYS[key]}",
                                "remove it: session options that write, read or dump files are not options "
                                "(docs/trust.md, \"Trust boundaries\")")
            if key not in options.SESSION_CONFIG_KEYS:
                close = did_you_mean(key, sorted(options.SESSION_CONFIG_KEYS))
                raise self.fail(at, f"unknown session config key{close}",
                                "ONNX Runtime ignores unknown keys silently, so ortbuild refuses them; "
                                "the allowed keys are in docs/targets-reference.md")
            if not isinstance(value, str):
                raise self.fail(at, f"must be a string, got {short_repr(value)}", f"quote it: \"{key}\" = \"{value}\"")
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


def providers_of(raw: Sequence[object]) -> tuple[Provider, ...]:
    """The validated `providers` entries: names, or tables of name and options."""
    out = []
    for e in raw:
        assert isinstance(e, str | dict)
        out.append(Provider(e) if isinstance(e, str) else Provider(e["name"], dict(e.get("options", {}))))
    return tuple(out)
