"""How a targets.toml key is declared: once, as a field of the frozen dataclass that holds its value
(ortbuild.project.settings, ortbuild.project.sections), with `setting(...)`: its type (the annotation), default,
doc, limits, whether changing it rebuilds the artifact (`build`) and whether `extends` passes it on (`inherited`).

Everything else is derived from those fields: the key tables (ortbuild.project.tables: validation, JSON Schema,
reference docs), the dataclass built from a validated table (`build`) and a build key's settings part
(`build_json`). Stdlib-only: the noxfile imports it (through ortbuild.project.config) before any venv exists.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

# always: part of the build key; when-set: part of it unless at its default (a key added later leaves the build
# keys of the targets that do not use it as they were); never: the artifact does not depend on it (budgets,
# runner labels, docs), or it reaches the build key another way (then `Key.rebuilds` says how), or the build
# refuses what does not match it (then `Key.guard` says what)
Build = Literal["always", "when-set", "never"]

KINDS = ("string", "integer", "number", "boolean", "strings", "requirements", "providers", "config", "dims", "table",
         "tables", "named")  # named: a table of NAME = sub-table


@dataclass(frozen=True, kw_only=True)
class Key:
    """One key of one table. `kind` is one of KINDS; `table` names the sub-table spec of table kinds."""

    name: str
    kind: str
    doc: str
    default: object = None           # as TOML writes it (arrays are lists, tables dicts)
    required: bool = False
    choices: tuple[str, ...] = ()
    table: str | None = None
    maximum: float | None = None     # integer/number kinds: the largest value (None: INT_MAX / NUMBER_MAX)
    build: Build = "always"
    rebuilds: str = ""               # build = "never" keys the artifact depends on anyway: through what
    guard: str = ""                  # build = "never" keys the build checks instead: what it refuses
    inherited: bool = True           # False: a target does not inherit it through `extends`


_META = "ortbuild.key"               # field metadata: the Key of a declared field
_BUILD = "ortbuild.build"            # field metadata of a derived field (not a key): its Build policy
_SPELLED = "ortbuild.spelled"        # and how JSON documents write it, where not as the field: value -> (key, value)


@overload
def setting(default: T, *, doc: str, kind: str | None = None, choices: tuple[str, ...] = (),
            table: str | None = None, maximum: float | None = None, build: Build = "always", rebuilds: str = "",
            guard: str = "", inherited: bool = True) -> T: ...
@overload
def setting(*, factory: Callable[[], T], doc: str, kind: str | None = None, choices: tuple[str, ...] = (),
            table: str | None = None, maximum: float | None = None, build: Build = "always", rebuilds: str = "",
            guard: str = "", inherited: bool = True) -> T: ...
@overload
def setting(*, required: Literal[True], doc: str, kind: str | None = None, choices: tuple[str, ...] = (),
            table: str | None = None, maximum: float | None = None, build: Build = "always", rebuilds: str = "",
            guard: str = "", inherited: bool = True) -> Any: ...


def setting(default: object = dataclasses.MISSING, *, factory: Callable[[], object] | None = None,
            required: bool = False, doc: str, kind: str | None = None, choices: tuple[str, ...] = (),
            table: str | None = None, maximum: float | None = None, build: Build = "always", rebuilds: str = "",
            guard: str = "", inherited: bool = True) -> Any:
    """Declare a field as a targets.toml key (its name is the field's). The key's kind comes from the annotation
    (str, Literal[...] with its choices, int, float, bool, tuple[str, ...], a dataclass of keys: a sub-table) unless
    `kind` says it; a table's name is the field's unless `table` says it."""
    spec = {"doc": doc, "kind": kind, "choices": choices, "table": table, "maximum": maximum, "build": build,
            "rebuilds": rebuilds, "guard": guard, "inherited": inherited, "required": required}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_META: spec})
    return dataclasses.field(default=default, metadata={_META: spec})


def derived(default: T, *, build: Build, spelled: Callable[[T], tuple[str, object]] | None = None) -> T:
    """A field that is not a key (made from keys: a target's and its models' custom-op libraries), and whether
    it enters the build key; `spelled`: the key and value JSON documents (`plain`, build keys) give it, where they
    differ from the field's (a model's kind, written `"generative": true` as before it was a kind)."""
    metadata: dict[str, object] = {_BUILD: build} if spelled is None else {_BUILD: build, _SPELLED: spelled}
    return dataclasses.field(default=default, metadata=metadata)


def _dataclass_of(hint: object) -> type[DataclassInstance] | None:
    """The dataclass a field's annotation holds (`Quantization`, `FasterThan | None`), if any."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if get_origin(hint) in (typing.Union, types.UnionType):
        found = [a for a in get_args(hint) if a is not type(None)]
        return _dataclass_of(found[0]) if len(found) == 1 else None
    return None


