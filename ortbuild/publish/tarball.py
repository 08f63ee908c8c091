"""Deterministic, uncompressed .tar writing, and streaming reading that trusts nothing in the archive.

A bundle is mostly encrypted bytes, which no compressor shrinks (gzip -9 ran at 44 MB/s and made them 0.04%
larger), so bundles are plain tar. Members are never held whole in memory: each is copied and hashed in
CHUNK pieces, on the way in and on the way out, so memory stays flat whatever the bundle's size.

Writing: regular files only, `first` then sorted by name, PAX format (no 8 GiB member limit), mtime =
SOURCE_DATE_EPOCH (or 0), uid/gid 0 with empty owner names, mode 0644: equal files give equal bytes. Each file
is hashed while it is copied and checked against the digest the caller listed for it (a file that changed
since it was listed is refused); the archive itself is hashed while written (`write` returns its sha256).

Reading (`Reader`) never calls `extractall`. Every member must be a regular file whose name is a plain relative
path (no `..`, no absolute path, no backslash, no empty part), listed by the caller with its size and sha256,
seen once, with that size, and its content must hash to that sha256 (checked as its last chunk is read). The
bytes tar headers may take between two members' data are capped (HEADER_MAX: a huge PAX header or long name,
which tarfile reads whole, stops there), and a member's data at its listed size: a tar bomb, or a gzip bomb in
a gzip-compressed bundle (the earlier format, still read), stops at the cap. The whole file is hashed
on the same pass (`Reader.sha256`). Errors are ArtifactError naming the archive and the entry.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import hashlib
import io
import os
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ortbuild.errors import ArtifactError

BLOCK = 512
CHUNK = 1 << 20          # the piece members are copied, hashed and read in
HEADER_MAX = 1 << 20     # tar header bytes (PAX records, long names, padding) allowed before a member's data
GZIP_MAGIC = b"\x1f\x8b"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _HashingWriter:
    """The file tarfile writes into: hashes and counts every byte on its way to disk."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.hash, self.pos = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.raw.write(data)
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos


class _HashingReader:
    """A member's source file as tarfile copies it: hashed chunk by chunk; shorter than when it was listed is
    an error (tarfile's own would blame the archive)."""

    def __init__(self, path: Path, raw: BinaryIO) -> None:
        self.path, self.raw, self.hash = path, raw, hashlib.sha256()

    def read(self, n: int) -> bytes:
        data = self.raw.read(n)
        if len(data) < n:
            raise ArtifactError(f"{self.path}: changed while the bundle was written (it shrank)",
                                "release again once nothing writes into dist/")
        self.hash.update(data)
        return data


def write(out: Path, files: dict[str, bytes | Path], epoch: int, first: str,
          digests: dict[str, str] | None = None) -> str:
    """Write `files` (archive name -> content or a file to copy) as a deterministic .tar at `out`: `first` (the
    index a reader checks before anything else), then the others sorted by name. A file listed in `digests`
    (archive name -> sha256) must still have that digest as it is copied. Returns the archive's sha256."""
    digests = digests or {}
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as raw:  # O_NOFOLLOW: a symlink planted at `out` is never written through
        sink = _HashingWriter(raw)
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                          copybufsize=CHUNK) as tar:
            for name in [first, *sorted(set(files) - {first})]:
                content = files[name]
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.mtime = tarfile.REGTYPE, 0o644, epoch
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if isinstance(content, Path):
                    with open(content, "rb") as f:
                        info.size = os.fstat(f.fileno()).st_size
                        src = _HashingReader(content, f)
                        tar.addfile(info, src)
                    got = src.hash.hexdigest()
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
                    got = sha256(content)
                if name in digests and got != digests[name]:
                    raise ArtifactError(f"{content if isinstance(content, Path) else name}: changed while the "
                                        "bundle was written (its sha256 differs from the one listed in the index)",
                                        "release again once nothing writes into dist/")
    return sink.hash.hexdigest()


# ------------------------------------------------------------------------------------------ reading

class _Sequential:
    """The file tarfile reads (the decompressed side of a gzip bundle), strictly from start to end: a forward seek
    reads what it skips (so the whole file is hashed), a backward one is refused, and no read may go past the
    end `allow` set: a header longer than the cap, or a member longer than listed, is refused before it is read."""

    def __init__(self, inner: BinaryIO, where: str) -> None:
        self.inner, self.where = inner, where
        self.pos = self.limit = 0
        self.why = ""

    def allow(self, end: int, why: str) -> None:
        self.limit, self.why = end, why

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence != 0 or pos < self.pos:
            raise ArtifactError(f"{self.where}: read out of order (offset {pos}, at {self.pos})",
                                "never use this archive")
        while self.pos < pos and self.read(min(CHUNK, pos - self.pos)):
            pass
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or self.pos + n > self.limit:
            raise ArtifactError(f"{self.where}: {self.why}", "never use this archive")
        try:
            data = self.inner.read(n)
        except (OSError, EOFError, zlib.error) as e:
            raise ArtifactError(f"{self.where}: not a readable bundle ({e})",
                                "the file is damaged or truncated: fetch it again") from None
        self.pos += len(data)
        return data


