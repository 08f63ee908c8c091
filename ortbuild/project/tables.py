"""The key tables of targets.toml, derived from the settings dataclasses that declare each key once
(ortbuild.project.declare): validation (ortbuild.project.checker), the JSON Schema and the reference docs
(ortbuild.project.schema) read them. The few keys no dataclass holds (`extends`, `overrides`, the accuracy rule,
a data set's budgets and scenarios) are declared here. Stdlib + packaging only (the noxfile imports it through
ortbuild.project.config).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ortbuild.project.declare import KINDS, Key, keys_of, sub_tables
from ortbuild.project.precisions import PRECISIONS
from ortbuild.project.sections import FUSION_INFERS_SIZES, FUSION_MODEL_TYPES, FUSION_OFF, MS_MAX, SCENARIOS
from ortbuild.project.settings import Gates, Model, Project, Settings, Target

__all__ = ["ACCURACY_RULE", "FUSION_INFERS_SIZES", "FUSION_MODEL_TYPES", "FUSION_OFF", "KINDS", "OVERRIDABLE", "TABLES",
           "Key", "defaults", "keys", "not_inherited"]

# the keys of a target that can differ per model (the rest are target-wide): what a job's settings hold
_PER_MODEL = (*keys_of(Settings), *keys_of(Gates))
OVERRIDABLE = tuple(k.name for k in _PER_MODEL)

EXTENDS = Key(name="extends", kind="string", default=None, build="never", inherited=False,
              doc="Name of another target whose keys this one inherits: tables merge key by key, any other value "
                  "(a list included) is replaced, and this target's `[[overrides]]` come after the inherited ones "
                  "rather than replacing them. Chains are allowed, cycles are an error. A relative budget "
                  "(`latency.faster_than`) is not inherited, nor an accuracy rule across precisions. See "
                  "docs/targets.md, Layers.")
OVERRIDES = Key(name="overrides", kind="tables", table="override", default=[], build="never",
                rebuilds="each job's settings hold the keys of the overrides that match its model",
                doc="Ordered per-model overrides: each `[[targets.X.overrides]]` has `models` (globs) and any "
                    f"of the keys {', '.join(OVERRIDABLE)}. They apply over the target-level keys (its own and "
                    "inherited) and after the overrides inherited through `extends`, which they add to, never "
                    "replace: for a model, the latest override to set a key wins, and tables merge key by key. "
                    "See docs/targets.md, Layers.")
OVERRIDE_MODELS = Key(name="models", kind="strings", required=True, build="never",
                      doc="Glob patterns of the models it applies to.")
CANDIDATE = (Key(name="precision", kind="string", required=True, build="never", choices=PRECISIONS,
                 doc="The candidate's precision."),
             *(Key(name=t, kind="table", table=t, default=None, build="never",
                   doc=f"Its `{t}` options, laid over the target's key by key.") for t in ("quantization", "int4",
                                                                                          "fp16")))
DATA_SET = (*(Key(name=f"p{p}_ms", kind="number", default=None, maximum=MS_MAX, build="never",
                   doc=f"Budget of the {what} latency on this data set, in ms.")
               for p, what in (("50", "median"), ("90", "90th percentile"), ("99", "99th percentile"))),
            *(Key(name=kind, kind="table", table=f"latency_{kind}", default=None, build="never",
                  doc=f"The `{kind}` load scenario on this data set: its keys over the target's "
                      f"`[targets.X.latency.{kind}]` key by key (where the target has none, a complete table of its "
                      "own: the scenario then runs on this data set alone). See docs/testing.md, Load scenarios.")
              for kind in SCENARIOS))

ACCURACY_RULE = (
    Key(name="rtol", kind="number", default=None, maximum=1e6, build="never",
        doc="Elementwise rule |actual - expected| <= atol + rtol * |expected| (fp32 default 1e-4)."),
    Key(name="atol", kind="number", default=None, maximum=1e6, build="never",
        doc="Elementwise absolute tolerance (fp32 default 1e-5)."),
    Key(name="mismatch_fraction", kind="number", default=0.0, maximum=1, build="never",
        doc="Fraction of elements allowed to break the elementwise rule (e.g. 0.02 for detection masks)."),
    Key(name="cosine", kind="number", default=None, maximum=1, build="never",
        doc="Least cosine similarity of actual and expected (flattened); fp16 default 0.999, int8/int4 0.99."),
    Key(name="top1", kind="number", default=None, maximum=1, build="never",
        doc="Least fraction of rows whose arg-max over the last axis (the classes) agrees with the golden one. "
            "Set it on classifier outputs (`[targets.X.accuracy.outputs.logits] top1 = 0.99`)."),
    Key(name="top5", kind="number", default=None, maximum=1, build="never",
        doc="Least fraction of rows whose expected arg-max is among the actual top 5."),
)
ACCURACY = (*ACCURACY_RULE, Key(
    name="outputs", kind="named", table="output_accuracy", default={}, build="never",
    doc="Per-output rules `[targets.X.accuracy.outputs.NAME]`, over the target's rule. Integer, boolean "
        "and string outputs (and the keys of sequence/map outputs) always match exactly."))
OUTPUT_ACCURACY = (*ACCURACY_RULE, Key(
    name="ignore", kind="boolean", default=False, build="never",
    doc="Do not compare this output (say why in a comment)."))

TABLES: dict[str, tuple[Key, ...]] = {
    "project": keys_of(Project),
    "model": keys_of(Model),
    **{name: keys_of(cls) for name, cls in sub_tables(Model).items()},  # [models.NAME.eval]
    "target": (EXTENDS, *keys_of(Target), *_PER_MODEL, OVERRIDES),
    "override": (OVERRIDE_MODELS, *(dataclasses.replace(k, required=False) for k in _PER_MODEL)),
    "accuracy": ACCURACY,
    "output_accuracy": OUTPUT_ACCURACY,
    "latency_data_set": DATA_SET,
    "candidate": CANDIDATE,
    **{name: keys_of(cls) for name, cls in {**sub_tables(Settings), **sub_tables(Gates)}.items()},
}


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


def not_inherited(table: str = "target") -> dict[str, Any]:
    """The keys `extends` does not pass on, under `table`: {key: True} for one of its own keys, {key: {...}} for
    those of a sub-table (`{"extends": True, "latency": {"faster_than": True}}`)."""
    out: dict[str, Any] = {}
    for k in TABLES[table]:
        if not k.inherited:
            out[k.name] = True
        elif k.kind == "table" and k.table and (inner := not_inherited(k.table)):
            out[k.name] = inner
    return out