def _kind(hint: object) -> tuple[str, tuple[str, ...]]:
    """The key kind (and choices) an annotation gives."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _kind(rest[0])
    if origin is Literal and all(isinstance(a, str) for a in args):
        return "string", tuple(args)
    if _dataclass_of(hint) is not None:
        return "table", ()
    if origin is tuple and args[1:] == (Ellipsis,) and args[0] is str:
        return "strings", ()
    simple: dict[object, str] = {str: "string", Path: "string", bool: "boolean", int: "integer", float: "number"}
    if hint in simple:
        return simple[hint], ()
    raise TypeError(f"no key kind for the annotation {hint!r}: give kind=")


def _toml(value: object) -> object:
    """A default as targets.toml writes it: tuples are arrays, dataclasses and mappings tables."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {}
    if isinstance(value, tuple | list):
        return [_toml(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _toml(v) for k, v in value.items()}
    return value


def _default(f: dataclasses.Field[object]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


@functools.cache
def _hints(cls: type[object]) -> dict[str, object]:
    """A dataclass's resolved annotations, evaluated once per class (loading a project builds many)."""
    return typing.get_type_hints(cls)


@functools.cache
def keys_of(cls: type[DataclassInstance]) -> tuple[Key, ...]:
    """The keys a dataclass declares (its `setting()` fields), in field order."""
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_META)
        if spec is None:
            continue
        kind, choices = _kind(hints[f.name]) if spec["kind"] is None else (spec["kind"], ())
        choices = spec["choices"] or choices
        default = _default(f)
        sub = _dataclass_of(hints[f.name])
        if sub is not None:  # a sub-table: present unless the field is optional with no value
            default = None if default is None else {}
        out.append(Key(name=f.name, kind=kind, doc=spec["doc"], required=spec["required"], choices=choices,
                       default=None if default is dataclasses.MISSING else _toml(default),
                       table=spec["table"] or (f.name if kind in ("table", "tables", "named") else None),
                       maximum=spec["maximum"], build=spec["build"], rebuilds=spec["rebuilds"],
                       guard=spec["guard"], inherited=spec["inherited"]))
    return tuple(out)


def sub_tables(cls: type[DataclassInstance]) -> dict[str, type[DataclassInstance]]:
    """The sub-tables a dataclass declares, recursively: table name -> its dataclass."""
    hints = _hints(cls)
    out: dict[str, type[DataclassInstance]] = {}
    for k in keys_of(cls):
        sub = _dataclass_of(hints[k.name])
        if sub is not None and k.table is not None:
            out[k.table] = sub
            out.update(sub_tables(sub))
    return out


def build(cls: type[D], table: Mapping[str, object], **given: object) -> D:
    """The dataclass of a validated table: each declared key from the table (else its default), sub-tables built
    the same way, arrays as tuples; `given` sets the fields made another way (providers, derived fields)."""
    hints = _hints(cls)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif _META in f.metadata and f.name in table:
            values[f.name] = _value(hints[f.name], table[f.name])
        elif _META in f.metadata and f.metadata[_META]["required"]:
            raise KeyError(f.name)
    return cls(**values)


def _value(hint: object, v: object) -> object:
    sub = _dataclass_of(hint)
    if sub is not None and isinstance(v, Mapping):
        return build(sub, v)
    if isinstance(v, list):
        return tuple(v)
    return copy.deepcopy(v)


def plain(obj: object) -> object:
    """The JSON form of settings: dataclasses of keys as tables of all their keys, tuples as lists; other
    objects by their `as_json()`."""
    return _json(obj, only_build=False)


def build_json(obj: object) -> dict[str, object]:
    """The part of a settings object a build key holds: every field whose `build` is not "never" ("when-set"
    fields only where they differ from their default), recursively."""
    out = _json(obj, only_build=True)
    assert isinstance(out, dict)
    return out


def _json(obj: object, only_build: bool) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _declares(type(obj)):
        out: dict[str, object] = {}
        for f in dataclasses.fields(obj):
            spec = f.metadata.get(_META)
            policy = spec["build"] if spec is not None else f.metadata.get(_BUILD)
            if policy is None or (only_build and policy == "never"):
                continue
            value = getattr(obj, f.name)
            if only_build and policy == "when-set" and value == _default(f):
                continue
            spelled = f.metadata.get(_SPELLED)
            name, value = spelled(value) if spelled is not None else (f.name, value)
            out[name] = _json(value, only_build)
        return out
    as_json = getattr(obj, "as_json", None)
    if callable(as_json):
        return as_json()
    if isinstance(obj, tuple | list):
        return [_json(v, only_build) for v in obj]
    if isinstance(obj, Mapping):
        return {k: _json(v, only_build) for k, v in obj.items()}
    return obj


@functools.cache
def _declares(cls: type[DataclassInstance]) -> bool:
    return any(_META in f.metadata or _BUILD in f.metadata for f in dataclasses.fields(cls))
