"""[models.NAME.eval] and [targets.NAME.eval] at config load: the labelled evaluation set's files (checked like the
model's `inputs`), its metric's spelling, and a target's eval budget against the models it applies to. The data is
read (lazily) by the `eval` gate only, ortbuild.gating.measure.task_eval. Stdlib + packaging only (the noxfile imports
it through ortbuild.project.config).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ortbuild import paths
from ortbuild.project.checker import Checker, did_you_mean, short_repr
from ortbuild.project.declare import build
from ortbuild.project.settings import EVAL_METRICS, EvalSet, Gates, Model

# a custom metric: "package.module:function"
CUSTOM_METRIC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
SUFFIXES = {"inputs": (".npz",), "labels": (".npy", ".npz")}
WHAT = {"inputs": "an .npz keyed by input name (first axis: the samples), or a directory of them",
        "labels": "an .npy, or an .npz holding one array, with one label per sample"}


def eval_set(chk: Checker, where: str, raw: dict[str, Any] | None, root: Path, check_files: bool) -> EvalSet | None:
    """The validated [models.NAME.eval] table (`where`: models.NAME.eval), its paths resolved against targets.toml's
    folder; None where the model declares none. ConfigErrors name the key and what to do."""
    if raw is None:
        return None
    found: dict[str, Path] = {}
    for k in ("inputs", "labels"):
        rel = raw[k]
        if "\0" in rel:
            raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} holds a NUL byte (\\u0000), which no file name can hold")
        p = root / rel
        if check_files:
            problem = paths.input_problem(p, limit=paths.MAX_DATA_BYTES, directory_ok=k == "inputs")
            if problem == "does not exist":
                raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} does not exist (looked for {p})",
                               f"paths are relative to the directory of targets.toml; {k} is {WHAT[k]}")
            if problem:
                raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} {problem}", f"{k} is {WHAT[k]}")
            if not p.is_dir() and p.suffix.lower() not in SUFFIXES[k]:
                raise chk.fail(f"{where}.{k}", f"{short_repr(rel)} is not {' or '.join(SUFFIXES[k])}",
                               f"{k} is {WHAT[k]}")
        elif too_long := paths.length_problem(p):
            raise chk.fail(f"{where}.{k}", too_long)
        found[k] = p
    metric = raw.get("metric", "accuracy")
    if metric not in EVAL_METRICS and not CUSTOM_METRIC.fullmatch(metric):
        raise chk.fail(f"{where}.metric", f"{short_repr(metric)} is neither one of {', '.join(EVAL_METRICS)}"
                                          f"{did_you_mean(metric, EVAL_METRICS)} nor a custom metric",
                       'a custom metric is the import path of a function, "package.module:function", importable '
                       "from the folder of targets.toml or the environment")
    return build(EvalSet, raw, **found)


def check_target(chk: Checker, where: str, model: Model, gates: Gates) -> None:
    """A target's eval budget (`where`: targets.NAME) where it applies to `model`: its confidence, and the model's
    evaluation set it needs."""
    ev = gates.eval
    if not 0.5 <= ev.confidence < 1:
        raise chk.fail(f"{where}.eval.confidence", f"must be in [0.5, 1), got {ev.confidence}")
    if ev.max_drop is not None and model.eval is None:
        raise chk.fail(f"{where}.eval.max_drop", f"model '{model.name}' has no labelled evaluation set to judge",
                       f"add [models.{model.name}.eval] with inputs and labels, or set eval.max_drop only for the "
                       f"models that have one ([[targets.NAME.overrides]] with models = [...])")
