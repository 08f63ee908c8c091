"""The layers of a target's settings, lowest first: option defaults -> the `extends` chain (parent first) -> the
target's own keys -> the `[[overrides]]` whose `models` globs match, in order: those it inherits (the parent's
first), then its own. So an override beats a target-level key whichever target declares either, and among the
overrides for a model the latest wins key by key. Accuracy rules follow their precision: a layer that changes
the precision's rule family drops the rules written for the one below.
"""

from __future__ import annotations

import copy
from typing import Any

from ortbuild.project import options, precisions
from ortbuild.project.checker import Checker, did_you_mean, matches, merge, short_repr

# marks overrides a target inherits through `extends`: the value names where it is declared ("base.overrides[0]")
INHERITED = "\0inherited"
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
    not_passed_on = options.not_inherited()
    for child in reversed(chain):  # each child over what it inherits
        inherited = copy.deepcopy(merged)
        # the parent's own overrides (not yet marked) become inherited ones; they may name models the child does
        # not build
        for i, o in enumerate([o for o in inherited.get("overrides", []) if not o.get(INHERITED)]):
            o[INHERITED] = f"{parent}.overrides[{i}]"
        for part in [inherited, *inherited.get("overrides", [])]:
            _drop(part, not_passed_on)  # e.g. a relative budget: it names a pair of targets
        was = inherited.get("precision", options.defaults("target")["precision"])
        if rule_family(raw[child].get("precision", was)) != rule_family(was):  # accuracy rules follow precision
            drop_accuracy(inherited, was, parent)
            for o in inherited.get("overrides", []):
                if "precision" not in o:  # its rule was written for the parent's precision too
                    drop_accuracy(o, was, o[INHERITED])
        merged = merge(inherited, raw[child])
        if "overrides" in raw[child]:  # after the inherited ones, not instead of them: the child's keys win
            merged["overrides"] = [*inherited.get("overrides", []), *copy.deepcopy(raw[child]["overrides"])]
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
    `[[overrides]]` whose `models` globs match, in order (the inherited ones first), over the target's keys; and
    the accuracy rules not inherited across precisions on the way."""
    eff = {k: target[k] for k in options.OVERRIDABLE}
    not_inherited = list(target.get(NOT_INHERITED, []))
    rules = [(name, eff["accuracy"])]  # the accuracy tables in `eff` since its rule family last changed, by origin
    own = 0
    for ov in target["overrides"]:
        where = ov.get(INHERITED) or f"{name}.overrides[{own}]"
        own += not ov.get(INHERITED)
        if not matches([model], ov["models"]):
            continue
        part = {k: v for k, v in ov.items() if k not in ("models", INHERITED, NOT_INHERITED)}
        not_inherited += ov.get(NOT_INHERITED, [])
        if "precision" in part and rule_family(part["precision"]) != rule_family(eff["precision"]):
            for origin, acc in rules:  # each rule so far was written for another precision: named where declared
                layer = {"accuracy": acc}
                drop_accuracy(layer, eff["precision"], origin)
                not_inherited += layer.get(NOT_INHERITED, [])
            dropped = {"accuracy": eff["accuracy"]}
            drop_accuracy(dropped, eff["precision"], name)
            eff["accuracy"], rules = dropped["accuracy"], []
        eff = merge(eff, part)
        if "accuracy" in part:
            rules.append((where, part["accuracy"]))
    return eff, not_inherited
