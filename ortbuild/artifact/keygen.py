"""`ortbuild keygen`: a new encryption key, Ed25519 signing key and its two public keys (signing.pub in minisign's
format; model-signing.pub, the PEM public half of the P-256 key derived from the signing seed, which signs a
release's OpenSSF model.sig: ortbuild.artifact.p256), in a private directory, never over an existing file and
never through a symlink; and `keygen --model-signing-pub`, model-signing.pub alone for an existing signing key.
Reading keys: ortbuild.artifact.keys."""

from __future__ import annotations

import base64
import os
import shlex
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild.artifact import container, keys, minisign, p256
from ortbuild.artifact.ed25519 import public_key_id
from ortbuild.artifact.keys import ENCRYPTION_FILE, PUBLIC_FILE, SIGNING_FILE, SigningKey
from ortbuild.errors import KeyMissing


def _key_dir(out: Path) -> None:
    """Make `out` private (0700) when keygen creates it; refuse an existing one that group or others may enter,
    and anything that is not a directory (a dangling symlink included)."""
    if out.is_symlink() and not out.exists():
        raise KeyMissing(f"{out}: a dangling symlink (to {os.readlink(out)}): keygen never writes through a symlink",
                         "remove it, or choose another --out directory")
    if not out.exists():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.mkdir(mode=0o700)
            os.chmod(out, 0o700)  # whatever the umask
        except (OSError, ValueError) as e:
            raise KeyMissing(f"{out}: cannot make the key directory: {e.strerror if isinstance(e, OSError) else e}",
                             "choose another --out directory") from None
        return
    if not out.is_dir():
        raise KeyMissing(f"{out}: not a directory", "choose another --out directory")
    mode = out.stat().st_mode
    if keys.private_problem(mode):
        raise KeyMissing(f"{out}: the key directory is accessible by group or others (mode {stat.S_IMODE(mode):04o})",
                         f"run `chmod 700 {shlex.quote(str(out))}`, or give keygen a new --out directory (it makes "
                         "it 0700)")


def _write_new(files: dict[Path, tuple[str, int]]) -> None:
    """Write each file (text, mode): all or none, never over an existing file, never through a symlink."""
    for p in files:
        if p.is_symlink():
            raise KeyMissing(f"{p} is a symlink (to {os.readlink(p)}): keygen never writes through a symlink",
                             "remove it, or choose another --out directory")
    taken = [str(p) for p in files if p.exists()]
    if taken:
        raise KeyMissing(f"{taken[0]} exists: keygen never overwrites a key", "choose another --out directory")
    made: list[Path] = []
    try:
        for path, (text, mode) in files.items():
            # O_EXCL and O_NOFOLLOW: a file or symlink that appeared since the checks above is refused, not followed
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            try:
                fd = os.open(path, flags, mode)
            except OSError as e:
                raise KeyMissing(f"{path}: cannot write the key: {e.strerror}",
                                 "keygen never overwrites a key or writes through a symlink: choose another --out "
                                 "directory") from None
            made.append(path)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    except BaseException:
        for p in made:  # no half set of keys
            p.unlink(missing_ok=True)
        raise


def keygen(out: Path, *, development: bool = False) -> dict[str, str]:
    """Write a new encryption key, signing key and its public keys (signing.pub, model-signing.pub) into `out`
    (made 0700); never overwrite a key and never write through a symlink."""
    _key_dir(out)
    mark = (f"# {keys.DEV_MARKER}: made for local builds, never use it for a release\n" if development else "")
    enc = os.urandom(32)
    sign = SigningKey(Ed25519PrivateKey.generate(), "keygen")
    pub = sign.public_raw
    _write_new({
        out / ENCRYPTION_FILE: (f"# ortbuild encryption key (AES-256 KEK), id {container.key_id(enc).hex()}\n{mark}"
                                f"{base64.b64encode(enc).decode()}\n", 0o600),
        out / SIGNING_FILE: (f"# ortbuild Ed25519 signing key, public key id {public_key_id(pub)}\n{mark}"
                             f"{base64.b64encode(sign.seed).decode()}\n", 0o600),
        # minisign's public key format, so `minisign -V -p signing.pub` checks release signatures too
        out / PUBLIC_FILE: (minisign.public_key_text(pub, f"ortbuild Ed25519 public key, id {public_key_id(pub)}"),
                            0o644),
        out / p256.PUBLIC_FILE: (model_signing_public(sign), 0o644)})
    return {"encryption_key": str(out / ENCRYPTION_FILE), "encryption_key_id": container.key_id(enc).hex(),
            "signing_key": str(out / SIGNING_FILE), "public_key": str(out / PUBLIC_FILE),
            "public_key_id": public_key_id(pub), "model_signing_public_key": str(out / p256.PUBLIC_FILE),
            "development": str(development).lower()}


def model_signing_public(sign_key: SigningKey) -> str:
    """model-signing.pub's text: the PEM public key that `model_signing verify key` (and `ortbuild verify`) check
    a release's model.sig with."""
    return p256.public_pem(sign_key.model_signing_key.public_key()).decode()


def write_model_signing_public(out: Path, sign_key: SigningKey) -> str:
    """`keygen --model-signing-pub`: only out/model-signing.pub, for an existing signing key; never over a file."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as e:
        raise KeyMissing(f"{out}: cannot make the directory: {e.strerror if isinstance(e, OSError) else e}",
                         "choose another --out directory") from None
    _write_new({out / p256.PUBLIC_FILE: (model_signing_public(sign_key), 0o644)})
    return str(out / p256.PUBLIC_FILE)
