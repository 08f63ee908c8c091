"""What the commands share: the text table, sizes, and where dist/ is."""

from __future__ import annotations

import argparse
from pathlib import Path

from ortbuild.project import config


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*r) for r in rows)])


def dist_dir(args: argparse.Namespace, project: config.Project) -> Path:
    """--dist, else dist/ beside targets.toml."""
    return Path(args.dist) if args.dist else project.root / "dist"
