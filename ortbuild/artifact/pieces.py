"""Piece digests (manifest format 3): each artifact file's stored bytes cut into its head (a container's 103-byte
header; none for a plain file) and fixed-size pieces (4 whole container chunks, 4 MiB + 64 bytes; 4 MiB for a plain
file), with the sha256 of each in the signed manifest beside the whole file's. sha256 cannot be split across cores;
pieces can: the loaders read, check and decrypt them on every core, and stop at the first bad one. Layout and
rules: docs/container.md."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PIECE_CHUNKS = 4          # container chunks per piece
PLAIN_PIECE = 4 << 20     # piece size of a file stored in plaintext (encrypt = false)


@dataclass(frozen=True)
class Pieces:
    """The sha256 of each piece of a file as stored: bytes [0, head) when head > 0 (a container's header), then
    pieces of `size` bytes (whole container chunks; the last may be shorter), in order (ortbuild.artifact.pieces)."""
    head: int
    size: int
    sha256: list[str]


def piece_count(total: int, head: int, size: int) -> int:
    """How many pieces a file of `total` bytes has: its head (when head > 0), then `size`-byte pieces."""
    return (1 if head else 0) + -(-max(0, total - head) // size)


def pieces_problem(name: str, total: int, p: Pieces | None, format_version: int) -> str | None:
    """Why the piece digests `p` of the artifact file `name` (`total` bytes) are not what format `format_version`
    requires, or None."""
    if p is None:
        return f"artifact file {name} has no piece digests (format {format_version})" if format_version >= 3 else None
    if format_version < 3:
        return f"artifact file {name} has piece digests, which format {format_version} does not know"
    if not (0 <= p.head <= total and 4096 <= p.size <= 1 << 30) or \
            len(p.sha256) != piece_count(total, p.head, p.size) or \
            not all(isinstance(d, str) and len(d) == 64 for d in p.sha256):
        return f"artifact file {name}: its piece digests do not fit its size"
    return None


def container_layout(chunk_size: int, header: int) -> tuple[int, int]:
    """(head, size) of the pieces of a container with `chunk_size`-byte chunks (each stored with a 16-byte tag)."""
    return header, PIECE_CHUNKS * (chunk_size + 16)


def spans(total: int, head: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece of a `total`-byte file."""
    out = [(0, head)] if head else []
    out += [(at, min(size, total - at)) for at in range(head, total, size)]
    return out


class Hasher:
    """The whole sha256 and the piece digests of a file fed in order (the build hashes what it writes)."""

    def __init__(self, head: int, size: int) -> None:
        self.head, self.size = head, size
        self.whole = hashlib.sha256()
        self.done: list[str] = []
        self.piece = hashlib.sha256()
        self.filled = 0      # bytes in the current piece
        self.total = 0

    def _room(self) -> int:
        return (self.head if not self.done and self.head else self.size) - self.filled

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.whole.update(view)
        self.total += len(view)
        while len(view):
            take = min(self._room(), len(view))
            self.piece.update(view[:take])
            self.filled += take
            view = view[take:]
            if self._room() == 0:
                self.done.append(self.piece.hexdigest())
                self.piece, self.filled = hashlib.sha256(), 0

    def result(self) -> tuple[str, Pieces]:
        """(the whole file's sha256, its piece digests)."""
        done = self.done + ([self.piece.hexdigest()] if self.filled else [])
        return self.whole.hexdigest(), Pieces(head=self.head, size=self.size, sha256=done)


def of_bytes(data: bytes, head: int = 0, size: int = PLAIN_PIECE) -> tuple[str, Pieces]:
    h = Hasher(head, size)
    h.update(data)
    return h.result()


def workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def problem(path: Path, name: str, sha256: str, p: Pieces) -> str | None:
    """Why the file at `path` is not the artifact file `name` as signed (its whole `sha256` and every piece of
    `p`), or None. The pieces are hashed on a pool of threads (hashlib releases the GIL) while this thread hashes
    the whole."""
    bad: list[int] = []
    with open(path, "rb", buffering=0) as fh, ThreadPoolExecutor(max(1, workers() - 1)) as pool:
        fd = fh.fileno()

        def piece(i: int, at: int, n: int) -> None:
            if hashlib.sha256(os.pread(fd, n, at)).hexdigest() != p.sha256[i]:
                bad.append(i)

        futures: list[Future[None]] = []
        places = spans(os.fstat(fd).st_size, p.head, p.size)
        if len(places) != len(p.sha256):
            return f"artifact file {name} has {len(places)} pieces, the manifest lists {len(p.sha256)}"
        for i, (at, n) in enumerate(places):
            futures.append(pool.submit(piece, i, at, n))
        whole = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            whole.update(chunk)
        for fut in futures:
            fut.result()
    if bad:
        return (f"artifact file {name}: piece {min(bad)} of {len(p.sha256)} differs from the manifest (modified or "
                "corrupted)")
    if whole.hexdigest() != sha256:
        return f"artifact file {name} sha256 differs from the manifest (modified or corrupted)"
    return None
