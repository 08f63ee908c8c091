"""Which (target, model) jobs a command works on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ortbuild.errors import ConfigError
from ortbuild.project import options
from ortbuild.project.config import Model, Project, Settings, Target, did_you_mean, matches
from ortbuild.project.lock_entry import Entry


@dataclass(frozen=True)
class Job:
    target: Target
    model: Model
    settings: Settings
    locked: Entry | None = field(default=None, compare=False)  # the targets.lock entry laid over its settings

    @property
    def name(self) -> str:
        return f"{self.target.name}/{self.model.name}"


def select(names: Sequence[str], patterns: Sequence[str] | None, what: str, file: str) -> list[str]:
    """The names that match `patterns` (-t/-m globs), in the patterns' order, each once; all of them without
    patterns. A pattern that matches nothing is a config error naming `file` and the names there are."""
    if not patterns:
        return list(names)
    chosen = []
    for pat in patterns:
        hits = matches(list(names), [pat])
        if not hits:
            raise ConfigError(file, what, f"no {what[:-1]} matches '{pat}'{did_you_mean(pat, list(names))}",
                              f"the {what} are: {', '.join(names)}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def jobs(project: Project, targets: Sequence[str] | None = None,
         models: Sequence[str] | None = None) -> list[Job]:
    file = str(project.file)
    selected_targets = select(list(project.targets), targets, "targets", file)
    selected_models = select(list(project.models), models, "models", file)
    out = []
    for t in selected_targets:
        target = project.targets[t]
        out += [Job(target, project.models[m], target.settings[m])
                for m in target.models if m in selected_models]
    return out


_AT_LEAST = ("cosine", "top1", "top5")


def _rule_text(rule: dict[str, Any]) -> str:
    parts = []
    for k, v in rule.items():
        if k == "ignore":
            parts += ["ignored"] if v else []
        elif v is not None and not (k == "mismatch_fraction" and not v):
            parts.append(f"{k} >= {v:g}" if k in _AT_LEAST else f"{k} {v:g}")
    return ", ".join(parts) or "-"


def accuracy_text(job: Job) -> str:
    """How `ortbuild test` judges the job's outputs and where the rule comes from, e.g. "cosine >= 0.99
    (int8-dynamic default; the fp32 rule of cpu-fp32 is not inherited across precisions)"."""
    gates, precision = job.settings.gates, job.settings.precision
    if gates is None:
        return "-"
    unset = {k.name: k.default for k in options.TABLES["accuracy"]}
    own = {k: v for k, v in gates.accuracy.items() if k != "outputs" and v != unset.get(k)}
    rule = dict(job.settings.rule.accuracy) | own
    text = _rule_text(rule) + "".join(f"; outputs.{name}: {_rule_text(r)}"
                                      for name, r in gates.accuracy.get("outputs", {}).items())
    origin = [f"targets.toml over the {precision} default" if own else f"{precision} default"]
    dropped = list(gates.not_inherited)
    if dropped:
        names = dropped[0] if len(dropped) == 1 else ", ".join(dropped[:-1]) + " and " + dropped[-1]
        origin.append(f"{names} {'is' if len(dropped) == 1 else 'are'} not inherited across precisions")
    return f"{text} ({'; '.join(origin)})"


def accuracy_lines(jobs: Iterable[Job]) -> list[str]:
    """One line per target whose models share a rule, else one per job: `ortbuild plan`'s accuracy section."""
    by_target: dict[str, list[tuple[str, str]]] = {}
    for j in jobs:
        by_target.setdefault(j.target.name, []).append((j.model.name, accuracy_text(j)))
    lines = []
    for target, texts in by_target.items():
        if len({t for _, t in texts}) == 1:
            lines.append(f"  {target}: {texts[0][1]}")
        else:
            lines += [f"  {target}/{model}: {text}" for model, text in texts]
    return lines
