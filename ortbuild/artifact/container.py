"""Container format v1: envelope-encrypted, chunked AES-256-GCM (STREAM). Byte layout: docs/container.md.

    header (103 bytes)
      0  magic "ORTBENC\\0" | 8 version=1 | 9 algorithm=1 (AES-256-GCM) | 10 chunk_log2 | 11 flags
     12  plaintext size (u64 big-endian) | 20 nonce prefix (7 bytes)          <- payload header, bytes 0-26
     27  key id (16) | 43 wrap nonce (12) | 55 wrapped data key (32 + 16 tag) <- key slot, bytes 27-102
    chunks: AES-256-GCM(data key, nonce = prefix || u32 counter || last flag, aad = payload header)

The payload header is the associated data of every chunk; the key slot is authenticated by the key wrap
(its associated data is bytes 0-54), so `rekey` rewrites the slot alone and never touches the chunks.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ortbuild.artifact import pieces
from ortbuild.artifact.pieces import Pieces
from ortbuild.errors import ArtifactError

MAGIC = b"ORTBENC\x00"
VERSION = 1
ALG_AES_256_GCM = 1
FLAG_DETERMINISTIC = 1
PAYLOAD_HEADER = 27           # bytes 0..26: the associated data of every chunk
KEY_ID_AT, KEY_ID_LEN = 27, 16
HEADER = 103
TAG = 16
DEFAULT_CHUNK_LOG2 = 20       # 1 MiB chunks
MIN_CHUNK_LOG2, MAX_CHUNK_LOG2 = 12, 24


class ContainerError(ArtifactError):
    """A container that cannot be decrypted: `code` says why (the generated loaders use the same codes)."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.code = code


def key_id(kek: bytes) -> bytes:
    """16 bytes naming a key-encryption key without revealing it."""
    return hmac.new(kek, b"ortbuild key id v1", hashlib.sha256).digest()[:KEY_ID_LEN]


def _derive(kek: bytes, label: bytes, digest: bytes, n: int) -> bytes:
    return hmac.new(kek, b"ortbuild deterministic v1 " + label + b"\x00" + digest, hashlib.sha256).digest()[:n]


