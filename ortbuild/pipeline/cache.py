"""The shared build cache: sealed artifacts by build key, in a directory or an OCI registry (docs/cache.md).

Where: `--cache oci://host[:port]/repository` or `--cache DIR`, else $ORTBUILD_CACHE, else [project] cache (a
directory there is relative to targets.toml); `--no-cache` turns it off. One entry per build key (the key names
everything the artifact depends on, the signing key id and the encryption's included): in a directory
`DIR/<key>/`, in a registry the tag `<key>` of the repository, one layer per file.

An entry is what a build publishes in dist/<target>/<model>/ and nothing else: the signed manifest, its
signature and the files it signs (the encrypted model, the loaders). A target that does not encrypt
(`encrypt = false`) is never cached: its artifact is a plaintext model, and no plaintext leaves the machine.

Nothing the cache holds is trusted: a hit is downloaded into a private partial directory of dist/, and used only
if its manifest verifies with the configured signing key, names this target, model and build key, every file
matches it and the configured encryption key opens it (buildkey.published, as for dist/ itself). Anything else
(another key's signature, a changed byte, another build key under this one's name) is refused with a warning
naming the entry, the job is built, and the build's artifact replaces the entry. The cache is an accelerator: a
cache that cannot be reached, or refuses a push, is a warning, never a failed build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortbuild import __version__, oci, paths
from ortbuild.artifact import manifest
from ortbuild.errors import ConfigError, OrtbuildError, RegistryError, Tampered
from ortbuild.files import atomic_write, publish, safe_mkdir

if TYPE_CHECKING:
    import oras.client

    from ortbuild.oci import Ref

ENTRY_TYPE = "application/vnd.ortbuild.cache.entry.v1+json"     # the OCI config: entry.json
FILE_TYPE = "application/vnd.ortbuild.cache.file.v1"             # every file's layer
ENTRY = "entry.json"                                             # what the entry holds, beside its files
MAX_FILE = 64 << 30
MAX_SMALL = 1 << 20
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}(/[A-Za-z0-9][A-Za-z0-9._+-]{0,200}){0,3}$")
KEY = re.compile(r"^[0-9a-f]{64}$")
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


class CacheProblem(OrtbuildError):
    """The cache could not be read or written (a warning: the job builds)."""


@dataclass(frozen=True)
class Cache:
    """A configured cache: `spec` as given, `where` resolved (an absolute directory or an oci:// reference)."""

    spec: str
    source: str                  # --cache, $ORTBUILD_CACHE or the targets.toml key
    where: str

    @property
    def is_oci(self) -> bool:
        return self.where.startswith("oci://")

    def entry(self, key: str) -> str:
        """The entry's name, for messages."""
        return f"{self.where}:{key}" if self.is_oci else str(Path(self.where) / key)

    def fetch(self, key: str, dest: Path) -> dict[str, Path] | None:
        """Download the entry into `dest` (an empty directory); its files by name, or None (no entry)."""
        return _oci_fetch(self, key, dest) if self.is_oci else _dir_fetch(Path(self.where), key, dest)

    def store(self, key: str, folder: Path, names: list[str], info: dict[str, str]) -> None:
        """Put the files `names` of `folder` (an artifact directory) as the entry of `key` (replacing one)."""
        doc = json.dumps({"format": "ortbuild-cache-v1", "build_key": key, **info, "files": names,
                          "ortbuild": __version__}, indent=2, sort_keys=True).encode() + b"\n"
        if self.is_oci:
            _oci_store(self, key, folder, names, doc)
        else:
            _dir_store(Path(self.where), key, folder, names, doc)


def configured(project_file: Path, project_cache: str, flag: str | None, off: bool) -> Cache | None:
    """The cache this command uses (module doc), or None; a malformed one is a ConfigError naming its source."""
    if off:
        return None
    if flag:
        spec, source, base = flag, "--cache", Path.cwd()
    elif os.environ.get("ORTBUILD_CACHE"):
        spec, source, base = os.environ["ORTBUILD_CACHE"], "$ORTBUILD_CACHE", Path.cwd()
    elif project_cache:
        spec, source, base = project_cache, "project.cache", project_file.parent
    else:
        return None
    file = str(project_file) if source == "project.cache" else source

    def fail(message: str, hint: str) -> ConfigError:
        return ConfigError(file, source, message, hint)

    if spec.startswith("oci://"):
        try:
            ref = oci.parse(spec)
        except RegistryError as e:
            raise fail(e.message, "write oci://host[:port]/repository (no tag: each entry's tag is its build key), "
                                  "or a directory") from None
        if ref.tag:
            raise fail(f"{spec}: a cache is a repository, not a tag",
                       f"write oci://{ref.registry}/{ref.repository} (each entry's tag is its build key)")
        return Cache(spec, source, str(ref))
    if "://" in spec:
        raise fail(f"{spec!r}: unknown cache scheme", "write oci://host[:port]/repository or a directory")
    where = (base / spec).resolve()
    if where.exists() and not where.is_dir():
        raise fail(f"{where} is not a directory", "name a directory (made on first use) or an oci:// repository")
    return Cache(spec, source, str(where))


# ----------------------------------------------------------------------------------------- use in a build

def entry_names(m: manifest.Manifest) -> list[str]:
    """The files of an artifact directory that make its cache entry: the manifest, its signature and the files it
    signs at build time (golden data is written by `test`, after the build)."""
    return [manifest.MANIFEST, manifest.SIGNATURE, *sorted({n for n, _, _, what in m.signed_files()
                                                              if what != "golden file"})]


def cacheable(m: manifest.Manifest) -> str | None:
    """Why an artifact is never cached, or None."""
    if m.encryption is None:
        return "not encrypted (encrypt = false): a plaintext model never leaves this machine"
    return None


@dataclass(frozen=True)
class Staged:
    folder: Path                 # dist/.cache.<hex>.partial/<target>/<model>/: the downloaded entry
    files: dict[str, Path]


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
    (out_dir / manifest.MANIFEST).unlink(missing_ok=True)
    for stale in out_dir.iterdir():
        if (stale.is_file() or stale.is_symlink()) and stale.name not in names:
            stale.unlink()
    golden_dir = out_dir / manifest.GOLDEN_DIR
    if golden_dir.is_dir() and not golden_dir.is_symlink():
        shutil.rmtree(golden_dir)
    last = [manifest.SIGNATURE, manifest.MANIFEST]
    for name in [n for n in names if n not in last] + last:
        publish(staged / name, paths.inside(out_dir, *name.split("/")), root)


# ----------------------------------------------------------------------------------------- a directory

def _dir_fetch(root: Path, key: str, dest: Path) -> dict[str, Path] | None:
    folder = root / key
    if not folder.is_dir():
        return None
    try:
        info = json.loads((folder / ENTRY).read_bytes()[:MAX_SMALL])
        names = info["files"]
        if info.get("build_key") != key or not isinstance(names, list):
            raise ValueError("entry.json names another build key, or no files")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Tampered(f"cache entry {folder}: unreadable {ENTRY} ({e})",
                       "the entry is replaced by this build") from None
    got: dict[str, Path] = {}
    for name in names:
        src = folder / name
        if not isinstance(name, str) or not NAME.match(name) or name in got or src.is_symlink() or not src.is_file():
            raise Tampered(f"cache entry {folder}: {name!r} is not a plain file of the entry",
                           "the entry is replaced by this build")
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(src, out)
        os.chmod(out, 0o600)
        got[name] = out
    return got


def _dir_store(root: Path, key: str, folder: Path, names: list[str], doc: bytes) -> None:
    """Write the entry beside its place, then rename it there (an old entry of the key is moved aside first and
    removed): a reader sees a whole entry or none."""
    root.mkdir(parents=True, exist_ok=True)
    part = root / f".{key}.{secrets.token_hex(4)}.partial"
    part.mkdir(mode=0o755)
    try:
        for name in names:
            out = part / name
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder / name, out)
        atomic_write(part / ENTRY, doc, root=part, mode=0o644)
        final = root / key
        old = root / f".{key}.{secrets.token_hex(4)}.old.partial"
        if final.exists():
            os.replace(final, old)
        os.replace(part, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(part, ignore_errors=True)


# ----------------------------------------------------------------------------------------- an OCI registry

def _oci(cache: Cache, key: str) -> tuple[Ref, oras.client.OrasClient, Any]:
    ref = oci.parse(cache.where).with_tag(key)
    try:
        client = oci.client(ref)
    except RegistryError as e:
        raise CacheProblem(e.message) from None
    return ref, client, client.get_container(f"{ref.registry}/{ref.repository}:{key}")


def _oci_fetch(cache: Cache, key: str, dest: Path) -> dict[str, Path] | None:
    import requests

    ref, client, container = _oci(cache, key)
    try:
        r = client.do_request(f"{client.prefix}://{container.manifest_url()}", "GET",
                              headers={"Accept": MANIFEST_TYPE})
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise CacheProblem(f"{ref}: the registry answered {r.status_code} to the manifest")
        man = r.json()
    except (requests.RequestException, ValueError) as e:
        raise CacheProblem(f"cannot read {ref}: {str(e).strip()[:300]}") from None
    if not isinstance(man, dict) or (man.get("config") or {}).get("mediaType") != ENTRY_TYPE:
        raise Tampered(f"cache entry {ref}: not an ortbuild cache entry", "the entry is replaced by this build")
    got: dict[str, Path] = {}
    for layer in man.get("layers") or []:
        name = ((layer.get("annotations") or {}).get("org.opencontainers.image.title", "")
                if isinstance(layer, dict) else "")
        size, digest = layer.get("size"), str(layer.get("digest", ""))
        if layer.get("mediaType") != FILE_TYPE or not NAME.match(name) or name in got or \
                not isinstance(size, int) or not 0 <= size <= MAX_FILE or not re.fullmatch(r"sha256:[0-9a-f]{64}",
                                                                                          digest):
            raise Tampered(f"cache entry {ref}: layer {name!r} is not a file of an entry, or is listed twice",
                           "the entry is replaced by this build")
        out = dest / name
        out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        got[name] = out
        _download(client, container, ref, name, size, digest, out)
    return got


def _download(client: oras.client.OrasClient, container: Any, ref: Ref, name: str, size: int, digest: str,
              out: Path) -> None:
    import requests

    h, n = hashlib.sha256(), 0
    try:
        with client.get_blob(container, digest, stream=True) as r, open(out, "xb") as f:
            r.raise_for_status()
            for chunk in r.iter_content(chunk_size=1 << 20):
                n += len(chunk)
                if n > size:
                    break
                h.update(chunk)
                f.write(chunk)
    except (requests.RequestException, OSError) as e:
        raise CacheProblem(f"cannot download {name} of {ref}: {str(e).strip()[:300]}") from None
    if n != size or "sha256:" + h.hexdigest() != digest:
        raise Tampered(f"cache entry {ref}: {name} does not match its layer's digest", "the entry is replaced")


def _oci_store(cache: Cache, key: str, folder: Path, names: list[str], doc: bytes) -> None:
    import oras.oci
    import requests

    ref, client, container = _oci(cache, key)
    try:
        with tempfile.TemporaryDirectory(prefix="ortbuild-cache-") as tmp:
            conf_path = Path(tmp) / ENTRY
            conf_path.write_bytes(doc)
            conf = {"mediaType": ENTRY_TYPE, "digest": "sha256:" + hashlib.sha256(doc).hexdigest(), "size": len(doc)}
            _check(client.upload_blob(str(conf_path), container, conf), ref, ENTRY)
            layers = []
            for name in names:
                layer = oras.oci.NewLayer(str(folder / name), FILE_TYPE)
                layer["annotations"] = {"org.opencontainers.image.title": name}
                _check(client.upload_blob(str(folder / name), container, layer, do_chunked=True), ref, name)
                layers.append(layer)
            man = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": conf, "layers": layers,
                   "annotations": {"dev.ortbuild.build-key": key, "dev.ortbuild.ortbuild": __version__}}
            _check(client.upload_manifest(man, container), ref, "the manifest")
    except (requests.RequestException, ValueError, OSError) as e:
        raise CacheProblem(f"cannot push {ref}: {str(e).strip()[:300]}") from None


def _check(r: Any, ref: Ref, what: str) -> None:
    if r.status_code not in (200, 201, 202):
        raise CacheProblem(f"cannot push {what} to {ref}: the registry answered {r.status_code}")

