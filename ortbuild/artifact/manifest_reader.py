"""The strict reader under `Manifest.from_json` (ortbuild.artifact.manifest_types): JSON into the manifest's frozen
dataclasses, every key known, every required key present, every type right; a free-form part (a TypedDict) need only
be an object here (manifest_types checks the keys every reader indexes). It knows no key itself: it walks each
dataclass's fields and type hints. Stdlib only: the noxfile reads manifests before any venv exists.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TypeVar

from ortbuild.errors import ArtifactError

T = TypeVar("T")


def typed(cls: type[T], data: object, where: str, path: str) -> T:
    """Build dataclass `cls` from JSON `data`, strictly: every key known, every required key present."""
    if not isinstance(data, dict):
        raise ArtifactError(f"{where}: [{path or 'manifest'}] must be an object")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ArtifactError(f"{where}: unknown manifest key '{path + unknown[0]}'",
                            "the manifest was edited or written by another ortbuild: rebuild it")
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ArtifactError(f"{where}: manifest key '{path + name}' is missing",
                                    "the manifest was edited or written by another ortbuild: rebuild it")
            continue
        value, hint = data[name], hints[name]
        optional = typing.get_origin(hint) in (types.UnionType, typing.Union) and type(None) in typing.get_args(hint)
        inner = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
        item = typing.get_args(inner)[0] if typing.get_origin(inner) is list else None
        if value is None and optional:
            pass
        elif dataclasses.is_dataclass(inner):
            value = typed(inner, value, where, f"{path}{name}.")  # type: ignore[arg-type]
        elif item is not None and dataclasses.is_dataclass(item) and isinstance(value, list):
            value = [typed(item, v, where, f"{path}{name}[{i}].") for i, v in enumerate(value)]  # type: ignore
        elif not _matches(value, hint):
            raise ArtifactError(f"{where}: manifest key '{path + name}' has the wrong type",
                                "the manifest was edited: rebuild the artifact")
        values[name] = value
    return cls(**values)


def _matches(value: object, hint: object) -> bool:
    origin = typing.get_origin(hint) or hint
    if origin in (types.UnionType, typing.Union):
        return any(_matches(value, a) for a in typing.get_args(hint))
    if typing.is_typeddict(origin):  # a free-form part: an object (manifest_types' content checks: what readers index)
        return isinstance(value, dict)
    if hint is type(None):
        return value is None
    if origin is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typing.cast(type, origin))
