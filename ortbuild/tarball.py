"""Deterministic .tar.gz writing, and reading that trusts nothing in the archive.

Writing: regular files only, sorted by name, PAX format (no 8 GiB member limit), mtime = SOURCE_DATE_EPOCH
(or 0), uid/gid 0 with empty owner names, mode 0644, and a gzip header with no name and mtime 0 at a fixed
level: equal files give equal bytes (for one zlib version; the bundle's digest is what is signed).

Reading never calls `extractall`. Every member must be a regular file whose name is a plain relative path
(no `..`, no absolute path, no backslash, no empty part), listed by the caller with its size, seen once,
and no bigger than listed; the decompressed stream is capped at the listed total (a gzip or tar bomb stops
at the cap). Errors are ArtifactError naming the archive and the entry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import ArtifactError

GZIP_LEVEL = 9
BLOCK = 512
READ_AHEAD = 1 << 16


def write(out: Path, files: dict[str, bytes | Path], epoch: int, first: str) -> None:
    """Write `files` (archive name -> content or a file to copy) as a deterministic .tar.gz at `out`: `first`
    (the index a reader checks before anything else), then the others sorted by name."""
    with open(out, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in [first, *sorted(set(files) - {first})]:
            content = files[name]
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.REGTYPE, 0o644, epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if isinstance(content, Path):
                info.size = content.stat().st_size
                with open(content, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))


class _Capped(io.RawIOBase):
    """A read-only stream that refuses to give more than `limit` bytes (the decompressed side of a bomb)."""

    def __init__(self, inner: BinaryIO, limit: int, where: str) -> None:
        self.inner, self.limit, self.where, self.count = inner, limit, where, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            data = self.inner.read(len(b))
        except (OSError, EOFError, zlib.error) as e:
            raise ArtifactError(f"{self.where}: not a readable .tar.gz ({e})",
                                "the file is damaged or truncated: fetch it again") from None
        self.count += len(data)
        if self.count > self.limit:
            raise ArtifactError(f"{self.where}: decompresses to more than the {self.limit} bytes its index lists "
                                "(a decompression bomb, or extra data)", "never use this archive")
        b[:len(data)] = data
        return len(data)


def _name_problem(name: str) -> str | None:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return "an absolute or malformed path"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with '..', '.' or an empty part"
    return None


def _kind(m: tarfile.TarInfo) -> str:
    for test, word in ((m.issym, "a symbolic link"), (m.islnk, "a hard link"), (m.isdir, "a directory"),
                       (m.ischr, "a character device"), (m.isblk, "a block device"), (m.isfifo, "a FIFO")):
        if test():
            return word
    return "a regular file" if m.isreg() else f"an entry of type {m.type!r}"


def members(archive: Path, index_name: str, index: bytes, listed: dict[str, int]) -> Iterator[tuple[str, bytes]]:
    """Yield (name, content) of every member of `archive`, checking each as described above.

    The first member must be `index_name` with exactly the bytes `index` (the signed index published beside
    the archive); `listed` (name -> size, from that index) names every other member. Members are yielded in
    archive order, after their checks; the caller checks their digests.
    """
    where = str(archive)
    seen: set[str] = set()
    # + headers and padding per member, the end record, and the reader's read-ahead
    total = len(index) + sum(listed.values()) + BLOCK * (3 * len(listed) + 16) + tarfile.RECORDSIZE + READ_AHEAD
    with open(archive, "rb") as raw:
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        capped = io.BufferedReader(_Capped(gz, total, where), buffer_size=READ_AHEAD)  # type: ignore[arg-type]
        try:
            tar = tarfile.open(fileobj=capped, mode="r|")  # noqa: SIM115 (closed with the file below)
            for m in tar:
                name = m.name
                label = f"{where}: entry '{name}'"
                if (problem := _name_problem(name)) is not None:
                    raise ArtifactError(f"{label} is {problem}", "never extract this archive")
                if not m.isreg():
                    raise ArtifactError(f"{label} is {_kind(m)}; a bundle holds regular files only",
                                        "never extract this archive")
                if name in seen:
                    raise ArtifactError(f"{label} appears twice", "never extract this archive")
                if not seen:
                    if name != index_name:
                        raise ArtifactError(f"{label} comes first; a bundle starts with {index_name}",
                                            "this is not an ortbuild bundle, or it was repacked")
                    if m.size != len(index) or _read(tar, m, label) != index:
                        raise ArtifactError(f"{label} differs from the signed index published beside the bundle",
                                            "never extract this archive")
                    seen.add(name)
                    yield name, index
                    continue
                seen.add(name)
                if name not in listed:
                    raise ArtifactError(f"{label} is not listed in the signed index", "never extract this archive")
                if m.size != listed[name]:
                    raise ArtifactError(f"{label} declares {m.size} bytes, the signed index lists {listed[name]}",
                                        "never extract this archive")
                yield name, _read(tar, m, label)
        except tarfile.TarError as e:
            raise ArtifactError(f"{where}: damaged .tar.gz ({e})", "fetch it again") from None
        except (OSError, EOFError, zlib.error) as e:
            raise ArtifactError(f"{where}: not a readable .tar.gz ({e})", "the file is damaged or truncated: "
                                "fetch it again") from None
    if not seen:
        raise ArtifactError(f"{where}: empty archive (no {index_name})", "fetch it again")
    missing = sorted(set(listed) - seen)
    if missing:
        raise ArtifactError(f"{where}: entry '{missing[0]}' is listed in the signed index but missing from the "
                            "archive" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                            "fetch it again")


def _read(tar: tarfile.TarFile, m: tarfile.TarInfo, label: str) -> bytes:
    f = tar.extractfile(m)
    if f is None:
        raise ArtifactError(f"{label} cannot be read")
    data = f.read()
    if len(data) != m.size:
        raise ArtifactError(f"{label} is truncated ({len(data)} of {m.size} bytes)", "fetch it again")
    return data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
