"""The shared build cache: sealed artifacts by build key, in a directory or an OCI registry (docs/cache.md).

Where: `--cache oci://host[:port]/repository` or `--cache DIR`, else $ORTBUILD_CACHE, else [project] cache (a
directory there is relative to targets.toml); `--no-cache` turns it off. One entry per job: its name is the
sha256 of the build key (everything the artifact depends on, the signing key id included), the target and the
model (two jobs with the same inputs under other names are two entries); in a directory `DIR/<entry>/`, in a
registry the tag `<entry>` of the repository, one layer per file.

An entry is what a build publishes in dist/<target>/<model>/ and nothing else: the signed manifest, its
signature and the files it signs (the encrypted model, the loaders). A target that does not encrypt
(`encrypt = false`) is never cached: its artifact is a plaintext model, and no plaintext leaves the machine.

Nothing the cache holds is trusted: a hit is downloaded into a private partial directory of dist/, and used only
if its manifest verifies with the configured signing key, names this target, model and build key, every file
matches it and the configured encryption key opens it (buildkey.published, as for dist/ itself). Anything else
(another key's signature, a changed byte, another build key under this one's name) is refused (Tampered) with a
warning naming the entry, the job is built, and the build's artifact replaces the entry. The cache is an
accelerator: one that cannot be reached, answers an error or stalls (CacheProblem) is a warning, it is asked nothing
more in that build, and the build goes on. Registry requests are made once each (no retries), each within a
deadline for the whole request (ortbuild.oci: a stalled registry is given up on, never waited for), and sizes
are checked before anything is copied or downloaded: a manifest read streaming up to oci.MAX_MANIFEST, every
layer's (every file's) size and the entry's total, a directory entry's files by their stat (plain, not sparse,
the size the entry's manifest gives), each copied no further than the size checked.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortbuild import __version__, oci, oci_ref, paths
from ortbuild.artifact import manifest, manifest_types
from ortbuild.errors import ConfigError, OrtbuildError, RegistryError, Tampered
from ortbuild.files import atomic_write, publish, read_document, safe_mkdir, sha256_file
from ortbuild.pipeline.cache_checks import REFUSED, match_manifest, names_problem

if TYPE_CHECKING:
    import oras.client

    from ortbuild.oci_ref import Ref

ENTRY_TYPE = "application/vnd.ortbuild.cache.entry.v1+json"     # the OCI config: entry.json
FILE_TYPE = "application/vnd.ortbuild.cache.file.v1"             # every file's layer
ENTRY = "entry.json"                                             # what the entry holds, beside its files
MAX_FILE = 64 << 30             # one file of an entry
MAX_ENTRY = 2 * MAX_FILE         # an entry's files together
MAX_SMALL = 1 << 20
# an entry's manifest and signature, read whole and parsed before the signature is checked: a manifest of
# thousands of files is far below this, and parsing it cannot take more than ~30x it (json of empty objects)
MAX_MANIFEST = 4 << 20
SPARSE_SLACK = 1 << 20           # a file of a directory entry may have this many bytes fewer allocated than its size


class CacheProblem(OrtbuildError):
    """The cache could not be read or written (a warning: the job builds, the cache is asked nothing more)."""


@dataclass(frozen=True)
class Cache:
    """A configured cache: `spec` as given, `where` resolved (an absolute directory or an oci:// reference)."""

    spec: str
    source: str                  # --cache, $ORTBUILD_CACHE or project.cache
    where: str

    @property
    def is_oci(self) -> bool:
        return self.where.startswith("oci://")

    def shown(self, entry: str) -> str:
        """The entry's name, for messages."""
        return f"{self.where}:{entry}" if self.is_oci else str(Path(self.where) / entry)

    def fetch(self, entry: str, dest: Path) -> dict[str, Path] | None:
        """Download the entry into `dest` (an empty directory); its files by name, or None (no entry)."""
        return _oci_fetch(self, entry, dest) if self.is_oci else _dir_fetch(Path(self.where), entry, dest)

    def store(self, entry: str, folder: Path, names: list[str], info: dict[str, str],
              digests: Mapping[str, str]) -> None:
        """Put the files `names` of `folder` (an artifact directory) as the entry (replacing one); `digests`: the
        sha256 of those the caller knows (the manifest's: a registry is told them, nothing is hashed again)."""
        doc = json.dumps({"format": "ortbuild-cache-v1", "entry": entry, **info, "files": names,
                          "ortbuild": __version__}, indent=2, sort_keys=True).encode() + b"\n"
        if self.is_oci:
            _oci_store(self, entry, folder, names, doc, digests)
        else:
            _dir_store(Path(self.where), entry, folder, names, doc)


def development_warning(cache: Cache | None, development: bool) -> str | None:
    """The warning a shared cache gets where the keys are development keys (`development`): the signing key's id is
    part of every build key, and each checkout makes its own development key pair, so what this checkout stores
    never hits in another (None: no cache, or real keys)."""
    if cache is None or not development:
        return None
    return (f"the shared cache {cache.where} ({cache.source}) is used with this checkout's development keys "
            "(.ortbuild/dev-keys/): their id is part of every build key, and every checkout makes its own, so the "
            "entries made here never hit in another checkout; share real keys instead: `ortbuild keygen --out keys`, "
            "then ORTBUILD_KEY_FILE and ORTBUILD_SIGNING_KEY_FILE (or the CI secrets ORTBUILD_KEY and "
            "ORTBUILD_SIGNING_KEY) on every machine that shares the cache")


def entry_id(build_key: str, target: str, model: str) -> str:
    """A job's entry name: the build key does not name the target or the model (equal inputs, equal key)."""
    return hashlib.sha256(f"ortbuild-cache-v1\0{build_key}\0{target}\0{model}".encode()).hexdigest()


def configured(project_file: Path, project_cache: str, flag: str | None, off: bool) -> Cache | None:
    """The cache this command uses (module doc), or None; a malformed one is a ConfigError naming its source."""
    if off:
        return None
    if flag is not None:
        spec, source, file, base = flag, "--cache", "the command line", Path.cwd()
    elif os.environ.get("ORTBUILD_CACHE"):
        spec, source, file, base = os.environ["ORTBUILD_CACHE"], "$ORTBUILD_CACHE", "the environment", Path.cwd()
    elif project_cache:
        spec, source, file, base = project_cache, "project.cache", str(project_file), project_file.parent
    else:
        return None

    def fail(message: str, hint: str) -> ConfigError:
        return ConfigError(file, source, message, hint)

    if not spec.strip():
        raise fail("empty", "write oci://host[:port]/repository or a directory (--no-cache: none)")
    if spec.startswith("oci://"):
        try:
            ref = oci_ref.parse(spec)
        except RegistryError as e:
            raise fail(e.message, "write oci://host[:port]/repository (no tag: each entry's tag is its name), "
                                  "or a directory") from None
        if ref.tag:
            raise fail(f"{spec}: a cache is a repository, not a tag",
                       f"write oci://{ref.registry}/{ref.repository} (each entry's tag is its name)")
        return Cache(spec, source, str(ref))
    if "://" in spec:
        raise fail(f"{spec!r}: unknown cache scheme", "write oci://host[:port]/repository or a directory")
    where = (base / spec).resolve()
    if where.exists() and not where.is_dir():
        raise fail(f"{where} is not a directory", "name a directory (made on first use) or an oci:// repository")
    return Cache(spec, source, str(where))


# ----------------------------------------------------------------------------------------- use in a build

def entry_names(m: manifest_types.Manifest) -> list[str]:
    """The files of an artifact directory that make its cache entry: the manifest, its signature and the files it
    signs at build time (golden data is written by `test`, after the build)."""
    return [manifest_types.MANIFEST, manifest.SIGNATURE, *sorted({n for n, _, _, what in m.signed_files()
                                                              if what != "golden file"})]


PLAINTEXT = "not encrypted (encrypt = false): a plaintext model never leaves this machine"


def cacheable(m: manifest_types.Manifest) -> str | None:
    """Why an artifact is never cached, or None."""
    return PLAINTEXT if m.encryption is None else None


def staging(dist: Path) -> Path:
    """A fresh private directory inside dist/ (a partial: `ortbuild clean` and the next run remove it if a run
    dies) whose <target>/<model>/ subdirectory receives an entry: manifest.trusted checks that place."""
    top = dist / f".cache.{secrets.token_hex(4)}.partial"
    safe_mkdir(dist, dist)
    top.mkdir(mode=0o700)
    return top


def install(staged: Path, out_dir: Path, names: list[str], root: Path) -> None:
    """Move a verified entry into out_dir, as manifest.write_signed publishes a build: the old manifest first,
    the other files of the old artifact removed, each file renamed into place, the signature and then the
    manifest last (a reader never finds a manifest describing files half-replaced)."""
    safe_mkdir(out_dir, root)
    (out_dir / manifest_types.MANIFEST).unlink(missing_ok=True)
    for stale in out_dir.iterdir():
        if (stale.is_file() or stale.is_symlink()) and stale.name not in names:
            stale.unlink()
    golden_dir = out_dir / manifest.GOLDEN_DIR
    if golden_dir.is_dir() and not golden_dir.is_symlink():
        shutil.rmtree(golden_dir)
    last = [manifest.SIGNATURE, manifest_types.MANIFEST]
    for name in [n for n in names if n not in last] + last:
        publish(staged / name, paths.inside(out_dir, *name.split("/")), root)


def _receive(dest: Path, name: str) -> Path:
    out = dest / name
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return out


# ----------------------------------------------------------------------------------------- a directory

def _dir_fetch(root: Path, entry: str, dest: Path) -> dict[str, Path] | None:
    folder = root / entry
    if not folder.exists() and not folder.is_symlink():
        return None
    try:
        if folder.is_symlink() or not folder.is_dir() or (folder / ENTRY).is_symlink():
            raise Tampered(f"cache entry {folder}: not a plain directory", REFUSED)
        try:  # a regular file of at most MAX_SMALL bytes, opened without blocking (a FIFO there never hangs)
            info = json.loads(read_document(folder / ENTRY, MAX_SMALL, follow=False))
            names = info["files"] if isinstance(info, dict) and info.get("entry") == entry else None
        except (ValueError, KeyError, OSError, RecursionError) as e:
            raise Tampered(f"cache entry {folder}: unreadable {ENTRY} ({e})", REFUSED) from None
        problem = names_problem(names) if names is not None else f"{ENTRY} names another entry"
        if not problem and manifest_types.MANIFEST not in names:  # type: ignore[operator]
            problem = f"{ENTRY} lists no {manifest_types.MANIFEST}"
        if problem:
            raise Tampered(f"cache entry {folder}: {problem}", REFUSED)
        assert isinstance(names, list)
        with contextlib.ExitStack() as opened:
            sizes: dict[str, tuple[int, int]] = {}  # name -> (open file, size checked)
            for name in names:
                sizes[name] = _checked(folder, name, opened)
            total = sum(size for _, size in sizes.values())
            if total > MAX_ENTRY:
                raise Tampered(f"cache entry {folder}: its files hold {total} bytes, more than the "
                               f"{MAX_ENTRY >> 30} GiB an entry may", REFUSED)
            got: dict[str, Path] = {}
            for name in sorted(names, key=lambda n: n != manifest_types.MANIFEST):  # the manifest first: its sizes
                got[name] = _receive(dest, name)
                _copy(*sizes[name], got[name])
                if name == manifest_types.MANIFEST:
                    match_manifest(folder, got[name], sizes)
            return got
    except OSError as e:  # unreadable, or changed while read (another build storing it)
        raise CacheProblem(f"cannot read the cache entry {folder}: {e.strerror or e}") from None


def _checked(folder: Path, name: str, opened: contextlib.ExitStack) -> tuple[int, int]:
    """The file `name` of a directory entry, opened (never through a symlink), and its size, once its stat says
    it is a plain file within the limits and not sparse (a file no build writes: cheap on disk, its size in
    zeros when copied); else Tampered."""
    parts = name.split("/")
    if any((folder.joinpath(*parts[:i])).is_symlink() for i in range(1, len(parts) + 1)) or \
            not (folder / name).is_file():
        raise Tampered(f"cache entry {folder}: {name} is not a plain file of the entry", REFUSED)
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOENT):
            raise Tampered(f"cache entry {folder}: {name} is not a plain file of the entry", REFUSED) from None
        raise
    opened.callback(os.close, fd)
    st = os.fstat(fd)
    limit = MAX_MANIFEST if name in (manifest_types.MANIFEST, manifest.SIGNATURE) else MAX_FILE
    if not stat.S_ISREG(st.st_mode):
        raise Tampered(f"cache entry {folder}: {name} is not a plain file of the entry", REFUSED)
    if st.st_size > limit:
        raise Tampered(f"cache entry {folder}: {name} is {st.st_size} bytes, more than the {limit} such a file "
                       "may be", REFUSED)
    if st.st_blocks * 512 + SPARSE_SLACK < st.st_size:
        raise Tampered(f"cache entry {folder}: {name} is a sparse file ({st.st_size} bytes, "
                       f"{st.st_blocks * 512} on disk), which no build writes", REFUSED)
    return fd, st.st_size


