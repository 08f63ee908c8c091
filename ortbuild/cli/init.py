"""`ortbuild init`: scaffold a project from its ONNX models (ortbuild.project.scaffold; docs/project.md)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ortbuild.cli.build import checked_graphs
from ortbuild.cli.options.init import InitOptions
from ortbuild.errors import UsageError
from ortbuild.project import config, data, expected, plan, scaffold, signature, speedup
from ortbuild.project.kinds import kind_rule


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


def cmd_init(o: InitOptions) -> int:
    root = Path.cwd()
    if o.refresh_expected:
        return refresh(root)
    made = scaffold.plan(root, o.paths, o.target, dict(o.dim), o.inputs, probe(not o.no_timing))

    def check(project: config.Project) -> None:
        """Golden inputs given or found fit their models, as `plan` checks them (the generated ones do)."""
        given = {name for name, m in project.models.items() if not str(m.inputs).endswith(scaffold.GENERATED)}
        checked_graphs(project, [j for j in plan.jobs(project) if j.model.name in given])

    written = scaffold.write(root, made, o.force, check)
    project = config.load(root / config.DEFAULT_FILE)  # what init wrote loads, every file it names checked
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    for note in made.notes:
        print(f"  {note}")
    searched = any(s.precision_search == "auto" for t in project.targets.values() for s in t.settings.values())
    generative = any(kind_rule(m.kind).directory for m in project.models.values())
    print(f"\n{len(project.models)} model(s), targets {', '.join(project.targets)}. Next:\n"
          "  python -m nox -s test       # each target in its runtime's virtualenv: build, then the release gates\n"
          + ("  python -m nox -t generative # the generative targets: build, test and release, in a venv with torch "
             "(docs/generative.md)\n" if generative else "")
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
        if not kind_rule(model.kind).records_expected or model.expected is None or expected.read_record(model) is None:
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
