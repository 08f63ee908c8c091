"""`ortbuild init`: scaffold a project from its ONNX models (ortbuild.project.scaffold; docs/project.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ortbuild.cli.build import checked_graphs
from ortbuild.project import config, plan, scaffold


def dim(text: str) -> tuple[str, int]:
    """--dim NAME=N: a symbolic dimension's size in generated golden inputs."""
    name, _, value = text.partition("=")
    if not name or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': write NAME=N with N >= 1, e.g. --dim batch=1")
    return name, int(value)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = sub.add_parser("init", help="scaffold targets.toml, noxfile.py, .gitignore and a CI workflow from your "
                                    "ONNX models (docs/project.md)")
    i.add_argument("paths", nargs="*", metavar="PATH",
                   help="models, or folders holding them (default: models/ if it exists, else this directory)")
    i.add_argument("--target", action="append", choices=list(scaffold.PRESETS), metavar="NAME",
                   help="a target to write (repeatable; default: cpu-fp32, and cpu-int8 for the models int8-dynamic "
                        f"suits); one of {', '.join(scaffold.PRESETS)}")
    i.add_argument("--dim", action="append", type=dim, default=[], metavar="NAME=N",
                   help="the size of a symbolic dimension in generated golden inputs (repeatable)")
    i.add_argument("--inputs", action="append", default=[], metavar="[MODEL=]PATH",
                   help="golden inputs of a model (an .npz keyed by input name, or an ONNX test_data_set_N folder); "
                        "default: NAME.inputs.npz or test_data_set_0/ beside the model, else generated")
    i.add_argument("--force", action="store_true", help="replace files init would write that exist already")
    i.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    root = Path.cwd()
    made = scaffold.plan(root, args.paths, args.target or (), dict(args.dim), args.inputs)

    def check(project: config.Project) -> None:
        """Golden inputs given or found fit their models, as `plan` checks them (the generated ones do)."""
        given = {name for name, m in project.models.items() if not str(m.inputs).endswith(scaffold.GENERATED)}
        checked_graphs(project, [j for j in plan.jobs(project) if j.model.name in given])

    written = scaffold.write(root, made, args.force, check)
    project = config.load(root / config.DEFAULT_FILE)  # what init wrote loads, every file it names checked
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    for note in made.notes:
        print(f"  {note}")
    print(f"\n{len(project.models)} model(s), targets {', '.join(project.targets)}. Next:\n"
          "  python -m nox -s test       # each target in its own virtualenv: build, then the release gates\n"
          "  git add targets.lock        # what the build found (precision_search): CI builds with --locked\n"
          "  python -m nox -s release    # sign and bundle each tested target into dist/release/<target>/",
          file=sys.stdout)
    return 0
