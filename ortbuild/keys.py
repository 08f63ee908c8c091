"""Keys: the encryption key (a 32-byte AES-256 key-encryption key) and the Ed25519 signing key.

Sources, first found wins (the same for both keys):
    encryption  explicit argument (API) or --key-file  ->  ORTBUILD_KEY (base64)  ->  ORTBUILD_KEY_FILE
    signing     explicit argument or --signing-key-file ->  ORTBUILD_SIGNING_KEY   ->  ORTBUILD_SIGNING_KEY_FILE
A key file holds comment lines (#) and one base64 line. `ortbuild keygen` writes encryption.key, signing.key
(both 0600) and signing.pub; with --dev their first line says DEVELOPMENT KEY, and every manifest built
with them says so. No key ever appears in an artifact, a manifest, a log, an error or --json output.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import container, minisign
from .errors import KeyMissing
from .manifest import Signing

DEV_MARKER = "DEVELOPMENT KEY"
ENCRYPTION_FILE, SIGNING_FILE, PUBLIC_FILE = "encryption.key", "signing.key", "signing.pub"
MAKE_KEYS = ("ortbuild keygen --out keys && export ORTBUILD_KEY_FILE=$PWD/keys/encryption.key "
             "ORTBUILD_SIGNING_KEY_FILE=$PWD/keys/signing.key")


@dataclass(frozen=True, repr=False)
class EncryptionKey:
    secret: bytes
    source: str                      # where it came from (an env var name or a file path), never the key
    development: bool = False

    @property
    def key_id(self) -> str:
        return container.key_id(self.secret).hex()

    def __repr__(self) -> str:
        return f"EncryptionKey(id={self.key_id}, source={self.source})"


@dataclass(frozen=True, repr=False)
class SigningKey:
    private: Ed25519PrivateKey
    source: str
    development: bool = False

    @property
    def public_raw(self) -> bytes:
        raw: bytes = self.private.public_key().public_bytes(serialization.Encoding.Raw,
                                                            serialization.PublicFormat.Raw)
        return raw

    @property
    def key_id(self) -> str:
        return public_key_id(self.public_raw)

    def info(self) -> Signing:
        """What a manifest records of this key (the public half only)."""
        return Signing(algorithm="Ed25519", public_key=base64.b64encode(self.public_raw).decode(),
                       public_key_id=self.key_id, development_key=self.development)

    def sign(self, message: bytes) -> bytes:
        sig: bytes = self.private.sign(message)
        return sig

    def __repr__(self) -> str:
        return f"SigningKey(id={self.key_id}, source={self.source})"


def public_key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _a(what: str) -> str:
    return f"an {what}" if what[0] in "aeiou" else f"a {what}"


def _decode(text: str, source: str, what: str) -> tuple[bytes, bool]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    development = any(ln.startswith("#") and DEV_MARKER in ln for ln in lines)
    body = [ln for ln in lines if not ln.startswith("#")]
    try:
        if len(body) != 1:
            raise ValueError
        raw = base64.b64decode(body[0], validate=True)
    except (ValueError, binascii.Error):
        raise KeyMissing(f"{source}: not {_a(what)} (one base64 line of 32 bytes expected)",
                         f"make one with `{MAKE_KEYS}`") from None
    if len(raw) != 32:
        raise KeyMissing(f"{source}: {_a(what)} is 32 bytes, this one is {len(raw)}", f"make one with `{MAKE_KEYS}`")
    return raw, development


def _read_text(path: str, what: str, hint: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KeyMissing(f"{path}: cannot read the {what}: {e.strerror if isinstance(e, OSError) else 'not text'}",
                         hint) from None


def _read_file(path: str, what: str) -> tuple[bytes, bool]:
    return _decode(_read_text(path, what, f"make one with `{MAKE_KEYS}`"), path, what)


def _find(explicit: bytes | None, file: str | Path | None, env: str, env_file: str,
          what: str) -> tuple[bytes, str, bool] | None:
    if explicit is not None:
        if len(explicit) != 32:
            raise KeyMissing(f"the key argument: {_a(what)} is 32 bytes, this one is {len(explicit)}",
                             f"make one with `{MAKE_KEYS}`")
        return bytes(explicit), "argument", False
    if file is not None:
        raw, dev = _read_file(str(file), what)
        return raw, str(file), dev
    if os.environ.get(env):
        raw, dev = _decode(os.environ[env], f"${env}", what)
        return raw, env, dev
    if os.environ.get(env_file):
        raw, dev = _read_file(os.environ[env_file], what)
        return raw, os.environ[env_file], dev
    return None


def encryption_key(explicit: bytes | None = None, file: str | Path | None = None) -> EncryptionKey | None:
    found = _find(explicit, file, "ORTBUILD_KEY", "ORTBUILD_KEY_FILE", "encryption key")
    return None if found is None else EncryptionKey(found[0], found[1], found[2])


def signing_key(explicit: bytes | None = None, file: str | Path | None = None) -> SigningKey | None:
    found = _find(explicit, file, "ORTBUILD_SIGNING_KEY", "ORTBUILD_SIGNING_KEY_FILE", "signing key")
    return None if found is None else SigningKey(Ed25519PrivateKey.from_private_bytes(found[0]), found[1], found[2])


def verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
        return True
    except (InvalidSignature, ValueError):
        return False


def keygen(out: Path, *, development: bool = False) -> dict[str, str]:
    """Write a new encryption key, signing key and public key into `out`; never overwrite a key."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in (ENCRYPTION_FILE, SIGNING_FILE, PUBLIC_FILE)}
    taken = [str(p) for p in paths.values() if p.exists()]
    if taken:
        raise KeyMissing(f"{taken[0]} exists: keygen never overwrites a key", "choose another --out directory")
    mark = (f"# {DEV_MARKER}: made for local builds, never use it for a release\n" if development else "")
    enc = os.urandom(32)
    sign = Ed25519PrivateKey.generate()
    seed = sign.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                              serialization.NoEncryption())
    pub = sign.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    texts = {
        ENCRYPTION_FILE: f"# ortbuild encryption key (AES-256 KEK), id {container.key_id(enc).hex()}\n{mark}"
                         f"{base64.b64encode(enc).decode()}\n",
        SIGNING_FILE: f"# ortbuild Ed25519 signing key, public key id {public_key_id(pub)}\n{mark}"
                      f"{base64.b64encode(seed).decode()}\n",
        # minisign's public key format, so `minisign -V -p signing.pub` checks release signatures too
        PUBLIC_FILE: minisign.public_key_text(pub, f"ortbuild Ed25519 public key, id {public_key_id(pub)}"),
    }
    for name, text in texts.items():
        fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644 if name == PUBLIC_FILE else 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return {"encryption_key": str(paths[ENCRYPTION_FILE]), "encryption_key_id": container.key_id(enc).hex(),
            "signing_key": str(paths[SIGNING_FILE]), "public_key": str(paths[PUBLIC_FILE]),
            "public_key_id": public_key_id(pub), "development": str(development).lower()}


def read_public_key(path: str | Path) -> bytes:
    """A public key file: minisign's format (what keygen writes) or a comment and one base64 line of 32 bytes."""
    hint = "give the signing.pub that `ortbuild keygen` wrote beside the signing key (minisign's public key format)"
    text = _read_text(str(path), "public key", hint)
    raw = minisign.parse_public_key(text, str(path))
    if raw is not None:
        return raw
    try:
        return _decode(text, str(path), "public key")[0]
    except KeyMissing as e:
        raise KeyMissing(e.message, hint) from None


def public_key(path: str | Path | None = None) -> bytes | None:
    """The public key that checks release signatures: --public-key, else ORTBUILD_PUBLIC_KEY_FILE, else the
    public half of the configured signing key (the publisher's own)."""
    if path is None:
        path = os.environ.get("ORTBUILD_PUBLIC_KEY_FILE") or None
    if path is not None:
        return read_public_key(path)
    sk = signing_key()
    return sk.public_raw if sk else None
