"""The layers of a target's settings, lowest first: option defaults -> the `extends` chain (parent first) -> the
target's own keys -> its `[[overrides]]` whose `models` globs match, in order. Accuracy rules follow their
precision: a layer that changes the precision's rule family drops the rules written for the one below.
"""

from __future__ import annotations

import copy
from typing import Any

from ortbuild.project import options, precisions
from ortbuild.project.checker import Checker, did_you_mean, matches, merge, short_repr

INHERITED = "\0inherited"  # marks overrides a target inherits through `extends`
# what a target or override notes about the accuracy rules it did not inherit across precisions (`ortbuild plan`)
NOT_INHERITED = "\0accuracy-not-inherited"


def resolve_extends(chk: Checker, raw: dict[str, Any], name: str,
                     done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The target's table merged over its `extends` chain, parent first. Iterative (chains can be long), and
    each target is resolved once (`done` keeps the results)."""
    chain = [name]
    while chain[-1] not in done and (parent := raw[chain[-1]].get("extends")) is not None:
        where = f"targets.{chain[-1]}.extends"
        if parent not in raw:
            raise chk.fail(where, f"unknown target {short_repr(parent)}{did_you_mean(parent, list(raw))}")
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
            _drop(part, options.not_inherited())  # e.g. a relative budget: it names a pair of targets
        was = inherited.get("precision", options.defaults("target")["precision"])
        if rule_family(raw[child].get("precision", was)) != rule_family(was):  # accuracy rules follow precision
            drop_accuracy(inherited, was, parent)
            for i, o in enumerate(inherited.get("overrides", [])):
                if "precision" not in o:  # its rule was written for the parent's precision too
                    drop_accuracy(o, was, f"{parent}.overrides[{i}]")
        merged = merge(inherited, raw[child])
        merged.pop("extends", None)
        done[child] = merged
        parent = child
    return copy.deepcopy(merged)


def _drop(table: dict[str, Any], keys: dict[str, Any]) -> None:
    """Remove the keys `extends` does not pass on (tables.not_inherited()) from an inherited table."""
    for k, inner in keys.items():
        if inner is True:
            table.pop(k, None)
        elif isinstance(table.get(k), dict):
            table[k] = dict(table[k])
            _drop(table[k], inner)


def rule_family(precision: object) -> tuple[object, ...]:
    """Precisions whose accuracy rules carry over to each other (PrecisionRule.rule_family); an unknown name (not
    validated yet) stands alone."""
    r = precisions.find(precision)
    return (precision,) if r is None else r.rule_family


def drop_accuracy(table: dict[str, Any], precision: str, where: str) -> None:
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


def overridden(target: dict[str, Any], name: str, model: str) -> tuple[dict[str, Any], list[str]]:
    """The overridable keys of target `name` (its table after `extends` and defaults) for one model: its
    `[[overrides]]` whose `models` globs match, in order, over the target's keys; and the accuracy rules not
    inherited across precisions on the way."""
    eff = {k: target[k] for k in options.OVERRIDABLE}
    not_inherited = list(target.get(NOT_INHERITED, []))
    for ov in target["overrides"]:
        if matches([model], ov["models"]):
            part = {k: v for k, v in ov.items() if k not in ("models", INHERITED, NOT_INHERITED)}
            not_inherited += ov.get(NOT_INHERITED, [])
            if "precision" in part and rule_family(part["precision"]) != rule_family(eff["precision"]):
                dropped = {"accuracy": eff["accuracy"]}  # the rule so far was written for another precision
                drop_accuracy(dropped, eff["precision"], name)
                eff["accuracy"] = dropped["accuracy"]
                not_inherited += dropped.get(NOT_INHERITED, [])
            eff = merge(eff, part)
    return eff, not_inherited
