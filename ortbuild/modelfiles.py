"""A model is its graph file plus the external-data files its tensors name: one list, used by every step.

Digests, sizes, the build key, the manifest's source record, release provenance, the size gate and every
memory or temp-space estimate count all of a model's files, never the graph file alone.

Finding the files is cheap: the graph file is streamed once (its sha256 is needed anyway) and parsed only when
it contains the field name external data uses (`location`); a graph without it has no external data.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, NotRequired, TypedDict

from ortbuild.errors import ConfigError

if TYPE_CHECKING:
    import onnx

# protobuf's limit for one serialized message: a model whose graph and embedded tensors pass it must keep its
# tensors as external data (ONNX's own limit, checked by onnx.save_model and ORT)
PROTOBUF_LIMIT = (2 << 30) - 1
_MARKER = b"location"  # the external_data key every externally stored tensor carries (a protobuf string)
_CHUNK = 1 << 20


class FileRecord(TypedDict):
    """One file of a model as the manifest's `source.files` and release provenance record it."""
    file: str           # the graph file's own name, or an external-data file's location as the graph names it
    sha256: str
    size: int


class ValueInfo(TypedDict):
    """One input or output of a model: what the manifest's `io` and `golden_run.outputs` record."""
    name: str
    dtype: str                            # numpy's name (float32), or seq(...)/map(...) for non-tensor values
    shape: list[int | str | None] | None  # a dim's size, its symbolic name or None; None: unknown rank / no tensor
    kind: NotRequired[str]                # sequence | map | optional ...: only for values that are no tensor


class Signature(TypedDict):
    """A model's inputs (its initializers left out) and outputs, in graph order: the manifest's `io`."""
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]


