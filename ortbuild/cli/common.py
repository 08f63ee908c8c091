"""What the commands share: where dist/ is."""

from __future__ import annotations

from pathlib import Path

from ortbuild.project import config


def dist_dir(dist: str | None, project: config.Project) -> Path:
    """--dist, else dist/ beside targets.toml."""
    return Path(dist) if dist else project.root / "dist"