def _copy(fd: int, size: int, out: Path) -> None:
    """Copy `size` bytes from the open file `fd` into the new file `out`, no more (a file growing meanwhile is
    copied up to the size checked; one that shrank is then shorter, and does not verify)."""
    with open(out, "xb", buffering=0) as f:  # unbuffered: sendfile and write both at the file's offset
        done = 0
        while done < size:
            try:
                n = os.sendfile(f.fileno(), fd, done, min(size - done, 1 << 30))
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                n = f.write(os.pread(fd, min(size - done, 1 << 20), done))
            if n == 0:
                break
            done += n
    os.chmod(out, 0o600)


def _dir_store(root: Path, entry: str, folder: Path, names: list[str], doc: bytes) -> None:
    """Write the entry beside its place, then rename it there (an old entry is moved aside first and removed):
    a reader sees a whole entry or none."""
    part = root / f".{entry}.{secrets.token_hex(4)}.partial"
    try:
        root.mkdir(parents=True, exist_ok=True)
        part.mkdir(mode=0o755)
        for name in names:
            out = part / name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, out)
        atomic_write(part / ENTRY, doc, root=part, mode=0o644)
        final = root / entry
        old = root / f".{entry}.{secrets.token_hex(4)}.old.partial"
        if final.exists() or final.is_symlink():
            os.replace(final, old)
        os.replace(part, final)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise CacheProblem(f"cannot write {root}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(part, ignore_errors=True)


# ----------------------------------------------------------------------------------------- an OCI registry

def _oci(cache: Cache, entry: str) -> tuple[Ref, oras.client.OrasClient, Any]:
    """The entry's reference and a client that asks once per request (ORAS retries an error five times, for
    minutes: a cache is worth less than that), each request within its deadline."""
    ref = oci_ref.parse(cache.where).with_tag(entry)
    try:
        client = oci.client(ref, retries=False)
    except RegistryError as e:  # unreachable, or stalled (oci.Stalled)
        raise CacheProblem(e.message) from None
    return ref, client, client.get_container(f"{ref.registry}/{ref.repository}:{entry}")


def _failed(ref: Ref, action: str, e: Exception) -> CacheProblem:
    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return CacheProblem(f"cannot {action} {ref}: {text}")


def _oci_fetch(cache: Cache, entry: str, dest: Path) -> dict[str, Path] | None:
    import requests

    ref, client, container = _oci(cache, entry)
    try:
        man = oci.get_manifest(ref, client, container, oci.MANIFEST_TYPE)
    except RegistryError as e:  # an error status, a stall, a manifest too large or not JSON
        raise CacheProblem(e.message) from None
    if man is None:
        return None
    layers = man.get("layers") if isinstance(man, dict) else None
    config = man.get("config") if isinstance(man, dict) else None
    if not isinstance(config, dict) or config.get("mediaType") != ENTRY_TYPE or not isinstance(layers, list) or \
            not all(isinstance(x, dict) for x in layers):
        raise Tampered(f"cache entry {ref}: not an ortbuild cache entry", REFUSED)
    names = [(x.get("annotations") or {}).get("org.opencontainers.image.title") if isinstance(
        x.get("annotations"), dict | None) else None for x in layers]
    problem = names_problem(names)
    if problem:
        raise Tampered(f"cache entry {ref}: {problem}", REFUSED)
    for name, layer in zip(names, layers, strict=True):  # every layer checked before anything is downloaded
        size = layer.get("size")
        if layer.get("mediaType") != FILE_TYPE or not isinstance(size, int) or not 0 <= size <= MAX_FILE or \
                not re.fullmatch(r"sha256:[0-9a-f]{64}", str(layer.get("digest", ""))):
            raise Tampered(f"cache entry {ref}: layer {name} is not a file of an entry", REFUSED)
    total = sum(layer["size"] for layer in layers)
    if total > MAX_ENTRY:
        raise Tampered(f"cache entry {ref}: its layers declare {total} bytes, more than the {MAX_ENTRY >> 30} GiB "
                       "an entry may", REFUSED)
    if manifest_types.MANIFEST not in names:
        raise Tampered(f"cache entry {ref}: no {manifest_types.MANIFEST} layer", REFUSED)
    for name, layer in zip(names, layers, strict=True):  # read whole once fetched: at most a document's size
        if name in (manifest_types.MANIFEST, manifest.SIGNATURE) and layer["size"] > MAX_MANIFEST:
            raise Tampered(f"cache entry {ref}: layer {name} declares {layer['size']} bytes, more than the "
                           f"{MAX_MANIFEST >> 20} MiB it may be", REFUSED)
    declared = {str(n): (0, int(layer["size"])) for n, layer in zip(names, layers, strict=True)}
    got: dict[str, Path] = {}
    # the manifest first: the other layers must be the files it signs, at the sizes it gives, before one is fetched
    for name, layer in sorted(zip(names, layers, strict=True), key=lambda nl: nl[0] != manifest_types.MANIFEST):
        assert isinstance(name, str)
        out = _receive(dest, name)
        try:
            if oci.download(ref, client, container, layer["digest"], layer["size"], out) is not None:
                raise Tampered(f"cache entry {ref}: {name} does not match its layer's digest", REFUSED)
        except RegistryError as e:  # a stall
            raise CacheProblem(e.message) from None
        except (requests.RequestException, OSError) as e:
            raise _failed(ref, f"download {name} of", e) from None
        got[name] = out
        if name == manifest_types.MANIFEST:
            match_manifest(ref, out, declared)
    return got


def _oci_store(cache: Cache, entry: str, folder: Path, names: list[str], doc: bytes,
               digests: Mapping[str, str]) -> None:
    import requests

    ref, client, container = _oci(cache, entry)
    blobs = [(folder / n, {"mediaType": FILE_TYPE, "digest": "sha256:" + (digests.get(n) or sha256_file(folder / n)),
                           "size": (folder / n).stat().st_size, "annotations": {"org.opencontainers.image.title": n}})
             for n in names]
    try:
        oci.push_artifact(ref, client, container, blobs, doc, ENTRY_TYPE,
                          {"dev.ortbuild.cache-entry": entry, "dev.ortbuild.ortbuild": __version__})
    except RegistryError as e:
        raise CacheProblem(e.message) from None
    except (requests.RequestException, ValueError, OSError) as e:
        raise _failed(ref, "push to", e) from None
