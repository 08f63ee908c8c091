"""Which (target, model) jobs a command works on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .config import Model, Project, Settings, Target, did_you_mean, matches
from .errors import ConfigError


@dataclass(frozen=True)
class Job:
    target: Target
    model: Model
    settings: Settings

    @property
    def name(self) -> str:
        return f"{self.target.name}/{self.model.name}"


def _select(names: Sequence[str], patterns: Sequence[str] | None, what: str, file: str) -> list[str]:
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
    selected_targets = _select(list(project.targets), targets, "targets", file)
    selected_models = _select(list(project.models), models, "models", file)
    out = []
    for t in selected_targets:
        target = project.targets[t]
        out += [Job(target, project.models[m], target.settings[m])
                for m in target.models if m in selected_models]
    return out
