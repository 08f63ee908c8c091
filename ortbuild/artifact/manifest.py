"""manifest.json: what an artifact is, how it was built, and where it may be used.

`Manifest` (frozen dataclasses) is the only place that knows the manifest's keys: the build assembles one
from the steps' typed results, readers (cli, nox, the loaders' generator) get one from `read()`.
It is written last and atomically beside the artifact: a reader that finds a manifest finds the artifact
it describes (sha256 and size recorded), never a half-written one.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import tempfile
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ortbuild.errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
SIGNATURE = "manifest.sig"
GOLDEN_DIR = "golden"               # golden data beside the artifact, written by `ortbuild test` and signed here
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
    # every file of the source model: the graph (its own name) and each external-data file (its location, as
    # the graph names it), with sha256 and size; `sha256` above is the graph file's, `size` all files'
    files: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactFile:
    name: str                        # the file in dist/<target>/<model>/ (model.onnx.enc, model.onnx.data.enc)
    role: str                        # model | external_data
    location: str                    # its plaintext name, as the graph's external-data locations name it
    sha256: str                      # of the file as stored (the ciphertext when encrypted)
    size: int
    encrypted: bool


@dataclass(frozen=True)
class Artifact:
    file: str                        # the model file's name in its directory
    format: str                      # onnx | ort
    sha256: str
    size: int                        # all files of the artifact together
    size_ratio: float                # size / source size
    files: list[ArtifactFile]        # every file of the artifact; each is signed through this manifest
    external_data: str = ""          # why the weights are external data (model.onnx.data), "" when embedded


@dataclass(frozen=True)
class Encryption:
    container: str                   # ortbuild-container-v1 (docs/container.md)
    algorithm: str                   # AES-256-GCM, chunked (STREAM), envelope: data key wrapped by the KEK
    key_id: str                      # names the key-encryption key, never reveals it
    chunk_size: int
    deterministic: bool              # data key and nonces derived from the KEK and the plaintext digest
    development_key: bool            # built with a `keygen --dev` key: never for a release


@dataclass(frozen=True)
class Signing:
    algorithm: str                   # Ed25519 over the exact bytes of manifest.json, in manifest.sig (base64)
    public_key: str                  # base64 of the raw 32-byte public key (loaders pin it)
    public_key_id: str
    development_key: bool


@dataclass(frozen=True)
class LoaderFile:
    language: str                    # python | node | node-types
    name: str                        # relative to the artifact directory
    sha256: str
    runs_target: bool                # False: this loader refuses the target (e.g. Node for OpenVINO)
    note: str = ""


@dataclass(frozen=True)
class SignedFile:
    """A file beside the artifact that readers use but the loaders do not decrypt (the golden data)."""
    name: str                        # relative to the artifact directory, e.g. golden/test_data_set_0/input_0.pb
    sha256: str
    size: int


@dataclass(frozen=True)
class PrecisionInfo:
    name: str
    options: dict[str, Any]
    changed: dict[str, Any] | None = None  # what the step converted (steps.accounting); None for fp32


@dataclass(frozen=True)
class Fusion:
    """What ONNX Runtime's transformer optimizer did before the precision step (steps/fusion.py)."""
    model_type: str
    num_heads: int                   # as configured; 0: inferred from the graph by the optimizer
    hidden_size: int
    applied: bool                    # False: nothing fused, or skipped (a portable build): the source was used
    fused_ops: dict[str, int]        # op type -> nodes the optimizer added, e.g. {"Attention": 3}
    nodes_before: int
    nodes_after: int
    reason: str = ""                 # why it was not applied


@dataclass(frozen=True)
class Optimization:
    requested: str
    applied: str
    portable: bool
    tied_to: dict[str, Any]          # {"providers": [...], "simd_level": "..."} where not portable
    optimized_with: list[str]
    op_domains: dict[str, int]
    disabled_optimizers: list[str] = field(default_factory=list)
    inflation: dict[str, Any] | None = None  # what constant folding grew, and what the build did about it


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
    encryption: Encryption | None    # None: the target opted out (encrypt = false)
    signing: Signing
    loaders: list[LoaderFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build_inputs: dict[str, str] = field(default_factory=dict)  # digest of each part of the build key
    plugins: dict[str, dict[str, str]] = field(default_factory=dict)  # provider -> its plugin EP package
    compiled: dict[str, Any] | None = None  # compiled ahead of time (EPContext): provider, device, partitions
    # custom-op libraries: name, version, sha256, library, and module (a package's) or file (shipped beside it)
    custom_ops: list[dict[str, str]] = field(default_factory=list)
    epoch: int = 0                   # rollback counter ([project] epoch): loaders refuse one below their pinned minimum
    golden: list[SignedFile] = field(default_factory=list)  # the golden data `ortbuild test` wrote and signed
    fusion: Fusion | None = None     # [targets.X.fusion] on: what the transformer optimizer fused
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
        m = _typed(cls, data, where, "")
        problem = _content_problem(m)
        if problem:
            raise ArtifactError(f"{where}: damaged manifest: {problem}",
                                "the manifest was edited or is corrupted: rebuild the artifact with `ortbuild build`")
        return m


def _is_value_info(v: Any) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("dtype"), str)
            and (v.get("shape") is None or isinstance(v.get("shape"), list)))


