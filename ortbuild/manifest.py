"""manifest.json: what an artifact is, how it was built, and where it may be used.

`Manifest` (frozen dataclasses) is the only place that knows the manifest's keys: the build assembles one
from the steps' typed results, readers (cli, nox, the loaders' generator) get one from `read()`.
It is written last and atomically beside the artifact: a reader that finds a manifest finds the artifact
it describes (sha256 and size recorded), never a half-written one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
T = TypeVar("T")


@dataclass(frozen=True)
class ProjectInfo:
    name: str
    version: str


@dataclass(frozen=True)
class Source:
    path: str
    sha256: str
    size: int
    ir_version: int
    opsets: dict[str, int]


@dataclass(frozen=True)
class Artifact:
    file: str                        # the artifact's file name in its directory
    format: str                      # onnx | ort
    sha256: str
    size: int
    size_ratio: float                # size / source size


@dataclass(frozen=True)
class PrecisionInfo:
    name: str
    options: dict[str, Any]


@dataclass(frozen=True)
class Optimization:
    requested: str
    applied: str
    portable: bool
    tied_to: dict[str, Any]          # {"providers": [...], "simd_level": "..."} where not portable
    optimized_with: list[str]
    op_domains: dict[str, int]


@dataclass(frozen=True)
class GoldenRun:
    providers: list[str]             # what the reload session really ran on
    outputs: list[dict[str, Any]]    # name, dtype, shape of each output on the golden inputs
    inputs_sha256: str


@dataclass(frozen=True)
class Manifest:
    project: ProjectInfo
    target: str
    model: str
    status: str                      # complete | portable
    missing_providers: dict[str, str]
    source: Source
    artifact: Artifact
    precision: PrecisionInfo
    providers: list[dict[str, Any]]  # {"name": ..., "options": {...}}, in priority order
    session: dict[str, Any]
    free_dimensions: dict[str, int]
    optimization: Optimization
    io: dict[str, Any]               # {"inputs": [...], "outputs": [...]}: name, dtype, shape
    golden_run: GoldenRun
    versions: dict[str, Any]
    build_machine: dict[str, Any]
    build_key: str
    created: str
    notes: list[str] = field(default_factory=list)
    format_version: int = FORMAT_VERSION

    @property
    def portable_only(self) -> bool:
        return self.status == "portable"

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, text: str | bytes, where: str = MANIFEST) -> Manifest:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ArtifactError(f"{where}: unreadable manifest: {e}",
                                "rebuild the artifact with `ortbuild build`") from None
        if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{where}: not an ortbuild manifest (format version {FORMAT_VERSION})",
                                "rebuild the artifact with this ortbuild")
        return _typed(cls, data, where, "")


def _typed(cls: type[T], data: Any, where: str, path: str) -> T:
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
        if dataclasses.is_dataclass(hint):
            value = _typed(hint, value, where, f"{path}{name}.")  # type: ignore[arg-type]
        elif not _matches(value, hint):
            raise ArtifactError(f"{where}: manifest key '{path + name}' has the wrong type",
                                "the manifest was edited: rebuild the artifact")
        values[name] = value
    return cls(**values)


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    if origin in (types.UnionType, typing.Union):
        return any(_matches(value, a) for a in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


# ------------------------------------------------------------------------------------------ files

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def timestamp() -> str:
    """UTC now, or SOURCE_DATE_EPOCH when set (reproducible builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None:
        try:
            when = dt.datetime.fromtimestamp(int(epoch), dt.UTC)
        except ValueError:
            raise ArtifactError(f"SOURCE_DATE_EPOCH={epoch!r} is not an integer number of seconds",
                                "unset it, or set it to e.g. $(git log -1 --format=%ct)") from None
    else:
        when = dt.datetime.now(dt.UTC)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_copy(src: Path, dst: Path) -> None:
    atomic_write(dst, src.read_bytes())


def locate(path: Path) -> Path:
    """The manifest file for a dist/<target>/<model>/ directory, a manifest, or an artifact."""
    p = Path(path)
    if p.is_dir():
        return p / MANIFEST
    return p if p.name == MANIFEST else p.parent / MANIFEST


def read(path: Path) -> tuple[Manifest, Path]:
    """Load a manifest given the manifest, its directory, or its artifact. Returns (manifest, its dir)."""
    p = locate(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{p}: no manifest here",
                            "give a dist/<target>/<model>/ directory, its manifest.json or its artifact") from None
    except OSError as e:
        raise ArtifactError(f"{p}: unreadable manifest: {e}", "rebuild the artifact with `ortbuild build`") from None
    return Manifest.from_json(text, str(p)), p.parent


def integrity_problems(m: Manifest, folder: Path) -> list[str]:
    art = folder / m.artifact.file
    if not art.exists():
        return [f"artifact {art} is missing"]
    problems = []
    if art.stat().st_size != m.artifact.size:
        problems.append(f"artifact {art.name} is {art.stat().st_size} bytes, the manifest says {m.artifact.size}")
    if sha256_file(art) != m.artifact.sha256:
        problems.append(f"artifact {art.name} sha256 differs from the manifest (modified or corrupted)")
    return problems


def fit_problems(m: Manifest) -> list[str]:
    """Why this machine/environment should not use the artifact (empty: it fits)."""
    from . import runtime
    from .config import Provider

    problems = []
    tied = m.optimization.tied_to
    want_simd = tied.get("simd_level")
    if want_simd and want_simd != runtime.simd_level():
        problems.append(f"built with a {want_simd} NCHWc layout (optimization "
                        f"'{m.optimization.applied}'); this machine is {runtime.simd_level()}: "
                        "rebuild it here or use optimization = \"extended\"")
    flavor = runtime.installed_flavor()
    built = m.versions["onnxruntime"]
    if flavor is None:
        problems.append(f"no ONNX Runtime installed; the artifact was built with {built['distribution']} "
                        f"{built['version']}")
        return problems
    if flavor.distribution != built["distribution"]:
        problems.append(f"built with {built['distribution']}, this environment has {flavor.distribution}")
    for name in tied.get("providers", []):
        reason = runtime.probe_provider(Provider(name))
        if reason:
            problems.append(f"the graph holds ops fused for {name}: {reason}")
    for p in m.providers:
        if p["name"] not in tied.get("providers", []):
            reason = runtime.probe_provider(Provider(p["name"], p.get("options", {})))
            if reason:
                problems.append(f"the target's provider cannot run here, ORT would fall back silently: {reason}")
    return problems
