"""Step (format = "ort"): ONNX Runtime's reduced-build operator configuration of the artifact; and the merge of
the models' configurations into one per target.

ONNX Runtime's mobile and minimal builds hold only the kernels a configuration file lists (`build.sh
--include_ops_by_config <file>`; with per-operator types, `--enable_reduced_operator_type_support` drops the
kernels' unused types too). ORT's own tool writes that file from ORT-format models
(`onnxruntime.tools.ort_format_model.create_config_from_models`): this step runs it on the .ort file while it is
plaintext in the build's private temp dir, with type reduction on (an ORT-format model records every node's
types, and a build without --enable_reduced_operator_type_support ignores them: ORT's parser reads the same
operators from a typed file), replaces the temp path its header names by the artifact's own name, and checks the
result with ORT's parser. The package step ships it beside the artifact as `required_operators.config`, signed
in the manifest (`operators`: its sha256 and every domain, opset, op type and types).

`merge` makes the target's configuration (`ortbuild release` puts it into the target's bundle) from the models'
signed sections: operator sets joined per (domain, opset), types joined per op across every opset and input, as
ORT's tool joins several models (its type tracking is per op, not per opset), written in its format: the same
lines the tool writes for all the models at once (tests/test_operators.py). Stdlib only at import: release
imports it without ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ortbuild.artifact import manifest_types

CONFIG = "required_operators.config"
TOOL = "onnxruntime.tools.ort_format_model.create_config_from_models"
HEADER = "# Generated from model/s:\n"       # ORT's own first line
NCHWC = "com.microsoft.nchwc"                # x86-only layout ops (optimization levels layout and all)


@dataclass(frozen=True)
class OperatorConfig:
    """One artifact's configuration: ORT's text, and what it lists."""

    text: str
    type_reduction: bool
    operators: tuple[manifest_types.OperatorSet, ...]
    made_by: str
    notes: list[str] = field(default_factory=list)

    @property
    def data(self) -> bytes:
        return self.text.encode()

    def manifest_section(self) -> manifest_types.Operators:
        return manifest_types.Operators(config=CONFIG, sha256=hashlib.sha256(self.data).hexdigest(),
                                        size=len(self.data), type_reduction=self.type_reduction,
                                        made_by=self.made_by, operators=list(self.operators))


# ------------------------------------------------------------------------------------------- ORT's format

def _entries(text: str) -> Iterable[tuple[str, manifest_types.OpTypes | None]]:
    """The `Op` or `Op{json}` entries of one line's operator list (JSON may hold commas)."""
    cur, end = 0, len(text)
    while cur < end:
        comma, brace = text.find(",", cur), text.find("{", cur)
        comma = end if comma == -1 else comma
        if cur < brace < comma:  # the op's type entry: up to its matching brace
            depth, i = 1, brace + 1
            while depth and i < end:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            if depth:
                raise ValueError(f"unbalanced braces in operator config entry {text[cur:cur + 80]!r}")
            yield text[cur:brace].strip(), json.loads(text[brace:i])
            cur = i + 1
        else:
            yield text[cur:comma].strip(), None
            cur = comma + 1


def parse(text: str) -> list[manifest_types.OperatorSet]:
    """The operator sets of a configuration in ORT's format (comments and `!` directives skipped)."""
    sets: dict[tuple[str, int], manifest_types.OperatorSet] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        domain, opsets, ops = (part.strip() for part in line.split(";", 2))
        for opset in (int(o) for o in opsets.split(",")):
            s = sets.setdefault((domain, opset), manifest_types.OperatorSet(domain, opset, []))
            for op, types in _entries(ops):
                if op not in s.ops:
                    s.ops.append(op)
                if types is not None:
                    s.types[op] = types
    return [manifest_types.OperatorSet(d, o, sorted(s.ops), dict(sorted(s.types.items())))
            for (d, o), s in sorted(sets.items())]


def _type_entry(types: manifest_types.OpTypes | None) -> str:
    """An op's type entry as ORT writes it (`to_config_entry`: inputs then outputs by index, types sorted; or
    OneHot's sorted `custom` triples), "" for none."""
    if not types:
        return ""
    if "custom" in types:
        return json.dumps({"custom": sorted(list(t) for t in types["custom"])})
    out = {kind: {str(i): sorted(by_index[str(i)]) for i in sorted(int(k) for k in by_index) if by_index[str(i)]}
           for kind, by_index in (("inputs", types.get("inputs")), ("outputs", types.get("outputs"))) if by_index}
    return json.dumps({k: v for k, v in out.items() if v}) if any(out.values()) else ""


