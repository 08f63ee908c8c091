"""Keys: the encryption key (a 32-byte AES-256 key-encryption key) and the Ed25519 signing key.

Sources, first found wins (the same for both keys):
    encryption  explicit argument (API) or --key-file  ->  ORTBUILD_KEY (base64)  ->  ORTBUILD_KEY_FILE
    signing     explicit argument or --signing-key-file ->  ORTBUILD_SIGNING_KEY   ->  ORTBUILD_SIGNING_KEY_FILE
A key file holds comment lines (#) and one base64 line. `ortbuild keygen` writes encryption.key, signing.key
(both 0600, in a 0700 directory), signing.pub and model-signing.pub (the P-256 key derived from the signing seed
that signs model.sig: ortbuild.artifact.p256); with --dev their second line says DEVELOPMENT KEY, and every
manifest built with them says so. No key ever appears in an artifact, a manifest, a log, an error or --json output.

Like ssh, a key file readable or writable by group or others is refused (with the chmod that fixes it), and
keygen's files are typed: their first line names their kind ("# ortbuild encryption key ...", "# ortbuild
Ed25519 signing key ..."), so one kind is never taken for the other. Files without such a line are accepted as
either kind. The public key (signing.pub) is no secret: it is never checked for its mode. Only a regular file
or an anonymous pipe (`--key-file <(pass show key)`) is read as a key file: a named FIFO, a device or a socket is
refused (a FIFO could be fed by whoever planted it, or block the read forever).

Keys from the environment stay raw base64 (the variable's name says the kind), so one key given as both kinds
is caught by comparing them: an encryption key equal to the signing seed, or whose Ed25519 public half is the
signing key's, is refused wherever the two meet (check_kinds; the loaders compare with their pinned public key).

The ortbuild command disables core dumps (workspace.no_core_dumps) before it reads any key: a crashed build would
otherwise leave both keys and plaintext weights in a core file.
"""

from __future__ import annotations

import base64
import binascii
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey, EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ortbuild.artifact import container, minisign, p256
from ortbuild.artifact.ed25519 import public_key_id
from ortbuild.artifact.manifest_types import Signing
from ortbuild.errors import KeyMissing
from ortbuild.paths import file_kind

DEV_MARKER = "DEVELOPMENT KEY"
ENCRYPTION_FILE, SIGNING_FILE, PUBLIC_FILE = "encryption.key", "signing.key", "signing.pub"
# the first line of each key file keygen writes: a key file that declares one kind is refused as the other
HEADERS = {"encryption key": "# ortbuild encryption key", "signing key": "# ortbuild Ed25519 signing key"}
FILES = {"encryption key": ENCRYPTION_FILE, "signing key": SIGNING_FILE}
OPTIONS = {"encryption key": "--key-file or ORTBUILD_KEY_FILE", "signing key": "--signing-key-file or "
                                                                                "ORTBUILD_SIGNING_KEY_FILE"}
MAKE_KEYS = ("ortbuild keygen --out keys && export ORTBUILD_KEY_FILE=$PWD/keys/encryption.key "
             "ORTBUILD_SIGNING_KEY_FILE=$PWD/keys/signing.key")
DEV_KEYS = Path(".ortbuild") / "dev-keys"   # where ortbuild's nox sessions make development keys, in the project


def make_keys_hint(project_root: Path) -> str:
    """The hint of a missing key: the command that makes keys; where nox made development keys in the project, also
    how to use those outside nox (to try things out: never for a release)."""
    dev = project_root / DEV_KEYS
    if not (dev / ENCRYPTION_FILE).is_file():
        return f"make keys: `{MAKE_KEYS}`"
    return (f"make keys: `{MAKE_KEYS}`; or, to try things out, the development keys nox made: `export "
            f"ORTBUILD_KEY_FILE={dev / ENCRYPTION_FILE} ORTBUILD_SIGNING_KEY_FILE={dev / SIGNING_FILE}` (never "
            "for a release)")


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
    path: str | None = None          # the key file it was read from (None: an argument or $ORTBUILD_SIGNING_KEY)

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

    @property
    def model_signing_key(self) -> EllipticCurvePrivateKey:
        """The ECDSA P-256 key that signs model.sig, derived from the seed (never shown, like the seed)."""
        return p256.derive(self.seed)

    @property
    def seed(self) -> bytes:
        raw: bytes = self.private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                serialization.NoEncryption())
        return raw

    def sign(self, message: bytes) -> bytes:
        sig: bytes = self.private.sign(message)
        return sig

    def __repr__(self) -> str:
        return f"SigningKey(id={self.key_id}, source={self.source})"

    def __reduce__(self) -> tuple[object, tuple[bytes, str, bool, str | None]]:
        """Pickled as its 32-byte seed (the key object itself does not pickle): a parallel build's worker
        processes get the command's Secrets whole, and never read the environment for keys."""
        return _signing_key_from_seed, (self.seed, self.source, self.development, self.path)


