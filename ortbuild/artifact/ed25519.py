"""Ed25519 signatures: checking one, naming a public key, and the detached signature ortbuild writes beside a
file it signs (manifest.sig, the test report's .sig: base64 of the 64-byte signature over the file's exact
bytes). The bottom of the signing modules: keys, manifest, minisign and release use it, it uses none of them."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is the Ed25519 signature of `message` by the raw 32-byte key `public_raw`."""
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
        return True
    except (InvalidSignature, ValueError):
        return False


def public_key_id(public_raw: bytes) -> str:
    """The id that names a public key in manifests, key files and messages (never the key itself)."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def verify_detached(data: bytes, signature_file: Path, public_raw: bytes) -> bool:
    """Whether `signature_file` (one base64 line) holds the signature of `data` by `public_raw`. Raises OSError
    when the signature file cannot be read, ValueError when it is not base64."""
    from ortbuild.files import read_document

    signature = base64.b64decode(read_document(signature_file, 1 << 12).strip(), validate=True)
    return verify(public_raw, signature, data)