def file_name_problem(name: str) -> str | None:
    """Why a file name in a manifest is not a plain relative name inside the artifact's directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts) \
            or len(parts) > (3 if parts[0] == "golden" else 2):
        return f"file name {name[:80]!r} is not a plain name inside the artifact directory"
    return None


def _content_problem(m: Manifest) -> str | None:
    """What the typed reader cannot see: the free-form parts every reader indexes, and safe file names."""
    for c in m.custom_ops:
        if not all(isinstance(c.get(k), str) for k in ("name", "version", "sha256", "library")):
            return "custom_ops entries must have name, version, sha256 and library"
        if "file" in c and (file_name_problem(c["file"]) or not c["file"].startswith("custom_ops/")):
            return f"custom_ops file {c['file'][:80]!r} is not custom_ops/<name>"
    if m.status not in ("complete", "portable"):
        return f"status {m.status!r} is neither 'complete' nor 'portable'"
    ort_version = m.versions.get("onnxruntime")
    if not (isinstance(ort_version, dict) and all(isinstance(ort_version.get(k), str)
                                                  for k in ("distribution", "version"))):
        return "versions.onnxruntime must have distribution and version"
    if not all(isinstance(m.build_machine.get(k), str) for k in ("cpu", "simd_level")):
        return "build_machine must have cpu and simd_level"
    for kind in ("inputs", "outputs"):
        if not (isinstance(m.io.get(kind), list) and all(_is_value_info(v) for v in m.io[kind])):
            return f"io.{kind} must be a list of {{name, dtype, shape}}"
    if not all(_is_value_info(v) for v in m.golden_run.outputs):
        return "golden_run.outputs must be a list of {name, dtype, shape}"
    if not all(isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("options", {}), dict)
               for p in m.providers):
        return "providers must be a list of {name, options}"
    names = [f.name for f in m.artifact.files] + [lf.name for lf in m.loaders] + [g.name for g in m.golden]
    for name in names:
        problem = file_name_problem(name)
        if problem:
            return problem
    if any(not g.name.startswith("golden/") for g in m.golden):
        return "golden files must be under golden/"
    if not isinstance(m.epoch, int) or m.epoch < 0:
        return "epoch must be a non-negative integer"
    if m.fusion is not None and not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                        for k, v in m.fusion.fused_ops.items()):
        return "fusion.fused_ops must map op types to counts"
    if not m.artifact.files or m.artifact.file not in {f.name for f in m.artifact.files}:
        return f"artifact.file {m.artifact.file[:80]!r} is not among artifact.files"
    return None


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
        optional = typing.get_origin(hint) in (types.UnionType, typing.Union) and type(None) in typing.get_args(hint)
        inner = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
        item = typing.get_args(inner)[0] if typing.get_origin(inner) is list else None
        if value is None and optional:
            pass
        elif dataclasses.is_dataclass(inner):
            value = _typed(inner, value, where, f"{path}{name}.")  # type: ignore[arg-type]
        elif item is not None and dataclasses.is_dataclass(item) and isinstance(value, list):
            value = [_typed(item, v, where, f"{path}{name}[{i}].") for i, v in enumerate(value)]  # type: ignore
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
    return iso_utc(when)


def iso_utc(when: dt.datetime | None = None) -> str:
    """A UTC time (default: now) as ortbuild writes it everywhere: 2026-01-01T00:00:00Z."""
    return (when or dt.datetime.now(dt.UTC)).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def partial_file(path: Path) -> Path:
    """A new, empty temp file beside `path` (`.NAME.*.partial`: crash recovery removes what is left of it), to be
    renamed over `path` once written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    return Path(tmp)


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
    """Copy `src` to `dst` through a partial file (streamed: never whole in memory)."""
    import shutil

    tmp = partial_file(dst)
    try:
        with open(src, "rb") as a, open(tmp, "wb") as b:
            shutil.copyfileobj(a, b, 1 << 20)
            b.flush()
            os.fsync(b.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def reports(dist: Path, name: str) -> Iterator[tuple[dict[str, Any], Manifest]]:
    """Every readable JSON document dist/<target>/<model>/<name> (a test report, a profile) with the manifest of
    the artifact beside it, in path order; callers compare the build key the document was made for."""
    for f in sorted(dist.glob(f"*/*/{name}")):
        try:
            doc = json.loads(f.read_text())
            m, _ = read(f.parent)
        except (OSError, ValueError, ArtifactError):
            continue
        if isinstance(doc, dict):
            yield doc, m


def write_signed(folder: Path, files: dict[str, bytes | Path], m: Manifest, sign: Callable[[bytes], bytes], *,
                 prune: bool = False) -> None:
    """Publish `files` (names relative to `folder`), then manifest.sig, then manifest.json, each atomically.

    A file given as a Path is an already written (and synced) partial file: one inside `folder` is renamed into
    place, any other is copied. The old manifest goes first, so no reader finds a manifest describing files
    half-replaced; `prune` also removes the folder's other plain files (an earlier build's artifact files).
    """
    from ortbuild.paths import inside

    targets = {name: inside(folder, name) for name in [*files, SIGNATURE, MANIFEST]}  # refuse names leading out
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    if prune:
        keep = {*files, SIGNATURE, *(v.name for v in files.values() if isinstance(v, Path) and v.parent == folder)}
        for stale in folder.iterdir():
            if stale.is_file() and stale.name not in keep:
                stale.unlink()
        if (folder / GOLDEN_DIR).is_dir() and not (folder / GOLDEN_DIR).is_symlink():  # the old artifact's
            import shutil

            shutil.rmtree(folder / GOLDEN_DIR)
    for name, blob in files.items():
        if isinstance(blob, Path) and blob.parent.resolve() == folder.resolve():
            targets[name].parent.mkdir(parents=True, exist_ok=True)
            os.replace(blob, targets[name])
        elif isinstance(blob, Path):
            atomic_copy(blob, targets[name])
        else:
            atomic_write(targets[name], blob)
    doc = m.to_json()
    atomic_write(targets[SIGNATURE], base64.b64encode(sign(doc)) + b"\n")
    atomic_write(targets[MANIFEST], doc)


def signature_problem(folder: Path, public_key: bytes) -> str | None:
    """Why manifest.sig does not verify the exact bytes of manifest.json with `public_key` (the trust root: the
    configured one, never the key a manifest names), or None."""
    from ortbuild.artifact import keys

    try:
        text = (folder / MANIFEST).read_bytes()
        sig = base64.b64decode((folder / SIGNATURE).read_bytes().strip(), validate=True)
    except FileNotFoundError as e:
        return f"{e.filename} is missing"
    except OSError as e:
        return f"{folder}: cannot read the manifest or its signature: {e.strerror or e}"
    except ValueError:
        return f"{folder / SIGNATURE} is not a base64 signature"
    if not keys.verify(public_key, sig, text):
        named = ""
        with contextlib.suppress(ValueError, KeyError, TypeError):
            named = f"; the manifest names key id {json.loads(text)['signing']['public_key_id']}"
        return (f"the signature of {folder / MANIFEST} does not verify with the trusted public key (id "
                f"{keys.public_key_id(public_key)}){named}")
    return None


def golden_listing(folder: Path) -> list[str]:
    """Every file under folder/golden/, as names relative to `folder` (golden/test_data_set_0/input_0.pb)."""
    root = folder / GOLDEN_DIR
    if not root.exists() and not root.is_symlink():
        return []
    if root.is_symlink() or not root.is_dir():
        return [GOLDEN_DIR]
    return sorted(str(p.relative_to(folder)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink())


def _file_problem(folder: Path, name: str, sha256: str, size: int | None, what: str) -> str | None:
    path = folder / name
    if path.is_symlink() or not path.is_file():
        return f"{what} {path} is missing" if not path.exists() else f"{what} {path} is not a plain file"
    if size is not None and path.stat().st_size != size:
        return f"{what} {name} is {path.stat().st_size} bytes, the manifest says {size}"
    if sha256_file(path) != sha256:
        return f"{what} {name} sha256 differs from the manifest (modified or corrupted)"
    return None


def integrity_problems(m: Manifest, folder: Path, public_key: bytes) -> list[str]:
    """The signature (with `public_key`), then every signed file against its size and sha256: the artifact's
    files, the loaders, custom-op libraries shipped beside it, and the golden data (golden/ holds exactly the
    files the manifest lists)."""
    problems = []
    sig = signature_problem(folder, public_key)
    if sig:
        problems.append(sig)
    checks: list[tuple[str, str, int | None, str]] = [(f.name, f.sha256, f.size, "artifact file")
                                                      for f in m.artifact.files]
    checks += [(lf.name, lf.sha256, None, "loader") for lf in m.loaders]
    checks += [(c["file"], c["sha256"], None, "custom-op library") for c in m.custom_ops if c.get("file")]
    checks += [(g.name, g.sha256, g.size, "golden file") for g in m.golden]
    for name, sha, size, what in checks:
        problem = _file_problem(folder, name, sha, size, what)
        if problem:
            problems.append(problem)
    extra = sorted(set(golden_listing(folder)) - {g.name for g in m.golden})
    if extra and not sig and _predates_signed_golden(folder):
        extra = []  # an older ortbuild's layout (golden data beside, unsigned): its build key changed, it rebuilds
    if extra:
        problems.append(f"golden data not in the signed manifest: {folder / extra[0]}"
                        + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""))
    return problems


def _predates_signed_golden(folder: Path) -> bool:
    """Whether the (signature-checked) manifest was written before manifests listed their golden data."""
    try:
        return "golden" not in json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return False


def trusted(folder: Path, public_key: bytes, *, development: bool = False, rebuildable: bool = False) \
        -> Manifest | None:
    """The manifest of an artifact directory whose signature verifies with `public_key` and whose every signed
    file matches it, else Tampered (naming the first problem, and how many more). `rebuildable`: None for a
    manifest signed with this key in another ortbuild's format (a rebuild replaces it), rather than an error."""
    from ortbuild.errors import Tampered

    hint = ("someone or something changed it after the build: find out what, then `ortbuild build --repair` "
            "(or `ortbuild clean`) rebuilds it on purpose" + (" (checked with a DEVELOPMENT key)" if development
                                                                else ""))
    sig = signature_problem(folder, public_key)
    if sig:
        raise Tampered(f"{folder}: {sig}", hint)
    try:
        m, _ = read(folder)
    except ArtifactError:
        if rebuildable:
            return None
        raise
    problems = integrity_problems(m, folder, public_key)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Tampered(f"{folder}: {problems[0]}{more}", hint)
    return m


def fit_problems(m: Manifest) -> list[str]:
    """Why this machine/environment should not use the artifact (empty: it fits)."""
    from ortbuild import runtime
    from ortbuild.project.config import Provider

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
    from ortbuild.project import options

    def plugin(name: str) -> options.PluginEP | None:  # the provider's plugin EP, as the build used it
        return options.PLUGINS.get(m.plugins[name]["package"]) if name in m.plugins else None

    configured = {p["name"]: Provider(p["name"], p.get("options", {})) for p in m.providers}
    compiled = tied.get("compiled_for", {}).get("provider")
    for name in tied.get("providers", []):
        reason = runtime.probe_provider(configured.get(name, Provider(name)), plugin(name))
        if reason:
            what = "the artifact is compiled for" if name == compiled else "the graph holds ops fused for"
            problems.append(f"{what} {name}: {reason}")
    for p in m.providers:
        if p["name"] not in tied.get("providers", []):
            reason = runtime.probe_provider(configured[p["name"]], plugin(p["name"]))
            if reason:
                problems.append(f"the target's provider cannot run here, ORT would fall back silently: {reason}")
    return problems


def sign_golden(folder: Path, files: dict[str, tuple[str, int]], sign: Callable[[bytes], bytes],
                public_key: bytes) -> Manifest:
    """Re-sign the manifest of a trusted artifact with its golden data (`files`: name -> (sha256, size), names
    relative to `folder`); nothing else in it changes."""
    from ortbuild.errors import Tampered

    sig = signature_problem(folder, public_key)  # the artifact's files were checked by the build, under the lock
    if sig:
        raise Tampered(f"{folder}: {sig}", "`ortbuild build --repair` rebuilds it")
    m, _ = read(folder)
    listed = [SignedFile(name, sha, size) for name, (sha, size) in sorted(files.items())]
    if listed != m.golden:
        m = dataclasses.replace(m, golden=listed)
        write_signed(folder, {}, m, sign)
    return m