def _signing_key_from_seed(seed: bytes, source: str, development: bool, path: str | None) -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(seed), source, development, path)


def _a(what: str) -> str:
    return f"an {what}" if what[0] in "aeiou" else f"a {what}"


def declared_kind(lines: list[str]) -> str | None:
    """The kind a key file's text says it is: "encryption key" or "signing key" (keygen's first line), "public
    key" (minisign's public key format: signing.pub), or None (an untyped file)."""
    for ln in lines:
        if ln.startswith("untrusted comment:"):
            return "public key"
        if ln.startswith("#"):
            for kind, header in HEADERS.items():
                if ln.startswith(header):
                    return kind
    return None


def _wrong_kind(source: str, kind: str, what: str) -> KeyMissing:
    if what in FILES:
        use = f"use {FILES[what]}, the {what} `ortbuild keygen` wrote beside it ({OPTIONS[what]})"
    else:  # a public key was expected: a secret key is never taken for it
        use = f"give {PUBLIC_FILE}, the public key `ortbuild keygen` wrote beside the signing key"
    return KeyMissing(f"{source} is {_a(kind)}, not {_a(what)}", use)


def _decode(text: str, source: str, what: str) -> tuple[bytes, bool]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    kind = declared_kind(lines)
    if kind is not None and kind != what:
        raise _wrong_kind(source, kind, what)
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
    """A public key file's text: read as key files are (a FIFO, a device or a socket is refused, not read)."""
    data, _ = _read_key_bytes(path, what, hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyMissing(f"{path}: cannot read the {what}: not text", hint) from None


def private_problem(mode: int) -> bool:
    """Whether a key file's (or key directory's) mode lets group or others read, write or enter it."""
    return os.name == "posix" and bool(mode & 0o077)


def _anonymous_pipe(fd: int, path: str) -> bool:
    """Whether an open FIFO is an anonymous pipe the parent handed down (`--key-file <(pass show key)`, or
    /dev/stdin fed by a pipe), not a named FIFO in the file system, which anyone who may write its directory can
    plant (and feed, or leave without a writer: a read would wait forever). Linux says so in /proc; elsewhere
    only /dev/fd/N counts."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        return path.startswith("/dev/fd/")


def _read_file(path: str, what: str) -> tuple[bytes, bool]:
    """A secret key file, refused (like ssh) when group or others may read or write it, after a file of the
    other kind (which says so in its first line) is refused as such. Only a regular file or an anonymous pipe is
    read: a named FIFO, a device or a socket is refused before any read (it could block forever or be fed by
    someone else). The file is opened without blocking (a FIFO's open waits for a writer) and its type and mode
    are those of the file opened (fstat), so a swap between the check and the read changes nothing."""
    hint = f"make one with `{MAKE_KEYS}`"
    data, mode = _read_key_bytes(path, what, hint)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyMissing(f"{path}: cannot read the {what}: not text", hint) from None
    kind = declared_kind([ln.strip() for ln in text.splitlines() if ln.strip()])
    if kind is not None and kind != what:
        raise _wrong_kind(path, kind, what)
    if stat.S_ISREG(mode) and private_problem(mode):  # pipes (--key-file <(...)) have no such mode
        raise KeyMissing(f"{path}: the {what} file is accessible by group or others (mode "
                         f"{stat.S_IMODE(mode):04o}): a key file must be private, like an ssh key",
                         f"run `chmod 600 {shlex.quote(path)}`")
    return _decode(text, path, what)


def _read_key_bytes(path: str, what: str, hint: str) -> tuple[bytes, int]:
    """The first 64 KiB of a key file (secret or public) and its mode: a regular file or an anonymous pipe only
    (see _read_file); KeyMissing naming the file otherwise."""
    regular = "give the key file itself (a regular file, mode 0600), or a pipe: `--key-file <(command)`"
    try:
        before = os.stat(path).st_mode  # a device is not even opened (opening one can do things)
        if stat.S_ISCHR(before) or stat.S_ISBLK(before) or stat.S_ISSOCK(before):
            raise KeyMissing(f"{path}: cannot read the {what}: {file_kind(before)}, not a regular file", regular)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise KeyMissing(f"{path}: cannot read the {what}: {e.strerror if isinstance(e, OSError) else e}",
                         hint) from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise KeyMissing(f"{path}: cannot read the {what}: is a directory", f"give the {what} file in it")
    if not stat.S_ISREG(mode):
        if not (stat.S_ISFIFO(mode) and _anonymous_pipe(fd, path)):
            os.close(fd)
            raise KeyMissing(f"{path}: cannot read the {what}: {file_kind(mode)}, not a regular file", regular)
        os.set_blocking(fd, True)  # a pipe from the parent: wait for what it writes, as before
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(1 << 16)  # a key file is a few lines
        except OSError as e:
            raise KeyMissing(f"{path}: cannot read the {what}: {e.strerror}", hint) from None
    return data, mode


def _find(explicit: bytes | None, file: str | Path | None, env: str, env_file: str,
          what: str) -> tuple[bytes, str, bool, str | None] | None:
    """(key, where it came from, development, the file it was read from) of the first source that has one."""
    if explicit is not None:
        if len(explicit) != 32:
            raise KeyMissing(f"the key argument: {_a(what)} is 32 bytes, this one is {len(explicit)}",
                             f"make one with `{MAKE_KEYS}`")
        return bytes(explicit), "argument", False, None
    if file is not None:
        raw, dev = _read_file(str(file), what)
        return raw, str(file), dev, str(file)
    if os.environ.get(env):
        raw, dev = _decode(os.environ[env], f"${env}", what)
        return raw, env, dev, None
    if os.environ.get(env_file):
        raw, dev = _read_file(os.environ[env_file], what)
        return raw, os.environ[env_file], dev, os.environ[env_file]
    return None


def encryption_key(explicit: bytes | None = None, file: str | Path | None = None) -> EncryptionKey | None:
    found = _find(explicit, file, "ORTBUILD_KEY", "ORTBUILD_KEY_FILE", "encryption key")
    return None if found is None else EncryptionKey(found[0], found[1], found[2])


def signing_key(explicit: bytes | None = None, file: str | Path | None = None) -> SigningKey | None:
    found = _find(explicit, file, "ORTBUILD_SIGNING_KEY", "ORTBUILD_SIGNING_KEY_FILE", "signing key")
    if found is None:
        return None
    return SigningKey(Ed25519PrivateKey.from_private_bytes(found[0]), found[1], found[2], found[3])


def _shown(source: str) -> str:
    """Where a key came from, for a message: a variable's name with its $, else the file (or "the argument")."""
    return f"${source}" if source.startswith("ORTBUILD_") else "the key argument" if source == "argument" else source


def ed25519_public(secret: bytes) -> bytes:
    """The Ed25519 public key of 32 bytes taken as a signing seed (what an encryption key would sign as)."""
    raw: bytes = Ed25519PrivateKey.from_private_bytes(secret).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def check_kinds(encryption: EncryptionKey | None, signing: SigningKey | None) -> None:
    """Refuse keys that are one key given twice, whatever their sources (files or the environment, where the
    variable's name is all that says a key's kind): an encryption key equal to the signing seed, or whose Ed25519
    public half (the 32 bytes taken as a seed) is the signing key's, would let anyone who holds an app's
    decryption key sign manifests; one equal to the signing key's public half is published with every manifest."""
    if encryption is None or signing is None:
        return
    enc, sign = _shown(encryption.source), _shown(signing.source)
    use = f"use two keys, as `ortbuild keygen` makes them: `{MAKE_KEYS}`"
    if encryption.secret == signing.seed or ed25519_public(encryption.secret) == signing.public_raw:
        raise KeyMissing(f"the encryption key ({enc}) is the signing key ({sign}): with one key for both, anyone "
                         "who holds an app's decryption key could sign manifests", use)
    if encryption.secret == signing.public_raw:
        raise KeyMissing(f"the encryption key ({enc}) is the signing key's public half ({sign}), which every "
                         "manifest and signing.pub publish: anyone could decrypt", use)


@dataclass(frozen=True, repr=False)
class Secrets:
    """The keys one command works with, read once (`read_secrets`) and passed down whole: nothing below the
    command line reads the environment for keys."""

    encryption: EncryptionKey | None = None
    signing: SigningKey | None = None

    def __post_init__(self) -> None:
        check_kinds(self.encryption, self.signing)

    @property
    def secret(self) -> bytes | None:
        """The raw encryption key, for decrypting through a generated loader."""
        return self.encryption.secret if self.encryption is not None else None

    def __repr__(self) -> str:
        return f"Secrets(encryption={self.encryption!r}, signing={self.signing!r})"


def read_secrets(key_file: str | Path | None = None, signing_key_file: str | Path | None = None) -> Secrets:
    """Both keys from their sources (the module docstring's order). Missing keys are None: the command decides
    whether it needs them."""
    return Secrets(encryption_key(file=key_file), signing_key(file=signing_key_file))


PUBLIC_HINT = "give the signing.pub that `ortbuild keygen` wrote beside the signing key (minisign's public key format)"


def _public(text: str, path: str) -> bytes:
    if p256.is_pem(text.encode()):
        raise KeyMissing(f"{path}: a PEM public key (model-signing.pub checks a release's model.sig only: "
                         "`ortbuild verify` and `ortbuild pull` take it), not the Ed25519 signing.pub", PUBLIC_HINT)
    raw = minisign.parse_public_key(text, path)
    if raw is not None:
        return raw
    try:
        return _decode(text, path, "public key")[0]
    except KeyMissing as e:
        raise KeyMissing(e.message, PUBLIC_HINT) from None


def read_public_key(path: str | Path) -> bytes:
    """A public key file: minisign's format (what keygen writes) or a comment and one base64 line of 32 bytes."""
    return _public(_read_text(str(path), "public key", PUBLIC_HINT), str(path))


def public_key(path: str | Path | None = None) -> bytes | None:
    """The public key that checks release signatures: --public-key, else ORTBUILD_PUBLIC_KEY_FILE, else the
    public half of the configured signing key (the publisher's own)."""
    if path is None:
        path = os.environ.get("ORTBUILD_PUBLIC_KEY_FILE") or None
    if path is not None:
        return read_public_key(path)
    sk = signing_key()
    return sk.public_raw if sk else None


def release_public_key(path: str | Path | None = None) -> bytes | EllipticCurvePublicKey | None:
    """The key `verify` and `pull` check a release with, from where public_key() looks: signing.pub (Ed25519, the
    raw key), or a PEM EC public key such as model-signing.pub (the release's model.sig is then the trust root)."""
    path = path if path is not None else os.environ.get("ORTBUILD_PUBLIC_KEY_FILE") or None
    if path is None:
        return public_key()
    text = _read_text(str(path), "public key", PUBLIC_HINT)  # read once: it may be a pipe
    if not p256.is_pem(text.encode()):
        return _public(text, str(path))
    try:
        return p256.parse_public_pem(text.encode())
    except ValueError as e:
        raise KeyMissing(f"{path}: {e}: model.sig is checked with an EC public key (model_signing 1.1.1 takes "
                         "P-256, P-384 or P-521 only)", "give model-signing.pub, which `ortbuild keygen` writes "
                         "(`ortbuild keygen --model-signing-pub --out DIR` makes it for an existing signing key), "
                         "or signing.pub") from None
