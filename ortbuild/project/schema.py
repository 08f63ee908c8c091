"""The shipped JSON Schema (ortbuild/targets.schema.json) and reference docs (docs/targets-reference.md) of
targets.toml, generated from the key tables. Regenerate both with `ortbuild schema --write`.
"""

from __future__ import annotations

import json

from ortbuild.paths import NAME_PATTERN, NAME_RULE, RESERVED_NAMES
from ortbuild.project.precisions import PRECISIONS
from ortbuild.project.providers import PROVIDER_OPTIONS, PROVIDERS, ProviderOption
from ortbuild.project.session_keys import (
    CONFIG_FLAGS,
    CONFIG_INTS,
    FILE_CONFIG_KEYS,
    INT_MAX,
    MAX_CONFIG_VALUE,
    NUMBER_MAX,
    RESERVED_CONFIG_KEYS,
    SESSION_CONFIG_KEYS,
)
from ortbuild.project.tables import TABLES, Key

# ----------------------------------------------------------------------------------------- JSON Schema

def _provider_options_schema(provider: str) -> dict[str, object]:
    """if name == provider then its options are the documented ones, of their kinds."""
    flag: dict[str, object] = {"anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["0", "1", "true", "false"]},
                      {"type": "integer", "enum": [0, 1]}]}
    kinds: dict[str, dict[str, object]] = {"flag": flag, "text": {"type": "string"}, "json": {"type": "string"}}

    def one(o: ProviderOption) -> dict[str, object]:
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


def _key_schema(k: Key) -> dict[str, object]:
    s: dict[str, object]
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
            else {"type": "string", "pattern": "^[0-9]+$"} if key in CONFIG_INTS
            else {"type": "string", "maxLength": MAX_CONFIG_VALUE} for key in sorted(SESSION_CONFIG_KEYS)}}
    elif k.kind == "dims":
        s = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}}
    elif k.kind == "table":
        s = {"$ref": f"#/$defs/{k.table}"}
    elif k.kind == "tables" and k.table == "candidate":  # a precision's name, or a table of it and its options
        s = {"type": "array", "items": {"anyOf": [{"type": "string", "enum": list(PRECISIONS)},
                                                  {"$ref": f"#/$defs/{k.table}"}]}}
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


def _table_schema(table: str, with_required: bool) -> dict[str, object]:
    s: dict[str, object] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {k.name: _key_schema(k) for k in TABLES[table]},
    }
    req = [k.name for k in TABLES[table] if k.required]
    if with_required and req:
        s["required"] = req
    return s


def json_schema() -> dict[str, object]:
    # Targets may inherit required keys through `extends`, so the schema cannot require them there.
    defs = {t: _table_schema(t, with_required=t != "target") for t in TABLES}
    # names become directories under dist/
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
    "latency_offline": "[targets.NAME.latency.offline]", "latency_server": "[targets.NAME.latency.server]",
    "latency_multi_stream": "[targets.NAME.latency.multi_stream]",
    "size": "[targets.NAME.size]", "memory": "[targets.NAME.memory]", "eval": "[targets.NAME.eval]",
    "model_eval": "[models.NAME.eval]", "tokens": "[targets.NAME.tokens]",
    "generation": "[targets.NAME.generation]", "candidate": "[targets.NAME] candidates",
}


def _fmt_default(k: Key) -> str:
    if k.required:
        return "required"
    if k.kind in ("table", "tables", "named"):
        return {"table": "see below", "tables": "[]", "named": "{}"}[k.kind]
    if k.default is None:
        return "none"
    return "`" + json.dumps(k.default) + "`"


def _fmt_rebuilds(k: Key) -> str:
    if k.kind in ("table", "named"):
        return "see its keys"
    if k.build == "always":
        return "yes"
    if k.build == "when-set":
        return "yes, when set"
    return f"yes: {k.rebuilds}" if k.rebuilds else f"no: {k.guard}" if k.guard else "no"


def reference_markdown() -> str:
    lines = [
        "# targets.toml reference",
        "",
        "Generated by `ortbuild schema --write` from the declaration of each key (`ortbuild/project/settings.py`, "
        "`ortbuild/project/sections.py`, `ortbuild/project/tables.py`); do not edit by hand. The same declarations "
        "drive validation, the JSON Schema (`ortbuild/targets.schema.json`) and the build key.",
        "",
        "*rebuilds*: whether changing the key rebuilds the artifacts it applies to (`ortbuild plan` says which "
        "part of the build key changed); a table's keys say it for themselves.",
        "",
    ]
    for table in TABLES:
        lines += [f"## `{_TITLES[table]}`", "", "| key | type | default | rebuilds | meaning |",
                  "|---|---|---|---|---|"]
        for k in TABLES[table]:
            kind = k.kind if not k.choices else " \\| ".join(k.choices)
            doc = k.doc.replace("|", "\\|")
            lines.append(f"| `{k.name}` | {kind} | {_fmt_default(k)} | {_fmt_rebuilds(k)} | {doc} |")
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
    lines += ["", "Refused: keys that make ONNX Runtime write, read or dump files are not options (docs/trust.md):", ""]
    lines += [f"- `{k}`: {why}" for k, why in sorted(FILE_CONFIG_KEYS.items())]
    lines += ["", f"Values are strings of at most {MAX_CONFIG_VALUE} characters (ONNX Runtime's limit); these must "
              "be `\"0\"` or `\"1\"`: " + ", ".join(f"`{k}`" for k in sorted(CONFIG_FLAGS - FILE_CONFIG_KEYS.keys()))
              + ". These must be integers (as strings): " + ", ".join(
                  f"`{k}` (at most {v})" for k, v in sorted(CONFIG_INTS.items()) if k not in FILE_CONFIG_KEYS) + ". "
              "`session.resource_cuda_partitioning_settings` takes a memory limit only: `\"LIMIT_KB,\"`.", ""]
    lines += ["## Provider options", "",
              "Checked for these providers (ONNX Runtime accepts any name silently; ortbuild refuses unknown "
              "names and values of the wrong kind). Other providers' options are passed through unchecked.", ""]
    for provider, opts in PROVIDER_OPTIONS.items():
        shown = ", ".join(f"`{n}` ({o.kind}{': ' + '/'.join(o.choices) if o.choices else ''})"
                          for n, o in opts.items()) or "none (use `[targets.NAME.session]`)"
        lines += [f"- **{provider}**: {shown}"]
    lines += ["", "## Names", "", f"Target and model names are {NAME_RULE}; they become directories under `dist/`, "
              f"so path syntax is refused, and so are {', '.join(f'`{n}`' for n in sorted(RESERVED_NAMES))}. "
              "A model's Python loader is the module `ortbuild_<name>` with `-` and `.` as `_` (docs/loaders.md), "
              "so two models whose names differ only in `-`, `.` and `_` are refused, naming both.", ""]
    return "\n".join(lines)
