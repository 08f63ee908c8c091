"""The `[[targets.X.overrides]]` table that accepts a failed accuracy gate's difference: the tolerance it would
have passed with, ready to paste into targets.toml.

Only for the rules that have a smallest passing value (ortbuild.gating.measure.compare): elementwise `atol` (or `rtol`,
or `mismatch_fraction`, shown as the other ways), `cosine`, `top1`, `top5`. A failed shape, dtype, NaN/Inf,
exact or structure check has none: then no table is offered. A value is rounded to 2 significant digits in
the direction that still passes (a tolerance up, a least similarity down), and every table is checked before it
is shown: targets.toml parsed with it appended must give the job rules under which every compared output passes,
and leave its other settings and budgets as they were (pasted into a target that extends another, the table merges
with the overrides it inherits: docs/targets.md).

Precisions with a precision search (fp16, int8, int4: `ortbuild test --explain`) get no table here: the search
prints the override that keeps nodes in float, which fixes the difference instead of accepting it. Nor does a model
whose expected outputs `ortbuild init` recorded, when its source itself no longer gives them (damaged or retrained
weights): a tolerance would accept a broken model; the source changed, and that is said (advice).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from ortbuild.artifact import golden
from ortbuild.errors import OrtbuildError
from ortbuild.gating.measure import compare
from ortbuild.gating.records import Rule
from ortbuild.project import config, expected, precisions
from ortbuild.project.plan import Job

TOLERANCES = ("atol", "rtol", "mismatch_fraction")  # larger passes more
SIMILARITIES = ("cosine", "top1", "top5")            # smaller passes more
LOOSENABLE = {"elementwise", *SIMILARITIES}          # the failed checks a tolerance can accept
# what ONNX Runtime's layout-changing levels cost fp32 results, measured on PaddleOCR's text detector
# (ch_PP-OCRv4_det) against the unoptimized reference: max abs diff 4.8e-5 at basic and extended, 1.0e-4 at all;
# said where the level is one of those and no output is off by more than LEVEL_SCALE (a larger difference is
# not the level's doing)
LEVEL_SCALE = 1e-3
LEVEL_NOTE = ("at optimization \"{level}\", ONNX Runtime's graph rewrites change fp32 results by about 1e-4",
              "(PaddleOCR's text detector: max abs diff 4.8e-5 at basic and extended, 1.0e-4 at all); the other way:",
              "optimization = \"extended\" keeps closer to the reference instead of loosening the rule")


@dataclass(frozen=True)
class Pasteable:
    """A table to paste, and the other ways (`accuracy = {...}` lines) that accept the difference as well."""

    text: str
    alternatives: tuple[str, ...]

    def lines(self, file: str) -> list[str]:
        """How the failure report shows it (indented: TOML ignores the leading spaces when it is pasted)."""
        return [f"accuracy: to accept this difference, paste into {file}:",
                *(f"    {line}" for line in self.text.rstrip("\n").splitlines())]


def round_up(x: float, digits: int = 2) -> float:
    """`x` rounded up to `digits` significant digits (0 and below: 0)."""
    if not x > 0:
        return 0.0
    d = Decimal(repr(float(x)))
    step = Decimal(1).scaleb(d.adjusted() - digits + 1)
    return float(d.quantize(step, rounding=ROUND_CEILING))


def round_down_similarity(x: float, digits: int = 2) -> float:
    """A least similarity (cosine, agreement) at most `x`: 1 - (1 - x) rounded up to `digits` significant
    digits, so 0.9995321 gives 0.99953."""
    if x >= 1.0:
        return 1.0
    gap = Decimal(repr(round_up(1.0 - x, digits)))
    return float(Decimal(1) - gap)


def _inline(values: dict[str, float]) -> str:
    return "{ " + ", ".join(f"{config.toml_key(k)} = {v!r}" for k, v in values.items()) + " }"


def needs(results: Sequence[compare.OutputResult]) -> dict[str, dict[str, float]] | None:
    """Per failing output, the value of each rule key that would pass every data set; None when a failed check
    has no such value (shape, dtype, NaN/Inf, exact, structure) or nothing failed."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if r.passed:
            continue
        failed = {c.metric for c in r.failed_checks}
        if failed - LOOSENABLE:
            return None
        want = out.setdefault(r.output, {})
        s = r.stats
        if "elementwise" in failed:
            t = s["passing_tolerance"]
            want["atol"] = max(want.get("atol", 0.0), round_up(t["atol"]))
            if t["rtol"] != float("inf"):
                want["rtol"] = max(want.get("rtol", 0.0), round_up(t["rtol"]))
            else:
                want["rtol"] = float("inf")
            want["mismatch_fraction"] = max(want.get("mismatch_fraction", 0.0), round_up(s["mismatch_fraction"]))
        if "cosine" in failed:
            want["cosine"] = min(want.get("cosine", 1.0), round_down_similarity(s["cosine"]))
        for _, k, stat in compare.TOP_K:
            if k in failed:
                want[k] = min(want.get(k, 1.0), round_down_similarity(s[stat]))
    return out or None


def _variants(want: dict[str, dict[str, float]]) -> list[dict[str, dict[str, float]]]:
    """The rule changes to offer, first the one shown as the table: the elementwise failures accepted by `atol`
    (then by `rtol`, then by `mismatch_fraction`), with the similarities each output needs."""
    out = []
    for way in TOLERANCES:
        v: dict[str, dict[str, float]] = {}
        for output, keys in want.items():
            chosen = {k: x for k, x in keys.items() if k in SIMILARITIES}
            if way in keys:
                if keys[way] == float("inf"):
                    break
                chosen[way] = keys[way]
            v[output] = chosen
        else:
            if v not in out:
                out.append(v)
    return out


