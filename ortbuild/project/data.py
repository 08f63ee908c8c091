"""Golden inputs and calibration data: .npz files or ONNX test_data_set directories.

An .npz is checked before any array is decompressed: each member must be an .npy array, whose header (read from
the first bytes of the member) gives a numeric dtype and a shape whose bytes fit in the member, and the members
together may decompress to no more than NPZ_MAX_BYTES, nor to more than NPZ_MAX_RATIO times the file's size
once past NPZ_RATIO_FLOOR (a zip bomb: 1 MB of zip holding 1 GiB of zeros). zipfile never decompresses a
member past the size its directory records, so these bounds hold whatever the file claims.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from ortbuild import paths
from ortbuild.errors import ConfigError, first_line
from ortbuild.modelfiles import Signature
from ortbuild.project.checker import did_you_mean

Feed = dict[str, np.ndarray]


def read_pb(path: Path, kind: str = "tensor") -> tuple[str, object]:
    """(name, value) of a serialized TensorProto (ndarray), SequenceProto (list) or MapProto (dict)."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.SequenceProto() if kind == "sequence" else onnx.MapProto() if kind == "map" else onnx.TensorProto()
    _readable(path)
    try:
        proto.ParseFromString(path.read_bytes())
        if isinstance(proto, onnx.SequenceProto):
            return proto.name, numpy_helper.to_list(proto)
        if isinstance(proto, onnx.MapProto):
            return proto.name, numpy_helper.to_dict(proto)
        return proto.name, numpy_helper.to_array(proto)
    except Exception as e:  # protobuf's DecodeError and numpy conversion errors alike
        raise ConfigError(str(path), "", f"not a serialized onnx {type(proto).__name__}: {e}") from None


def numbered(folder: Path, prefix: str) -> list[Path]:
    """folder/{prefix}_K.pb in the order of K (input_0.pb, input_1.pb, ..., input_10.pb)."""
    found = [p for p in folder.glob(f"{prefix}_*.pb") if p.stem.split("_", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.stem.split("_", 1)[1]))


def dataset_feed(folder: Path, input_names: list[str]) -> Feed:
    files = numbered(folder, "input")
    if not files:
        raise ConfigError(str(folder), "", "holds no input_K.pb files")
    feed: Feed = {}
    for i, f in enumerate(files):
        name, arr = read_pb(f)
        assert isinstance(arr, np.ndarray)  # a TensorProto reads as an array
        if not name:
            if i >= len(input_names):
                raise ConfigError(str(f), "", f"unnamed tensor #{i}, but the model has {len(input_names)} inputs")
            name = input_names[i]
        feed[name] = arr
    return feed


def datasets(path: Path) -> list[Path]:
    sets = sorted((p for p in path.glob("test_data_set_*") if p.is_dir() and p.name.rsplit("_", 1)[1].isdigit()),
                  key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if not sets:
        raise ConfigError(str(path), "", "is a directory without test_data_set_N/ subdirectories",
                          "use an .npz keyed by input name, or the ONNX layout test_data_set_N/input_K.pb")
    return sets


def _readable(path: Path) -> None:
    problem = paths.input_problem(path, limit=paths.MAX_DATA_BYTES)
    if problem:
        raise ConfigError(str(path), "", problem)


NPZ_HINT = "write it with numpy.savez(path, name=array, ...), keyed by input (or output) name"
NPZ_MAX_BYTES = paths.MAX_DATA_BYTES   # every array of one .npz, decompressed
NPZ_RATIO_FLOOR = 256 << 20            # up to this, an .npz may compress as well as it likes
NPZ_MAX_RATIO = 100                    # beyond it, decompressed / file size: real data never compresses 100x
NPY_HEADER_MAX = 10000                 # numpy's own bound on an .npy header


def npz_arrays(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype[np.generic]]]:
    """name -> (shape, dtype) of each array of the .npz at `path`, from the members' .npy headers, checking the
    bounds above before anything is decompressed (ConfigError naming the file and the member)."""
    size = path.stat().st_size
    bound = min(NPZ_MAX_BYTES, max(NPZ_RATIO_FLOOR, NPZ_MAX_RATIO * size))
    out: dict[str, tuple[tuple[int, ...], np.dtype[np.generic]]] = {}
    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            member = info.filename

            def refuse(problem: str, hint: str = NPZ_HINT, member: str = member) -> ConfigError:
                return ConfigError(str(path), "", f"member '{member}' {problem}", hint)

            if not member.endswith(".npy"):
                raise refuse("is not an .npy array")
            name = member[:-len(".npy")]
            if name in out:
                raise refuse("appears twice")
            total += info.file_size
            if total > bound:
                what = (f"more than the {NPZ_MAX_BYTES >> 30} GiB golden or calibration data may be" if
                        bound == NPZ_MAX_BYTES else f"more than {NPZ_MAX_RATIO} times the file's "
                        f"{size / (1 << 20):.1f} MiB: a zip bomb, not data")
                raise refuse(f"takes the arrays to {total / (1 << 20):.0f} MiB decompressed, {what}",
                             "refused before decompressing anything; real data of that size is saved with "
                             "numpy.savez (uncompressed) or does not compress that well")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=NPY_HEADER_MAX)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=NPY_HEADER_MAX)
                else:
                    raise refuse(f"is .npy format {version[0]}.{version[1]}; numeric arrays are 1.0 or 2.0")
            if dtype.hasobject:
                raise refuse(f"holds Python objects ({dtype}), which load only by unpickling",
                             "inputs are numeric arrays: convert them with numpy.asarray(x, dtype=...)")
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes > info.file_size:
                raise refuse(f"declares a {list(shape)} {dtype} array ({nbytes} bytes) but holds "
                             f"{info.file_size} bytes: damaged or forged")
            out[name] = (tuple(shape), dtype)
    return out