@dataclass(frozen=True)
class Header:
    chunk_log2: int
    flags: int
    size: int
    nonce_prefix: bytes
    key_id: bytes
    wrap_nonce: bytes
    wrapped_dek: bytes

    @property
    def payload_header(self) -> bytes:
        return MAGIC + struct.pack(">BBBBQ", VERSION, ALG_AES_256_GCM, self.chunk_log2, self.flags,
                                   self.size) + self.nonce_prefix

    def pack(self) -> bytes:
        return self.payload_header + self.key_id + self.wrap_nonce + self.wrapped_dek

    @property
    def chunks(self) -> int:
        return max(1, -(-self.size // (1 << self.chunk_log2)))

    @property
    def container_size(self) -> int:
        return HEADER + self.size + TAG * self.chunks


def parse_header(data: bytes | bytearray | memoryview) -> Header:
    if len(data) < HEADER:
        raise ContainerError("corrupt", f"container is {len(data)} bytes, shorter than its {HEADER}-byte header",
                             "the file is truncated or not an ortbuild container")
    if bytes(data[:8]) != MAGIC:
        raise ContainerError("unsupported_format", "not an ortbuild container (bad magic bytes)")
    version, alg, chunk_log2, flags, size = struct.unpack(">BBBBQ", data[8:20])
    if version != VERSION or alg != ALG_AES_256_GCM:
        raise ContainerError("unsupported_format", f"container version {version} algorithm {alg} is not "
                                                   f"supported (this ortbuild reads version {VERSION})",
                             "rebuild the artifact, or use the ortbuild that made it")
    if not MIN_CHUNK_LOG2 <= chunk_log2 <= MAX_CHUNK_LOG2 or flags & ~FLAG_DETERMINISTIC:
        raise ContainerError("corrupt", "container header has an invalid chunk size or flags")
    return Header(chunk_log2, flags, size, bytes(data[20:27]), bytes(data[27:43]), bytes(data[43:55]),
                  bytes(data[55:103]))


def encrypt(plaintext: bytes | memoryview, kek: bytes, *, deterministic: bool = False,
            chunk_log2: int = DEFAULT_CHUNK_LOG2) -> bytes:
    """A v1 container for `plaintext` under the key-encryption key `kek` (32 bytes).

    deterministic: the data key and nonces derive from the KEK and the plaintext's digest, so equal inputs
    give equal containers (reproducible builds); one data key still never encrypts two plaintexts.
    """
    assert len(kek) == 32 and MIN_CHUNK_LOG2 <= chunk_log2 <= MAX_CHUNK_LOG2
    header, dek = _header(kek, len(plaintext), hashlib.sha256(plaintext).digest() if deterministic else None,
                          chunk_log2)
    prefix = header.nonce_prefix
    aad = header.payload_header
    out = bytearray(header.container_size)
    out[:HEADER] = header.pack()
    aead, csize, view, pos = AESGCM(dek), 1 << chunk_log2, memoryview(plaintext), HEADER
    for i in range(header.chunks):
        piece = view[i * csize:(i + 1) * csize]
        nonce = prefix + struct.pack(">IB", i, i == header.chunks - 1)
        out[pos:pos + len(piece) + TAG] = aead.encrypt(nonce, piece, aad)
        pos += len(piece) + TAG
    return bytes(out)


def _header(kek: bytes, size: int, plain_digest: bytes | None, chunk_log2: int) -> tuple[Header, bytes]:
    """A sealed header for `size` plaintext bytes and its data key (derived when `plain_digest` is given)."""
    if plain_digest is not None:
        dek, prefix, wrap_nonce = (_derive(kek, b"dek", plain_digest, 32), _derive(kek, b"nonce", plain_digest, 7),
                                   _derive(kek, b"wrap", plain_digest, 12))
    else:
        dek, prefix, wrap_nonce = AESGCM.generate_key(256), os.urandom(7), os.urandom(12)
    partial = Header(chunk_log2, FLAG_DETERMINISTIC if plain_digest is not None else 0, size, prefix, key_id(kek),
                     wrap_nonce, b"")
    wrapped = AESGCM(kek).encrypt(wrap_nonce, dek, partial.pack())  # aad: bytes 0-54
    return Header(partial.chunk_log2, partial.flags, size, prefix, partial.key_id, wrap_nonce, wrapped), dek


def encrypt_file(src: Path, out: BinaryIO, kek: bytes, *, deterministic: bool = False,
                 chunk_log2: int = DEFAULT_CHUNK_LOG2) -> tuple[str, int, Pieces]:
    """Stream the container for the file `src` into `out`, one chunk in memory at a time (the same bytes as
    `encrypt(src.read_bytes(), ...)`). Returns the container's sha256 (hex), size and piece digests, hashed as
    written.

    deterministic reads `src` twice: its digest derives the data key and nonces."""
    assert len(kek) == 32 and MIN_CHUNK_LOG2 <= chunk_log2 <= MAX_CHUNK_LOG2
    size, csize = src.stat().st_size, 1 << chunk_log2
    digest = None
    if deterministic:
        h = hashlib.sha256()
        with open(src, "rb") as f:
            while piece := f.read(csize):
                h.update(piece)
        digest = h.digest()
    header, dek = _header(kek, size, digest, chunk_log2)
    aead, aad = AESGCM(dek), header.payload_header
    out_hash = pieces.Hasher(*pieces.container_layout(csize, HEADER))
    packed = header.pack()
    out.write(packed)
    out_hash.update(packed)
    buf = bytearray(csize)
    done = 0
    with open(src, "rb", buffering=0) as f:
        for i in range(header.chunks):
            n = min(csize, size - i * csize)
            view = memoryview(buf)[:n]
            got = f.readinto(view)
            if got != n:
                raise ContainerError("corrupt", f"{src} changed size while it was being encrypted")
            nonce = header.nonce_prefix + struct.pack(">IB", i, i == header.chunks - 1)
            sealed = aead.encrypt(nonce, view, aad)
            out.write(sealed)
            out_hash.update(sealed)
            done += len(sealed)
    whole, digests = out_hash.result()
    return whole, HEADER + done, digests


def unwrap(header: Header, kek: bytes) -> bytes:
    if not hmac.compare_digest(key_id(kek), header.key_id):
        raise ContainerError("wrong_key", f"the artifact is encrypted under key id {header.key_id.hex()}, the key "
                                          f"given has id {key_id(kek).hex()}",
                             "give the key it was built with (ORTBUILD_KEY / ORTBUILD_KEY_FILE)")
    try:
        dek: bytes = AESGCM(kek).decrypt(header.wrap_nonce, header.wrapped_dek, header.pack()[:55])
        return dek
    except InvalidTag:
        raise ContainerError("corrupt", "the container's key slot does not authenticate (tampered)") from None


def decrypt(data: bytes | bytearray | memoryview, kek: bytes) -> bytearray:
    """The plaintext of a v1 container; every chunk is authenticated before it is returned."""
    header = parse_header(data)
    if len(data) != header.container_size:
        raise ContainerError("corrupt", f"container is {len(data)} bytes, its header implies "
                                        f"{header.container_size} (truncated or extended)")
    aead = AESGCM(unwrap(header, kek))
    aad, csize, view = header.payload_header, 1 << header.chunk_log2, memoryview(data)
    out = bytearray(header.size)
    pos = HEADER
    for i in range(header.chunks):
        n = min(csize, header.size - i * csize)
        nonce = header.nonce_prefix + struct.pack(">IB", i, i == header.chunks - 1)
        try:
            aead.decrypt_into(nonce, view[pos:pos + n + TAG], aad, memoryview(out)[i * csize:i * csize + n])
        except InvalidTag:
            raise ContainerError("corrupt", f"chunk {i} of {header.chunks} does not authenticate (tampered, "
                                            "reordered or truncated)") from None
        pos += n + TAG
    return out


def rewrap_header(head: bytes, old_kek: bytes, new_kek: bytes) -> bytes:
    """A container's header with its data key re-wrapped under `new_kek` (WrongKey: `old_kek` is not its key)."""
    header = parse_header(head)
    dek = unwrap(header, old_kek)
    wrap_nonce = os.urandom(12)
    partial = Header(header.chunk_log2, header.flags, header.size, header.nonce_prefix, key_id(new_kek),
                     wrap_nonce, b"")
    wrapped: bytes = AESGCM(new_kek).encrypt(wrap_nonce, dek, partial.pack())
    return partial.pack() + wrapped


def rewrap_file(src: Path, dst: BinaryIO, old_kek: bytes, new_kek: bytes) -> tuple[str, int, Pieces]:
    """Stream `src` into `dst` with its header re-wrapped (one chunk in memory): (sha256, size, piece digests) of
    what was written (a format-2 artifact's files get their piece digests here)."""
    size = 0
    with open(src, "rb") as f:
        head = rewrap_header(f.read(HEADER), old_kek, new_kek)
        h = pieces.Hasher(*pieces.container_layout(1 << parse_header(head).chunk_log2, HEADER))
        for piece in itertools.chain([head], iter(lambda: f.read(1 << 20), b"")):
            h.update(piece)
            dst.write(piece)
            size += len(piece)
    whole, digests = h.result()
    return whole, size, digests
