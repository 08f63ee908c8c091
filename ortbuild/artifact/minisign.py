"""Detached signatures in minisign's format, made with the project's Ed25519 signing key.

Why minisign: it is Ed25519 (the key ortbuild already signs manifests with), two short text files, and a
standard verifier anyone can install (`apt install minisign`; `minisign -Vm SHA256SUMS -p signing.pub`),
with no infrastructure: sigstore's keyless signing needs an OIDC identity plus Fulcio and Rekor at release
time, GPG a keyring. The format (minisign's docs):

    public key  "untrusted comment: ..." + base64("Ed" || key id (8) || public key (32))
    signature   "untrusted comment: ..." + base64("ED" || key id (8) || Ed25519(BLAKE2b-512(file)))
                "trusted comment: ..."   + base64(Ed25519(signature (64) || trusted comment))

"ED" is the prehashed mode (minisign's default since 0.10). The trusted comment is signed too; ortbuild
puts the file name and SOURCE_DATE_EPOCH (or 0) there, so equal inputs give equal signature files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from ortbuild.artifact import ed25519
from ortbuild.errors import ArtifactError, KeyMissing

PREHASHED, LEGACY, KEY_ALG = b"ED", b"Ed", b"Ed"


@dataclass(frozen=True)
class Signature:
    untrusted_comment: str
    algorithm: bytes
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes


def key_id(public_raw: bytes) -> bytes:
    """8 bytes naming a public key: the first bytes of its SHA-256 (ortbuild's public key id, in hex)."""
    return hashlib.sha256(public_raw).digest()[:8]


def public_key_text(public_raw: bytes, comment: str) -> str:
    blob = KEY_ALG + key_id(public_raw) + public_raw
    return f"untrusted comment: {comment}\n{base64.b64encode(blob).decode()}\n"


def parse_public_key(text: str, source: str) -> bytes | None:
    """The raw Ed25519 key of a minisign public key file (None when `text` is not one)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("untrusted comment:"):
        return None
    try:
        blob = base64.b64decode(lines[1], validate=True) if len(lines) == 2 else b""
    except binascii.Error:
        blob = b""
    if len(blob) != 42 or blob[:2] != KEY_ALG:
        raise KeyMissing(f"{source}: not a minisign public key (two lines: a comment and base64 of 42 bytes)",
                         "give the signing.pub that `ortbuild keygen` wrote")
    return blob[10:]


def sign(message: bytes, signer: Callable[[bytes], bytes], public_raw: bytes, *, trusted_comment: str,
         untrusted_comment: str = "signature from ortbuild (minisign format)") -> str:
    """The text of a .minisig file for `message`; `signer` is the Ed25519 key's sign (64-byte signatures)."""
    assert "\n" not in trusted_comment
    sig = signer(hashlib.blake2b(message, digest_size=64).digest())
    global_sig = signer(sig + trusted_comment.encode())
    blob = PREHASHED + key_id(public_raw) + sig
    return (f"untrusted comment: {untrusted_comment}\n{base64.b64encode(blob).decode()}\n"
            f"trusted comment: {trusted_comment}\n{base64.b64encode(global_sig).decode()}\n")


def parse(text: str, source: str) -> Signature:
    lines = text.split("\n")  # strictly: four lines, each ended by \n (no other line breaks)
    try:
        if len(lines) != 5 or lines[4] != "" or not lines[0].startswith("untrusted comment:") or \
                not lines[2].startswith("trusted comment: "):
            raise ValueError
        blob = base64.b64decode(lines[1], validate=True)
        global_sig = base64.b64decode(lines[3], validate=True)
        if base64.b64encode(blob).decode() != lines[1] or base64.b64encode(global_sig).decode() != lines[3]:
            raise ValueError  # canonical base64 only: unused trailing bits must not carry edits
        if len(blob) != 74 or blob[:2] not in (PREHASHED, LEGACY) or len(global_sig) != 64:
            raise ValueError
    except (ValueError, binascii.Error):
        raise ArtifactError(f"{source}: not a minisign signature (4 lines: comment, signature, trusted comment, "
                            "global signature)", "the file is damaged: fetch the release again") from None
    return Signature(lines[0].removeprefix("untrusted comment: "), blob[:2], blob[2:10], blob[10:],
                     lines[2].removeprefix("trusted comment: "), global_sig)


def verify(message: bytes, text: str, public_raw: bytes, source: str, signed: str,
           untrusted_comment: str | None = None) -> str:
    """Check a .minisig against `message` and the public key; return the trusted comment. Raises ArtifactError
    naming `source` (the signature file) and `signed` (the file it signs) when anything does not hold.
    `untrusted_comment`: the first line must be exactly this (it is not signed: any edit is still noticed)."""
    sig = parse(text, source)
    if sig.key_id != key_id(public_raw):
        raise ArtifactError(f"{source}: signed by key id {sig.key_id.hex()}, the public key given has id "
                            f"{key_id(public_raw).hex()}", "verify with the publisher's signing.pub (--public-key)")
    if untrusted_comment is not None and sig.untrusted_comment != untrusted_comment:
        raise ArtifactError(f"{source}: its untrusted comment was modified (expected {untrusted_comment!r})",
                            "fetch the release again")
    digest = hashlib.blake2b(message, digest_size=64).digest() if sig.algorithm == PREHASHED else message
    if not ed25519.verify(public_raw, sig.signature, digest):
        raise ArtifactError(f"{signed}: does not match its signature {source} (one of the two was modified)",
                            "fetch the release again; never use a bundle that fails verify")
    if not ed25519.verify(public_raw, sig.global_signature, sig.signature + sig.trusted_comment.encode()):
        raise ArtifactError(f"{source}: the trusted comment was modified", "fetch the release again")
    return sig.trusted_comment
