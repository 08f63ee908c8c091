"""The rollback model outside the loaders (docs/container.md, "Rollback protection"): the epoch of artifacts
in dist/, of a release, and of a deployment `ortbuild pull` made, and the floors each command holds them to.

An artifact's epoch is its signed manifest's `epoch` ([project] epoch when it was built). A release's epoch is
the lowest of its artifacts' (the weakest one decides what the release lets back in). Each refusal here is
`RolledBack` (exit 7), or a `ConfigError` (exit 3) for a lowered [project] epoch, naming what and what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild import files as files_
from ortbuild.artifact import manifest, manifest_types
from ortbuild.errors import ArtifactError, ConfigError, RolledBack

if TYPE_CHECKING:
    from ortbuild.project.config import Project


@dataclass(frozen=True)
class Floor:
    """A minimum epoch a release must reach: `why` names where it comes from (a flag, a deployment), `hint` what
    to do when the release is below it."""

    epoch: int
    why: str     # what sets it, with the number: "--min-epoch 2", "epoch 1 of the release already deployed in ..."
    hint: str


def release_epoch(epochs: Mapping[str, int]) -> int:
    """The epoch of a release whose artifacts (by model) have these epochs: the lowest."""
    return min(epochs.values(), default=0)


def describe(epochs: Mapping[str, int]) -> str:
    """'epoch 1' when every artifact has the same, else 'epoch 0 (a 0, b 1)'."""
    lowest = release_epoch(epochs)
    if len(set(epochs.values())) <= 1:
        return f"epoch {lowest}"
    return f"epoch {lowest} (" + ", ".join(f"{m} {e}" for m, e in sorted(epochs.items())) + ")"


def check(name: str, epochs: Mapping[str, int], floors: Iterable[Floor]) -> None:
    """Refuse the release `name` (its artifacts' epochs by model) when it is below any of `floors`."""
    lowest = release_epoch(epochs)
    for floor in floors:
        if lowest < floor.epoch:
            below = sorted(m for m, e in epochs.items() if e < floor.epoch)
            raise RolledBack(f"{name}: {describe(epochs)}, below {floor.why}: its {', '.join(below)} would roll back "
                             "to older, superseded artifacts", floor.hint)


def below_project(project: Project, target: str, epochs: Mapping[str, int]) -> None:
    """`release`: refuse a target whose artifacts (epochs by model) are below [project] epoch, naming each and the
    command that rebuilds them at the current epoch. --force does not override it: tests are not the question."""
    old = {m: e for m, e in epochs.items() if e < project.epoch}
    if old:
        raise RolledBack(
            f"{target}: release refused: artifacts below [project] epoch = {project.epoch} ({project.file.name}):"
            + "".join(f"\n  {target}/{m}: epoch {e} (built before the epoch was raised, or an older artifact put "
                      "back)" for m, e in sorted(old.items())),
            f"rebuild and test them at epoch {project.epoch}: `ortbuild test -t {target}` (or `python3 -m nox -s "
            f"\"test({target})\"`), then release again; their loaders pin MIN_EPOCH = {min(old.values())} and would "
            "load the older artifacts too")


def in_dist(project: Project, dist: Path) -> dict[str, int]:
    """The epochs of the project's artifacts already in dist/ (by target/model); an unreadable manifest is left
    out (the build reports it)."""
    found = {}
    for target in project.targets.values():
        for model in target.models:
            folder = dist / target.name / model
            if not (folder / manifest_types.MANIFEST).is_file():
                continue
            try:
                m, _ = manifest.read(folder)
            except ArtifactError:
                continue
            found[f"{target.name}/{model}"] = m.epoch
    return found


def decrease(project: Project, dist: Path, *, allowed: bool) -> str | None:
    """`build`/`test`/`profile`: a [project] epoch lower than that of artifacts already in dist/ is a config
    error (ConfigError, 3) unless `allowed` (--allow-epoch-decrease), then a warning to print. None: no decrease."""
    higher = {k: e for k, e in in_dist(project, dist).items() if e > project.epoch}
    if not higher:
        return None
    old = max(higher.values())
    shown = ", ".join(sorted(higher)[:4]) + (f" and {len(higher) - 4} more" if len(higher) > 4 else "")
    what = (f"epoch = {project.epoch} is lower than {old}, the epoch of the artifacts already in {dist} ({shown})")
    if allowed:
        return (f"{project.file.name}: [project] {what}: lowered from {old} to {project.epoch} "
                "(--allow-epoch-decrease): they are rebuilt, and their new loaders accept artifacts of epoch "
                f"{project.epoch} again")
    raise ConfigError(str(project.file), "project",
                      f"{what}: lowering the epoch lets the older artifacts it retired load again (rollback)",
                      f"set `epoch = {old}` (or higher) in [project] again; if the lower epoch is intended, pass "
                      "--allow-epoch-decrease")


def deployed(folder: Path, public_key: bytes) -> tuple[str, dict[str, int]] | None:
    """The release `ortbuild pull` placed in `folder`: its name and its artifacts' epochs (by model), read from its
    index (release.json) and its manifests, whose signatures must verify with `public_key` (only signed epochs
    count); None when `folder` is empty or absent. A deployment whose epoch cannot be told (no manifest left, a
    manifest unreadable or not signed by that key) is ArtifactError."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    damaged = ("pull with --allow-downgrade to replace it anyway (after checking why: a release signed with a key "
               "you have since rotated is one reason)")
    name = folder.name
    try:
        index = json.loads(files_.read_document(folder / "release.json"))
        name = str(index["name"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    epochs = {}
    for f in sorted(folder.glob(f"*/{manifest_types.MANIFEST}")):
        try:
            if (problem := manifest.signature_problem(f.parent, public_key)) is not None:
                raise ArtifactError(problem)
            m, _ = manifest.read(f)
        except ArtifactError as e:
            raise ArtifactError(f"{folder}: cannot tell the epoch of the release deployed there: {e.message}",
                                damaged) from None
        epochs[f.parent.name] = m.epoch
    if not epochs:
        raise ArtifactError(f"{folder}: cannot tell the epoch of the release deployed there: it holds no "
                            f"{manifest_types.MANIFEST}", damaged)
    return name, epochs


def floors(min_epoch: int) -> list[Floor]:
    """`verify`/`pull --min-epoch N` (0: none)."""
    return [Floor(min_epoch, f"--min-epoch {min_epoch}", "use a release built at that epoch or later: an older one "
                                                        "lets superseded artifacts load again")] if min_epoch else []


def downgrade_floor(folder: Path, there: tuple[str, dict[str, int]]) -> Floor:
    """`pull --to folder` without --allow-downgrade: the release deployed there (`deployed(folder)`) is the floor."""
    name, epochs = there
    return Floor(release_epoch(epochs), f"{describe(epochs)} of the release already deployed in {folder} ({name})",
                 "a newer release is deployed there: pull one of its epoch or later; --allow-downgrade replaces it "
                 "with the older one on purpose")