class _RawHash:
    """The archive file as read from disk, hashed on the way (the digest SHA256SUMS signs)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.hash = raw, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hash.update(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def _name_problem(name: str) -> str | None:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return "an absolute or malformed path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with '..', '.' or an empty part"
    return None


def _kind(m: tarfile.TarInfo) -> str:
    for test, word in ((m.issym, "a symbolic link"), (m.islnk, "a hard link"), (m.isdir, "a directory"),
                       (m.ischr, "a character device"), (m.isblk, "a block device"), (m.isfifo, "a FIFO"),
                       (m.issparse, "a sparse file")):
        if test():
            return word
    if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        return f"an entry of type {m.type!r}"
    return "a regular file"


class Reader:
    """`for name, chunks in Reader(archive, index_name, index, listed)`: every member of `archive` in archive
    order, each after the checks described above, its content as an iterator of chunks (at most CHUNK bytes
    each; its sha256 is checked when the last one is read, and a member the caller does not read is read and
    checked before the next). The first member must be `index_name` with exactly the bytes `index` (the signed
    index published beside the archive); `listed` (name -> (size, sha256), from that index) names every other
    member. After the loop, `sha256` is the whole file's digest (trailing bytes included)."""

    def __init__(self, archive: Path, index_name: str, index: bytes, listed: dict[str, tuple[int, str]]) -> None:
        self.archive, self.index_name, self.index, self.listed = archive, index_name, index, listed
        self.where = str(archive)
        self.sha256 = ""

    def __iter__(self) -> Iterator[tuple[str, Iterator[bytes]]]:
        where = self.where
        seen: list[str] = []
        with open(self.archive, "rb") as f:
            compressed = f.read(len(GZIP_MAGIC)) == GZIP_MAGIC
            f.seek(0)
            raw = _RawHash(f)
            inner: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw  # type: ignore
            stream = _Sequential(inner, where)
            with self._errors():
                stream.allow(HEADER_MAX, f"the first tar headers take more than {HEADER_MAX} bytes (a tar or "
                                         "decompression bomb, or not a bundle)")
                with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
                    while True:
                        m = tar.next()
                        if m is None:
                            break
                        name, size = self._check(m, seen)
                        if stream.tell() != m.offset_data:
                            raise ArtifactError(f"{where}: entry '{name}': its data is not where its header ends")
                        stream.allow(tar.offset, f"entry '{name}' holds more than the {size} bytes its index "
                                                 "lists (a decompression bomb, or extra data)")
                        seen.append(name)
                        chunks = self._content(stream, m, name)
                        yield name, chunks
                        collections.deque(chunks, maxlen=0)  # what the caller left unread, read and checked
                        stream.allow(tar.offset + HEADER_MAX, f"the tar headers after entry '{name}' take more "
                                                              f"than {HEADER_MAX} bytes (a tar or decompression bomb)")
            raw.drain()
            self.sha256 = raw.hash.hexdigest()
        if not seen:
            raise ArtifactError(f"{where}: empty archive (no {self.index_name})", "fetch it again")
        missing = sorted(set(self.listed) - set(seen))
        if missing:
            raise ArtifactError(f"{where}: entry '{missing[0]}' is listed in the signed index but missing from the "
                                "archive" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                                "fetch it again")

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """tarfile's, gzip's and the file system's errors as ArtifactError naming the archive."""
        try:
            yield
        except tarfile.TarError as e:
            raise ArtifactError(f"{self.where}: damaged, or not a tar archive ({e})", "fetch it again") from None
        except (OSError, EOFError, zlib.error) as e:
            raise ArtifactError(f"{self.where}: not a readable bundle ({e})", "the file is damaged or truncated: "
                                "fetch it again") from None

    def _check(self, m: tarfile.TarInfo, seen: list[str]) -> tuple[str, int]:
        name = m.name
        label = f"{self.where}: entry '{name}'"
        if (problem := _name_problem(name)) is not None:
            raise ArtifactError(f"{label} is {problem}", "never extract this archive")
        if (kind := _kind(m)) != "a regular file":
            raise ArtifactError(f"{label} is {kind}; a bundle holds regular files only", "never extract this archive")
        if name in seen:
            raise ArtifactError(f"{label} appears twice", "never extract this archive")
        if not seen:
            if name != self.index_name:
                raise ArtifactError(f"{label} comes first; a bundle starts with {self.index_name}",
                                    "this is not an ortbuild bundle, or it was repacked")
            if m.size != len(self.index):
                raise ArtifactError(f"{label} differs from the signed index published beside the bundle",
                                    "never extract this archive")
            return name, m.size
        if name not in self.listed:
            raise ArtifactError(f"{label} is not listed in the signed index", "never extract this archive")
        if m.size != self.listed[name][0]:
            raise ArtifactError(f"{label} declares {m.size} bytes, the signed index lists {self.listed[name][0]}",
                                "never extract this archive")
        return name, m.size

    def _content(self, stream: _Sequential, m: tarfile.TarInfo, name: str) -> Iterator[bytes]:
        """The member's data, read straight from the archive after its header (tarfile skips to the next header
        by offset, so it need not see the data)."""
        label = f"{self.where}: entry '{name}'"
        h, n = hashlib.sha256(), 0
        while n < m.size:
            chunk = stream.read(min(CHUNK, m.size - n))
            if not chunk:
                raise ArtifactError(f"{label} is truncated ({n} of {m.size} bytes)", "fetch it again")
            n += len(chunk)
            h.update(chunk)
            if name == self.index_name and chunk != self.index[n - len(chunk):n]:
                raise ArtifactError(f"{label} differs from the signed index published beside the bundle",
                                    "never extract this archive")
            yield chunk
        if name != self.index_name and h.hexdigest() != self.listed[name][1]:
            raise ArtifactError(f"{label} differs from the signed index (its sha256: modified)",
                                "fetch the release again; never use a bundle that fails verify")