def _accuracy_value(job: Job, change: dict[str, dict[str, float]], outputs: Sequence[str]) -> str:
    """The inline `accuracy = {...}` value of one rule change: a key goes into the output's own table where the
    output's rule sets it there, or where other outputs of the model did not fail (they keep their rule); else
    into the model's rule."""
    gates = job.settings.gates
    assert gates is not None
    own = gates.accuracy.get("outputs", {})
    top: dict[str, float] = {}
    per: dict[str, dict[str, float]] = {}
    for output, keys in change.items():
        for k, v in keys.items():
            if k in own.get(output, {}) or set(outputs) - set(change):
                per.setdefault(output, {})[k] = v
            else:  # every output failed: the model's rule, as loose as the loosest output needs
                top[k] = max(top.get(k, v), v) if k in TOLERANCES else min(top.get(k, v), v)
    parts = [f"{config.toml_key(k)} = {v!r}" for k, v in top.items()]
    parts += [f"outputs.{config.toml_key(o)} = {_inline(keys)}" for o, keys in per.items()]
    return "{ " + ", ".join(parts) + " }"


def table(job: Job, accuracy: str, alternatives: Sequence[str], max_abs: float = float("inf")) -> str:
    """The `[[targets.X.overrides]]` text for the job, with comments that say what it does (`max_abs`: the
    largest absolute difference of a failed output)."""
    name = f"{job.target.name}/{job.model.name}"
    lines = [f"# {name}: a looser tolerance accepts this difference (it does not remove it)",
             f"[[targets.{config.toml_key(job.target.name)}.overrides]]",
             f"models = {json.dumps([job.model.name])}",
             f"accuracy = {accuracy}"]
    lines += [f"# or instead: accuracy = {a}" for a in alternatives]
    level = job.settings.optimization
    if job.settings.precision == "fp32" and precisions.LEVEL_RULES[level].nchwc and max_abs <= LEVEL_SCALE:
        lines += ["# " + line.format(level=level) for line in LEVEL_NOTE]
    return "\n".join(lines) + "\n"


def passes(project: config.Project, job: Job, text: str,
           compared: Sequence[tuple[compare.OutputResult, object, object]]) -> bool:
    """Whether targets.toml with `text` appended loads and gives the job a rule under which each compared output
    (its result, expected, actual) passes, and the job's other settings and budgets unchanged."""
    try:
        settings = config.load_pasted(project.file, text).targets[job.target.name].settings[job.model.name]
    except (OSError, OrtbuildError, KeyError):  # a read-only project, or a table that does not load: not offered
        return False
    gates, was = settings.gates, job.settings.gates
    assert gates is not None and was is not None
    if settings != job.settings or (gates.latency, gates.size, gates.memory) != (was.latency, was.size, was.memory):
        return False
    return all(compare.compare(r.output, r.dataset, e, a, gates.accuracy_rule(job.settings.precision, r.output)).passed
               for r, e, a in compared)


def pasteable(project: config.Project, job: Job, outputs: Sequence[str],
              compared: Sequence[tuple[compare.OutputResult, object, object]]) -> Pasteable | None:
    """The table that accepts the failed outputs among `compared` (each output's result, expected and actual
    values; `outputs`: the model's compared output names), checked; None where no tolerance accepts them or the
    job's precision has a precision search (its own override)."""
    if job.settings.rule.knob is not None:
        return None
    want = needs([r for r, _, _ in compared])
    if want is None:
        return None
    values = [_accuracy_value(job, v, outputs) for v in _variants(want)]
    kept = [v for v in values if passes(project, job, table(job, v, []), compared)]
    if not kept:
        return None
    max_abs = max(float(r.stats.get("max_abs", float("inf"))) for r, _, _ in compared if not r.passed)
    return Pasteable(table(job, kept[0], kept[1:], max_abs), tuple(kept[1:]))


def advice(project: config.Project, job: Job, outputs: Sequence[str],
           compared: Sequence[tuple[compare.OutputResult, object, object]], g: golden.Golden) -> list[str]:
    """What a failed accuracy gate offers: where `ortbuild init` recorded the expected outputs and the source itself
    no longer gives them, that the source changed (never a tolerance that would accept it); else the pasteable
    table, if there is one."""
    if g.made_by.startswith(f"recorded by {expected.RECORDED_BY}") and (moved := source_moved(job, g)):
        return [f"accuracy: {job.name}: the source model itself no longer gives the expected outputs "
                f"{expected.RECORDED_BY} recorded ({job.model.expected}): {moved}. It changed since they were "
                f"recorded (damaged or retrained weights?): restore it, or where the change is meant, record its "
                f"outputs again: {expected.REFRESH}"]
    table = pasteable(project, job, outputs, compared)
    return table.lines(project.file.name) if table is not None else []


def source_moved(job: Job, g: golden.Golden) -> str:
    """How the source's own fp32 outputs on the golden inputs differ from the expected ones, beyond fp32's rule
    ("" where they do not)."""
    values, _ = golden.compute(job.model.path, [ds.inputs for ds in g.sets], job.settings.custom_ops)
    rule: Rule = {**precisions.rule("fp32").accuracy, "mismatch_fraction": 0.0}
    moved = [f"'{name}' {golden.moved_by(want, got.get(name))}" for ds, got in zip(g.sets, values, strict=True)
             for name, want in ds.expected.items()
             if not compare.compare(name, ds.name, want, got.get(name), rule).passed]
    return ", ".join(moved)