@dataclass(frozen=True)
class ModelFile:
    path: Path          # where it is now
    location: str       # the name the graph uses for it ("" for the graph file itself)
    sha256: str
    size: int

    def as_json(self) -> FileRecord:
        return {"file": self.location or self.path.name, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class ModelFiles:
    graph: ModelFile
    external: tuple[ModelFile, ...]   # in the order the graph first names them

    @property
    def files(self) -> tuple[ModelFile, ...]:
        return (self.graph, *self.external)

    @property
    def size(self) -> int:
        """Every byte of the model: the graph file and its external data."""
        return sum(f.size for f in self.files)

    @property
    def weights_size(self) -> int:
        """Bytes of tensor data: the external files, or the graph file itself when it embeds its weights."""
        return sum(f.size for f in self.external) or self.graph.size

    @property
    def has_external_data(self) -> bool:
        return bool(self.external)

    @property
    def keeps_external_data(self) -> bool:
        """Whether copies of this model (intermediates, the artifact) keep the weights as external data: the
        source does, or could not be one file."""
        return self.has_external_data or needs_external_data(self.weights_size)

    def digests(self) -> dict[str, str]:
        """Build-key parts: `source` (the graph file) and `source:<location>` per external-data file, so a
        changed weight file is named by the plan."""
        return {"source": self.graph.sha256, **{f"source:{f.location}": f.sha256 for f in self.external}}


def _hash(path: Path, marker: bytes | None = None, hashed: bool = True) -> tuple[str, int, bool]:
    """(sha256 or "", size, whether `marker` occurs), streaming the file in chunks."""
    if not hashed and marker is None:
        return "", path.stat().st_size, False
    h, size, found, tail = hashlib.sha256(), 0, False, b""
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            if hashed:
                h.update(chunk)
            size += len(chunk)
            if marker and not found:
                found = marker in tail + chunk[:len(marker) - 1] or marker in chunk
                tail = chunk[-(len(marker) - 1):]
    return h.hexdigest() if hashed else "", size, found


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of a graph that may hold data: initializers, sparse ones, attribute tensors, and the
    same inside subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for s in graph.sparse_initializer:
        yield s.values
        yield s.indices
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from graph_tensors(a.g)
            for g in a.graphs:
                yield from graph_tensors(g)


def locations(model: onnx.ModelProto) -> list[str]:
    """The external-data file names of a ModelProto (loaded without its external data), in first-use order."""
    out: dict[str, None] = {}
    for t in graph_tensors(model.graph):
        if t.data_location == 1:  # TensorProto.EXTERNAL
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            out.setdefault(loc, None)
    return list(out)


def location_problem(location: str) -> str | None:
    """Why an external-data location cannot be read safely (ORT refuses the same), or None."""
    p = PurePosixPath(location)
    if not location or p.is_absolute() or ".." in p.parts or "\\" in location or "\0" in location:
        return f"external data location '{location}' must be a relative path inside the model's folder"
    return None


NOT_ONNX_HINT = ("give the path of an ONNX model (a serialized onnx.ModelProto, e.g. from torch.onnx.export or "
                 "onnx.save_model); convert other formats to ONNX first")


NO_GRAPH = "it parses as protobuf, but holds no ONNX graph"


def _unparsed(e: Exception) -> str:
    return f"protobuf cannot parse it as an onnx.ModelProto ({str(e) or type(e).__name__})"


def not_onnx(path: Path, data: bytes, why: str, where: str = "") -> ConfigError:
    """The error for a file that does not parse as an ONNX model, naming it and saying what it looks like."""
    head = data[:200]
    if head.startswith(b"version https://git-lfs"):
        return ConfigError(str(path), where, "is a Git LFS pointer, not the ONNX model it stands for",
                           "fetch the model itself: `git lfs pull` (or `git lfs fetch && git lfs checkout`)")
    if head.startswith((b"PK\x03\x04", b"\x93NUMPY")):
        what = "a zip archive (an .npz, a .pt or a .zip?)" if head.startswith(b"PK") else "a numpy .npy array"
        return ConfigError(str(path), where, f"is not an ONNX model: it is {what}", NOT_ONNX_HINT)
    text = head.lstrip()[:1] in (b"{", b"<", b"#") or (bool(head) and all(32 <= b < 127 or b in b"\r\n\t"
                                                                            for b in head))
    looks = " (it looks like a text file)" if text else ""
    return ConfigError(str(path), where, f"is not an ONNX model{looks}: {why}", NOT_ONNX_HINT)


def parse_graph(data: bytes, path: Path, where: str = "") -> onnx.ModelProto:
    """The ModelProto serialized in `data` (read from `path`); ConfigError naming `path` when it is not one."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeWarning, ValueError) as e:
        raise not_onnx(path, data, _unparsed(e), where) from None
    if not model.HasField("graph"):  # protobuf reads many short byte strings as some message
        raise not_onnx(path, data, NO_GRAPH, where)
    return model


def load_graph(path: Path, where: str = "") -> onnx.ModelProto:
    """The ModelProto at `path` without its external data; ConfigError naming `path` when it is not one."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
        why = "" if model.HasField("graph") else NO_GRAPH
    except (DecodeError, RuntimeWarning, ValueError) as e:
        why = _unparsed(e)
    except OSError as e:
        raise ConfigError(str(path), where, f"cannot be read ({e.strerror or e})",
                          "make the model file readable by you") from None
    if why:
        with open(path, "rb") as f:
            head = f.read(200)
        raise not_onnx(path, head, why, where)
    return model


def of(path: Path, *, where: str = "", hashed: bool = True) -> ModelFiles:
    """The model at `path` with its external-data files, each hashed (sha256 "" when not `hashed`).
    ConfigError (at `where`) for a location that leaves the model's folder or names a missing file."""
    sha, size, marked = _hash(path, _MARKER, hashed)
    graph = ModelFile(path, "", sha, size)
    if not marked:
        return ModelFiles(graph, ())
    model = load_graph(path, where)
    external = []
    for loc in locations(model):
        problem = location_problem(loc)
        if problem:
            raise ConfigError(str(path), where, problem, "save the model with onnx.save_model(..., "
                              "save_as_external_data=True, location='<name>') so its data sits beside it")
        file = path.parent / loc
        if not file.is_file():
            raise ConfigError(str(path), where, f"the model's external data file '{loc}' is missing "
                              f"(looked for {file})", "keep the model's .data files beside its .onnx file")
        fsha, fsize, _ = _hash(file, None, hashed)
        external.append(ModelFile(file, loc, fsha, fsize))
    problem = _extent_problem(model, {f.location: f.size for f in external})
    if problem:
        raise ConfigError(str(path), where, problem, "the data file was cut short or belongs to another export of "
                          "the model: copy or export the .onnx file and its .data files together again")
    return ModelFiles(graph, tuple(external))


def of_directory(folder: Path, *, hashed: bool = True) -> ModelFiles:
    """A generative model's Hugging Face-format directory: config.json stands for the graph, and every other file
    directly in it (weights, tokenizer, the data files beside them) is one of its files, by name, so a changed
    weight file is named by the plan. Hidden files and subdirectories are not part of the model."""
    config = folder / "config.json"
    sha, size, _ = _hash(config, None, hashed)
    others = []
    for file in sorted(folder.iterdir()):
        if file.name.startswith(".") or file == config or not file.is_file():
            continue
        fsha, fsize, _ = _hash(file, None, hashed)
        others.append(ModelFile(file, file.name, fsha, fsize))
    return ModelFiles(ModelFile(config, "", sha, size), tuple(others))


def of_source(path: Path, *, where: str = "", hashed: bool = True) -> ModelFiles:
    """A source model's files: an ONNX file's (of) or a generative model's directory's (of_directory)."""
    return of_directory(path, hashed=hashed) if path.is_dir() else of(path, where=where, hashed=hashed)


def nbytes(t: onnx.TensorProto) -> int:
    """A TensorProto's data bytes, whether stored inside the graph or as external data (not loaded)."""
    import onnx

    if t.data_location == onnx.TensorProto.EXTERNAL:
        length = next((e.value for e in t.external_data if e.key == "length"), None)
        if length is not None:
            return int(length)
    if t.raw_data:
        return len(t.raw_data)
    n = 1
    for d in t.dims:
        n *= d
    try:
        item = int(onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)
    except (KeyError, ValueError, TypeError):  # string tensors and types numpy cannot name
        return int(t.ByteSize())
    return n * item if n else int(t.ByteSize())


def extent(t: onnx.TensorProto) -> tuple[str, int, int | None]:
    """Where an external tensor keeps its bytes: location, offset and length (None: to the file's end), as
    ONNX's own `ExternalDataInfo` parses them (ValueError for negative offsets and lengths)."""
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(t)
    return info.location, info.offset or 0, info.length


def _extent_problem(model: onnx.ModelProto, sizes: dict[str, int]) -> str | None:
    """Why a tensor's external data does not lie inside its file (by the sizes in `sizes`), or None: checked
    here, before any step reads a weight, instead of as a runtime's out-of-bounds error minutes later."""
    for t in graph_tensors(model.graph):
        if t.data_location != 1:  # TensorProto.EXTERNAL
            continue
        try:
            location, offset, length = extent(t)
        except ValueError as e:
            return str(e)
        size = sizes[location]
        end = offset + (length if length is not None else 0)
        if end > size:
            return f"tensor '{t.name}' needs bytes {offset}-{end} of '{location}', which holds {size} bytes"
    return None


def remove(path: Path) -> None:
    """Delete a model and its external data (the build's temp space holds at most two models at once)."""
    if path.exists():
        for f in of(path, hashed=False).files:
            f.path.unlink(missing_ok=True)


def stat_key(path: Path) -> tuple[str, int, int]:
    st = os.stat(path)
    return str(path), st.st_size, st.st_mtime_ns


def needs_external_data(weights: int) -> bool:
    """Whether a model with `weights` bytes of tensors must be written with external data (with headroom for
    the graph itself and protobuf's field overhead)."""
    return weights > PROTOBUF_LIMIT - (64 << 20)
