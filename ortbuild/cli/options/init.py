"""The flags and options of `ortbuild init` (cli.init runs it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ortbuild.cli import options
from ortbuild.project import presets

if TYPE_CHECKING:
    from ortbuild.cli.options import Subparsers


def dim(text: str) -> tuple[str, int]:
    """--dim NAME=N: a symbolic dimension's size in generated golden inputs."""
    name, _, value = text.partition("=")
    if not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': write NAME=N with N >= 1, e.g. --dim batch=1")
    return name, int(value)


@dataclass(frozen=True)
class InitOptions:
    paths: tuple[str, ...]       # models, or folders holding them
    target: tuple[str, ...]      # presets; () is the default ones
    dim: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...]      # [MODEL=]PATH
    force: bool                  # replace files that exist already
    no_timing: bool
    refresh_expected: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> InitOptions:
        return cls(paths=tuple(ns.paths), target=options.names(ns.target), dim=tuple(ns.dim), inputs=tuple(ns.inputs),
                   force=ns.force, no_timing=ns.no_timing, refresh_expected=ns.refresh_expected)


def add_init(sub: Subparsers) -> None:
    i = sub.add_parser("init", help="scaffold targets.toml, noxfile.py, .gitignore and a CI workflow from your "
                                    "ONNX models (docs/project.md)")
    i.add_argument("paths", nargs="*", metavar="PATH",
                   help="models, or folders holding them (default: models/ if it exists, else this directory)")
    i.add_argument("--target", action="append", choices=list(presets.PRESETS), metavar="NAME",
                   help="a target to write (repeatable; default: cpu-fp32, and cpu-int8 for the models int8-dynamic "
                        f"suits and is measured faster for here); one of {', '.join(presets.PRESETS)}")
    i.add_argument("--dim", action="append", type=dim, default=[], metavar="NAME=N",
                   help="the size of a symbolic dimension in generated golden inputs (repeatable)")
    i.add_argument("--inputs", action="append", default=[], metavar="[MODEL=]PATH",
                   help="golden inputs of a model (an .npz keyed by input name, or an ONNX test_data_set_N folder); "
                        "default: NAME.inputs.npz or test_data_set_0/ beside the model, else generated")
    i.add_argument("--force", action="store_true", help="replace files init would write that exist already")
    i.add_argument("--no-timing", action="store_true",
                   help="do not time int8 against fp32 here: cpu-int8 takes the models by their weights alone (a "
                        "scaffold that does not depend on this machine)")
    i.add_argument("--refresh-expected", action="store_true",
                   help="record again the expected outputs init recorded (each model's source on its golden inputs, "
                        "as they are now) in the targets.toml here; writes nothing else")