_NPZ_ERRORS = (OSError, ValueError, zipfile.BadZipFile, EOFError, RuntimeError, NotImplementedError)


def npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype[np.generic]]]:
    """npz_arrays() of the .npz at `path`, which must hold at least one. Anything else under that name (a .npy,
    text, a pickle) is refused by its magic bytes first, so the error says what the file is instead of numpy's
    guess."""
    _readable(path)
    with path.open("rb") as f:
        magic = f.read(6)
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        what = "a single .npy array" if magic == b"\x93NUMPY" else "not a zip archive"
        raise ConfigError(str(path), "", f"is not an .npz file ({what})", NPZ_HINT)
    try:
        arrays = npz_arrays(path)
    except _NPZ_ERRORS as e:
        raise ConfigError(str(path), "", f"cannot read as .npz: {first_line(e)}", NPZ_HINT) from None
    if not arrays:
        raise ConfigError(str(path), "", "holds no arrays", NPZ_HINT)
    return arrays


def npz(path: Path) -> Feed:
    """The arrays of an .npz file, its headers checked first (npz_headers)."""
    npz_headers(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except _NPZ_ERRORS as e:
        raise ConfigError(str(path), "", f"cannot read as .npz: {first_line(e)}", NPZ_HINT) from None


def load_feed(path: Path, input_names: list[str]) -> Feed:
    """One feed: an .npz keyed by input name, or test_data_set_0 of an ONNX-layout directory."""
    if path.is_dir():
        return dataset_feed(datasets(path)[0], input_names)
    return npz(path)


def nonfinite(arr: np.ndarray) -> int:
    """How many NaN or infinite values a float or complex array holds (0 for any other dtype)."""
    if arr.dtype.kind not in "fc" or not arr.size:
        return 0
    return int(arr.size - np.count_nonzero(np.isfinite(arr)))


def _finite(feeds: list[tuple[str, Feed]]) -> None:
    """Calibration data must be finite: a NaN or Inf sample poisons the quantizer's ranges (min/max, histograms)
    for every tensor it reaches. Golden inputs may hold NaN/Inf (IsNaN, IsInf and masking models are tested on
    them; the comparison expects NaN/Inf exactly where the reference has them), so only calibration is checked."""
    for where, feed in feeds:
        for name, arr in feed.items():
            if bad := nonfinite(arr):
                raise ConfigError(where, "", f"calibration input '{name}' holds {bad} NaN or infinite value(s) of "
                                             f"{arr.size}",
                                  "calibration samples must be finite (realistic inputs): NaN or Inf would set the "
                                  "quantization ranges; golden inputs may hold them, calibration data may not")


def load_samples(path: Path, input_names: list[str]) -> list[Feed]:
    """Calibration samples: each .npz row (first axis) as a batch of one, or each test_data_set_N. Every value
    must be finite (ConfigError naming the file and the input)."""
    if path.is_dir():
        sets = datasets(path)
        feeds = [dataset_feed(d, input_names) for d in sets]
        _finite([(str(d), f) for d, f in zip(sets, feeds, strict=True)])
        return feeds
    arrays = npz(path)
    _finite([(str(path), arrays)])
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1:
        raise ConfigError(str(path), "", f"arrays have different sample counts {sorted(counts)}",
                          "the first axis of every array indexes the calibration samples")
    n = counts.pop()
    return [{k: a[i:i + 1] for k, a in arrays.items()} for i in range(n)]


Shapes = dict[str, tuple[tuple[int, ...], str]]  # input name -> (shape, dtype) of one feed's arrays


def shapes(feed: Feed) -> Shapes:
    return {name: (tuple(arr.shape), str(arr.dtype)) for name, arr in feed.items()}


def golden_shapes(path: Path, input_names: list[str]) -> list[tuple[str, Shapes]]:
    """(where, shapes) of every feed of the golden inputs at `path`, for checking them without running anything:
    an .npz from its members' .npy headers (nothing decompressed), each test_data_set_N of a directory read."""
    if path.is_dir():
        return [(str(d), shapes(dataset_feed(d, input_names))) for d in datasets(path)]
    arrays = npz_headers(path)
    return [(str(path), {name: (shape, str(dtype)) for name, (shape, dtype) in arrays.items()})]


def _dims(shape: list[int | str | None] | None) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" if shape is not None else "any shape"


def inputs_problems(found: Shapes, signature: Signature) -> list[str]:
    """What does not fit between one feed (name -> shape, dtype) and a model's input signature: a missing or an
    unexpected input, an element type, a rank, a fixed dimension (named, unknown and non-positive dimensions take
    any size)."""
    inputs = {i["name"]: i for i in signature["inputs"]}
    missing = [n for n in inputs if n not in found]
    problems = [f"input '{n}' ({inputs[n]['dtype']} {_dims(inputs[n]['shape'])}) is missing" for n in missing]
    for name in (n for n in found if n not in inputs):
        problems.append(f"'{name}' is not an input of the model{did_you_mean(name, missing or list(inputs))}")
    for name, (shape, dtype) in found.items():
        spec = inputs.get(name)
        if spec is None:
            continue
        if dtype != spec["dtype"]:
            problems.append(f"input '{name}' is {dtype}, the model wants {spec['dtype']}")
        want = spec["shape"]
        if want is None:
            continue
        if len(shape) != len(want):
            problems.append(f"input '{name}' has shape {list(shape)} (rank {len(shape)}), the model wants rank "
                            f"{len(want)} {_dims(want)}")
            continue
        # a dimension of 0 or below (-1: exporters' "any size") is no fixed size
        fixed = [(k, d, n) for k, (d, n) in enumerate(zip(want, shape, strict=True))
                 if isinstance(d, int) and d > 0 and d != n]
        if fixed:
            said = ", ".join(f"dim {k} is {n}, not {d}" for k, d, n in fixed)
            problems.append(f"input '{name}' has shape {list(shape)}, the model wants {_dims(want)} ({said})")
    return problems


def check_shapes(found: Shapes, signature: Signature, where: str, *, config: str = "", key: str = "") -> None:
    """ConfigError naming every problem of inputs_problems(); `where` is the data file (or test_data_set_N). With
    `config` (targets.toml) and `key` (models.X.inputs) the error names the declaration too."""
    problems = inputs_problems(found, signature)
    if not problems:
        return
    wanted = "; ".join(f"'{i['name']}' {i['dtype']} {_dims(i['shape'])}" for i in signature["inputs"])
    first = signature["inputs"][0] if signature["inputs"] else {"name": "name", "dtype": "float32"}
    hint = (f"the model's inputs are {wanted} (named dimensions take any size, numbered ones must match): save one "
            f"array per input, under its name, of its dtype and shape, e.g. numpy.savez(path, "
            f"{first['name']}=x.astype(numpy.{first['dtype']}), ...)")
    message = "; ".join(problems)
    if config:
        raise ConfigError(config, key, f"{where}: {message}", hint)
    raise ConfigError(where, key, message, hint)


def check_feed(feed: Feed, signature: Signature, where: str, *, config: str = "", key: str = "") -> None:
    """Names, dtypes, ranks and fixed dimensions of a feed against a model's input signature (check_shapes).
    Values are not judged here: golden inputs may hold NaN/Inf; calibration data is checked for them by
    load_samples()."""
    check_shapes(shapes(feed), signature, where, config=config, key=key)
