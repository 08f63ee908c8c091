"""`ortbuild init`: scaffold a project from its ONNX models (ortbuild.project.scaffold; docs/project.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ortbuild.cli.build import checked_graphs
from ortbuild.errors import UsageError
from ortbuild.project import config, data, expected, plan, presets, scaffold, signature, speedup


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
    i.set_defaults(func=cmd_init)


def _say(line: str) -> None:
    print(line, flush=True)


def probe(timing: bool = True) -> scaffold.Probe | None:
    """What init runs on the models, where onnxruntime is importable here (`timing`: int8 against fp32 too)."""
    if not speedup.available():
        return None
    from ortbuild.artifact import golden
    from ortbuild.gating.measure import int8speed

    return scaffold.Probe(lambda path, feeds: golden.compute(path, feeds), int8speed.measure if timing else None,
                          _say)


def cmd_init(args: argparse.Namespace) -> int:
    root = Path.cwd()
    if args.refresh_expected:
        return refresh(root)
    made = scaffold.plan(root, args.paths, args.target or (), dict(args.dim), args.inputs, probe(not args.no_timing))

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
    searched = any(s.precision_search == "auto" for t in project.targets.values() for s in t.settings.values())
    print(f"\n{len(project.models)} model(s), targets {', '.join(project.targets)}. Next:\n"
          "  python -m nox -s test       # each target in its own virtualenv: build, then the release gates\n"
          + ("  git add targets.lock        # what the build found (precision_search), if it wrote one: CI builds "
             "with --locked\n" if searched else "")
          + "  python -m nox -s release    # sign and bundle each tested target into dist/release/<target>/",
          file=sys.stdout)
    return 0


def _moved(old: Mapping[str, object], new: Mapping[str, object]) -> str:
    from ortbuild.artifact import golden

    return ", ".join(f"'{name}' {golden.moved_by(old.get(name), value)}" for name, value in new.items())


def refresh(root: Path) -> int:
    """`init --refresh-expected`: each model's expected outputs that init recorded (a record beside them), computed
    again from its source on its golden inputs as they are now, with their record; all written or none."""
    from ortbuild.artifact import golden

    if not speedup.available():
        raise UsageError("--refresh-expected runs each source model: onnxruntime is not importable here",
                         "pip install onnxruntime, then run it again")
    project = config.load(root / config.DEFAULT_FILE)
    texts: dict[Path, bytes] = {}
    said: list[str] = []
    for model in project.models.values():
        if model.generative or model.expected is None or expected.read_record(model) is None:
            continue
        sets = scaffold.data_sets(model.inputs, signature.graph(model.path))
        if len(sets) != 1:
            raise UsageError(f"[models.{model.name}] inputs ({model.inputs}) hold {len(sets)} data sets",
                             "an .npz of expected outputs holds one feed's: give one data set")
        values, how = golden.compute(model.path, [sets[0][1]], model.custom_ops)
        arrays = {k: v for k, v in values[0].items() if isinstance(v, np.ndarray)}
        texts[model.expected] = scaffold.npz_bytes(arrays)
        texts[expected.record_path(model.expected)] = expected.record_json(
            sets, arrays, how, scaffold.shown(model.inputs, root), scaffold.shown(model.path, root)).encode()
        said.append(f"refreshed {scaffold.shown(model.expected, root)} ([models.{model.name}]): against the "
                    "recorded outputs: "
                    f"{_moved(data.npz(model.expected), arrays)}")
    if not texts:
        raise UsageError(f"no model of {project.file} has expected outputs recorded by init",
                         "run `ortbuild init` (it records them where onnxruntime is importable)")
    scaffold.publish(root, texts)
    for line in said:
        print(line)
    return 0