def _joined(a: manifest_types.OpTypes | None, b: manifest_types.OpTypes) -> manifest_types.OpTypes:
    """Two type entries of one op joined, as ORT's tracker accumulates the nodes of several models."""
    if a is None:
        return b
    out: manifest_types.OpTypes = {}
    inputs = _union(a.get("inputs", {}), b.get("inputs", {}))
    outputs = _union(a.get("outputs", {}), b.get("outputs", {}))
    if inputs:
        out["inputs"] = inputs
    if outputs:
        out["outputs"] = outputs
    if "custom" in a or "custom" in b:
        out["custom"] = [list(t) for t in sorted({tuple(t) for t in [*a.get("custom", []), *b.get("custom", [])]})]
    return out


def _union(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict[str, list[str]]:
    """One op's types per input (or output) index, over two type entries."""
    idx = {i: set(v) for i, v in a.items()}
    for i, v in b.items():
        idx.setdefault(i, set()).update(v)
    return {i: sorted(v) for i, v in idx.items()}


def render(sets: Sequence[manifest_types.OperatorSet], names: Iterable[str], *, typed: bool = True) -> str:
    """A configuration in ORT's format: its header naming the models, then one line per (domain, opset), op
    types sorted, each op's types (joined over every opset, as ORT tracks them) where `typed`."""
    ops: dict[tuple[str, int], set[str]] = {}
    types: dict[tuple[str, str], manifest_types.OpTypes] = {}
    for s in sets:
        ops.setdefault((s.domain, s.opset), set()).update(s.ops)
        for op, t in s.types.items() if typed else ():
            types[(s.domain, op)] = _joined(types.get((s.domain, op)), t)
    lines = [HEADER, *(f"# - {n}\n" for n in sorted(names))]
    for (domain, opset), names_ in sorted(ops.items()):
        if names_:
            entries = ",".join(f"{op}{_type_entry(types.get((domain, op)))}" for op in sorted(names_))
            lines.append(f"{domain};{opset};{entries}\n")
    return "".join(lines)


def merge(sections: Sequence[manifest_types.Operators], names: Iterable[str]) -> tuple[str, bool]:
    """The target's configuration from its models' signed sections (`names`: what the header lists), and whether
    it is typed (every model's was)."""
    typed = bool(sections) and all(s.type_reduction for s in sections)
    return render([s for sec in sections for s in sec.operators], names, typed=typed), typed


# ------------------------------------------------------------------------------------------- the step

def run(model: Path, work: Path, name: str, *, type_reduction: bool = True) -> OperatorConfig:
    """ORT's tool on the .ort file `model` (plaintext, in the private temp dir `work`); `name`: what the header
    names instead of the temp path (<target>/<model>/model.ort)."""
    import onnxruntime
    from onnxruntime.tools import reduced_build_config_parser
    from onnxruntime.tools.ort_format_model import create_config_from_models

    out = work / "opconfig" / CONFIG
    try:
        create_config_from_models([model], out, type_reduction)
        raw = out.read_text()
        required, _ = reduced_build_config_parser.parse_config(str(out), False)
    finally:
        out.unlink(missing_ok=True)
    body = "".join(line for line in raw.splitlines(keepends=True) if not line.startswith("#"))
    text = f"{HEADER}# - {name}\n{body}"
    sets = parse(text)
    theirs = {(d, o): sorted(ops) for d, by in (required or {}).items() for o, ops in by.items() if ops}
    if {(s.domain, s.opset): s.ops for s in sets} != theirs:
        raise ValueError(f"ONNX Runtime's parser reads other operators from its config than ortbuild does: {raw[:200]}")
    if render(sets, [name], typed=type_reduction) != text:  # merge() writes what the tool writes
        raise ValueError(f"ONNX Runtime {onnxruntime.__version__} writes its operator config in a format ortbuild "
                         f"does not reproduce: {raw[:200]}")
    notes = []
    if any(s.domain == NCHWC for s in sets):
        notes.append(f"{CONFIG} lists {NCHWC} ops (optimization levels layout and all, x86 only): a reduced build "
                     "for ARM devices has no such kernels; use optimization = \"basic\" for mobile packages")
    return OperatorConfig(text, type_reduction, tuple(sets), f"{TOOL} (onnxruntime {onnxruntime.__version__})",
                          notes)
