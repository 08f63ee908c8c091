"""Every targets.toml key and the vocabularies they take, under one name.

Each key is declared once, as a `setting()` field of the dataclass that holds its value (ortbuild.project.declare;
the fields live in ortbuild.project.settings and ortbuild.project.sections). The key tables derived from them drive
validation (ortbuild.project.config), the shipped JSON Schema (ortbuild/targets.schema.json), the reference docs
(docs/targets-reference.md) and the build key. Regenerate the schema and docs with `ortbuild schema --write`.
The parts live in one module per concept; this module gathers them under one name:

- ortbuild.project.precisions: precisions, optimization levels, formats and platforms, as rule objects
- ortbuild.project.tables: the key tables of targets.toml, derived from the declarations
- ortbuild.project.providers: execution providers, the runtimes that offer them, their options
- ortbuild.project.session_keys: session config keys and the keys ortbuild reserves
- ortbuild.project.schema: the JSON Schema and reference docs generated from the tables

All of them are stdlib + packaging only: the noxfile imports them (through ortbuild.project.config) before any venv
exists.
"""

from __future__ import annotations

from ortbuild.project.precisions import (
    ARM_RUNNER,
    FORMATS,
    FP16,
    FP32,
    FP32_ACCURACY,
    INT4_WEIGHT,
    INT8_DYNAMIC,
    INT8_STATIC,
    LEVEL_RULES,
    LEVELS,
    PLATFORMS,
    PORTABLE_LEVEL,
    PRECISION_RULES,
    PRECISIONS,
    RULES,
    Format,
    Level,
    LevelRule,
    Precision,
    PrecisionRule,
    Quantizer,
    SearchKnob,
    cap_level,
    find,
    rule,
)
from ortbuild.project.providers import (
    COMPILING_PROVIDERS,
    CUSTOM_OP_MODULES,
    EPCONTEXT_PROVIDERS,
    LIBRARY_SUFFIXES,
    PLAINTEXT_OPTIONS,
    PLUGIN_DEVICE_TYPES,
    PLUGIN_IGNORED,
    PLUGIN_OPTIONS,
    PLUGINS,
    PRECISION_HINTS,
    PROVIDER_DEFAULTS,
    PROVIDER_OPTIONS,
    PROVIDERS,
    RUNTIMES,
    PluginEP,
    ProviderOption,
    provider_option_problem,
)
from ortbuild.project.schema import json_schema, reference_markdown, schema_text
from ortbuild.project.session_keys import (
    CONFIG_FLAGS,
    CONFIG_INTS,
    FILE_CONFIG_KEYS,
    INT_MAX,
    KNOWN_OPTIMIZERS,
    NUMBER_MAX,
    RESERVED_CONFIG_KEYS,
    SESSION_CONFIG_KEYS,
    config_value_problem,
)
from ortbuild.project.tables import (
    ACCURACY_RULE,
    FUSION_INFERS_SIZES,
    FUSION_MODEL_TYPES,
    FUSION_OFF,
    KINDS,
    OVERRIDABLE,
    TABLES,
    Key,
    defaults,
    keys,
    not_inherited,
)

__all__ = [
    "ACCURACY_RULE", "ARM_RUNNER", "COMPILING_PROVIDERS", "CONFIG_FLAGS", "CONFIG_INTS", "CUSTOM_OP_MODULES",
    "EPCONTEXT_PROVIDERS", "FILE_CONFIG_KEYS", "FORMATS", "FP16", "FP32", "FP32_ACCURACY", "FUSION_INFERS_SIZES",
    "FUSION_MODEL_TYPES",
    "FUSION_OFF", "INT4_WEIGHT", "INT8_DYNAMIC", "INT8_STATIC", "INT_MAX", "KINDS", "KNOWN_OPTIMIZERS", "LEVELS",
    "LEVEL_RULES", "LIBRARY_SUFFIXES", "NUMBER_MAX", "OVERRIDABLE", "PLAINTEXT_OPTIONS", "PLATFORMS", "PLUGINS",
    "PLUGIN_DEVICE_TYPES", "PLUGIN_IGNORED", "PLUGIN_OPTIONS", "PORTABLE_LEVEL", "PRECISIONS", "PRECISION_HINTS",
    "PRECISION_RULES", "PROVIDERS", "PROVIDER_DEFAULTS", "PROVIDER_OPTIONS", "RESERVED_CONFIG_KEYS", "RULES",
    "RUNTIMES", "SESSION_CONFIG_KEYS", "TABLES", "Format", "Key", "Level", "LevelRule", "PluginEP", "Precision",
    "PrecisionRule", "ProviderOption", "Quantizer", "SearchKnob", "cap_level", "config_value_problem", "defaults",
    "find", "json_schema", "keys", "not_inherited", "provider_option_problem", "reference_markdown", "rule",
    "schema_text",
]
