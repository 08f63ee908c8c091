"""A labelled evaluation set ([models.NAME.eval]) read lazily: the inputs a batch at a time, straight from the .npz
members (each .npy member's header, then `batch` rows of bytes; zipfile decompresses a deflated member as a stream),
one file of a directory at a time. Only the labels (one per sample) are held whole: an .npy is memory-mapped.
So thousands of samples take the memory of one batch, plus the labels and what the gate keeps per sample.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from ortbuild.errors import ConfigError, first_line
from ortbuild.project import data
from ortbuild.project.settings import EvalSet

Header = tuple[tuple[int, ...], np.dtype[np.generic]]


@dataclass(frozen=True)
class Batch:
    start: int                       # the index of its first sample
    count: int                       # its samples (the feed may hold more: padded to a fixed batch size)
    feed: dict[str, np.ndarray]


class EvalData:
    """The evaluation set of one model: its files' headers checked, labels read, nothing else loaded yet.
    `config`: targets.toml, `where`: models.NAME.eval (every ConfigError names both, and the file)."""

    def __init__(self, ev: EvalSet, config: str, where: str) -> None:
        self.config, self.where = config, where
        self.files = sorted(ev.inputs.glob("*.npz")) if ev.inputs.is_dir() else [ev.inputs]
        if not self.files:
            raise self._fail("inputs", f"{ev.inputs} holds no .npz files",
                             "put one or more .npz files keyed by input name in it (first axis: the samples)")
        self.headers: list[dict[str, Header]] = []
        self.counts: list[int] = []
        for f in self.files:
            arrays = data.npz_headers(f)
            if self.headers and set(arrays) != set(self.headers[0]):
                raise self._fail("inputs", f"{f.name} holds {sorted(arrays)}, {self.files[0].name} "
                                           f"{sorted(self.headers[0])}", "every file holds the same inputs")
            rows = {shape[0] if shape else -1 for shape, _ in arrays.values()}
            if len(rows) != 1 or -1 in rows:
                raise self._fail("inputs", f"{f}: the arrays' first axes differ or are missing ({sorted(rows)})",
                                 "the first axis of every array indexes the samples: give them all the same length")
            self.headers.append(arrays)
            self.counts.append(rows.pop())
        total = sum(self.counts)
        self.labels = self._labels(ev.labels)
        if len(self.labels) != total:
            raise self._fail("labels", f"{ev.labels.name} holds {len(self.labels)} labels, the inputs {total} samples",
                             "give one label per sample, in the order of the inputs (a directory's files in name "
                             "order)")
        self.samples = min(total, ev.max_samples) if ev.max_samples else total
        if self.samples == 0:
            raise self._fail("inputs", "holds no samples", "give at least one sample (first axis of the arrays)")

    def _fail(self, key: str, message: str, hint: str) -> ConfigError:
        return ConfigError(self.config, f"{self.where}.{key}", message, hint)

    def _labels(self, path: Path) -> np.ndarray:
        hint = "labels are an .npy or an .npz holding one array, one label per sample (numpy.save(path, labels))"
        try:
            if path.suffix.lower() == ".npz":
                arrays = data.npz_headers(path)
                if len(arrays) != 1:
                    raise self._fail("labels", f"{path.name} holds {len(arrays)} arrays ({', '.join(arrays)})", hint)
                with np.load(path, allow_pickle=False) as z:
                    labels: np.ndarray = z[next(iter(arrays))]
            else:
                labels = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise self._fail("labels", f"cannot read {path}: {first_line(e)}", hint) from None
        if labels.ndim == 0 or labels.dtype.hasobject or labels.dtype.kind not in "biuf":
            raise self._fail("labels", f"{path.name} holds a {labels.dtype} array of shape {list(labels.shape)}", hint)
        return labels

    def batches(self, size: int, pad_to: int | None = None) -> Iterator[Batch]:
        """The first `samples` samples, `size` at a time (a file's last batch may be shorter: batches do not span
        files), each input's rows read from its member only now. `pad_to`: a fixed batch size the model needs; a
        shorter batch repeats its last sample up to it (`count` says how many are real)."""
        start = 0
        for f, header, count in zip(self.files, self.headers, self.counts, strict=True):
            with ExitStack() as stack, zipfile.ZipFile(f) as z:
                readers = {name: _Rows(stack.enter_context(z.open(f"{name}.npy")), shape, dtype)
                           for name, (shape, dtype) in header.items()}
                done = 0
                while done < count and start < self.samples:
                    take = min(size, count - done, self.samples - start)
                    feed = {name: r.read(take) for name, r in readers.items()}
                    if pad_to is not None and take < pad_to:
                        feed = {k: np.concatenate([v, np.repeat(v[-1:], pad_to - take, axis=0)]) for k, v in
                                feed.items()}
                    yield Batch(start, take, feed)
                    done += take
                    start += take
            if start >= self.samples:
                return


class _Rows:
    """Rows of one .npy member of an open zip, read in order (a Fortran-order array is read whole: rare)."""

    def __init__(self, f: IO[bytes], shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> None:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _, fortran, _ = read(f, max_header_size=data.NPY_HEADER_MAX)
        self.f, self.row, self.dtype = f, shape[1:], dtype
        self.whole: np.ndarray | None = None
        self.at = 0
        if fortran:
            self.whole = np.asfortranarray(np.frombuffer(f.read(), dtype).reshape(shape, order="F"))

    def read(self, rows: int) -> np.ndarray:
        if self.whole is not None:
            out = np.ascontiguousarray(self.whole[self.at:self.at + rows])
            self.at += rows
            return out
        nbytes = rows * math.prod(self.row) * self.dtype.itemsize
        raw = self.f.read(nbytes)
        if len(raw) != nbytes:
            raise ConfigError(getattr(self.f, "name", "the .npz"), "", "ends before its header's shape: damaged")
        return np.frombuffer(raw, self.dtype).reshape((rows, *self.row)).copy()
