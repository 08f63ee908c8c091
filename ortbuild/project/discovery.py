"""The ONNX models `ortbuild init` scaffolds a project from (docs/project.md): those of the paths given (files, or
folders searched), else of models/, else of the project and below, skipping hidden folders, virtualenvs and
ortbuild's outputs; each one's name in targets.toml, and the golden inputs kept beside it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from ortbuild import paths
from ortbuild.errors import UsageError

SKIP_DIRS = frozenset({"dist", "node_modules", "__pycache__", "site-packages"})


def _walk(folder: Path) -> Iterator[Path]:
    """The .onnx files under `folder`, skipping hidden folders, virtualenvs, ortbuild's outputs and folders it may
    not read."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            if entry.name.startswith(".") or entry.name in SKIP_DIRS or os.path.lexists(entry / "pyvenv.cfg"):
                continue
            yield from _walk(entry)
        elif entry.suffix == ".onnx" and entry.is_file():
            yield entry


def find_models(root: Path, given: Sequence[str]) -> list[Path]:
    """The models of PATHs (files, or folders searched), else of root/models/, else of root and below."""
    if not given:
        found = list(_walk(root / "models")) if (root / "models").is_dir() else []
        found = found or list(_walk(root))
        if not found:
            raise UsageError(f"no .onnx model found in {root} (hidden folders, virtualenvs and dist/ left out)",
                             "give the models: `ortbuild init path/to/model.onnx ...`")
        return _named(found)
    out: list[Path] = []
    for text in given:
        path = Path(text)
        if path.is_dir():
            inside = list(_walk(path))
            if not inside:
                raise UsageError(f"{text}: no .onnx model in this folder", "give a model file or another folder")
            out += inside
        elif path.is_file() and path.suffix == ".onnx":
            out.append(path)
        else:
            raise UsageError(f"{text}: not an .onnx file or a folder", "give ONNX model files or folders holding them")
    return _named(list(dict.fromkeys(Path(os.path.abspath(p)) for p in out)))  # a symlink keeps its own name


def _named(models: list[Path]) -> list[Path]:
    """`models`, each file name checked to be text a targets.toml can hold."""
    for m in models:
        try:
            str(m).encode()
        except UnicodeEncodeError:
            raise UsageError(f"{os.fsencode(m)!r}: the file name is not valid UTF-8, which targets.toml cannot hold",
                             "rename the file") from None
    return models


def model_name(path: Path, taken: set[str]) -> str:
    """A model name (paths.NAME_RULE) from the file's name, unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip("_.-")[:60] or "model"
    if paths.name_problem(base):
        base = f"m{base}"[:60]
    name, n = base, 2
    while paths.loader_module(name).lower() in taken:  # unique as a name and as its loader's module name
        name, n = f"{base}_{n}", n + 1
    taken.add(paths.loader_module(name).lower())
    return name


def golden_beside(model: Path) -> Path | None:
    """Golden inputs kept beside a model: <stem>.inputs.npz, or an ONNX-layout folder (test_data_set_0/)."""
    npz = model.with_name(f"{model.stem}.inputs.npz")
    if npz.is_file():
        return npz
    if (model.parent / "test_data_set_0").is_dir():
        return model.parent
    return None
