"""manifest.json: what an artifact is, how it was built, and where it may be used.

Written last and atomically beside the artifact: a reader that finds a manifest finds the artifact it
describes (sha256 and size recorded), never a half-written one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ArtifactError

MANIFEST = "manifest.json"
VERSION = 1


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def timestamp() -> str:
    """UTC now, or SOURCE_DATE_EPOCH when set (reproducible builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None:
        try:
            when = dt.datetime.fromtimestamp(int(epoch), dt.UTC)
        except ValueError:
            raise ArtifactError(f"SOURCE_DATE_EPOCH={epoch!r} is not an integer number of seconds",
                                "unset it, or set it to e.g. $(git log -1 --format=%ct)") from None
    else:
        when = dt.datetime.now(dt.UTC)
    return when.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_copy(src: Path, dst: Path) -> None:
    atomic_write(dst, src.read_bytes())


def dumps(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def read(path: Path) -> tuple[dict[str, Any], Path]:
    """Load a manifest given the manifest, its directory, or its artifact. Returns (manifest, its dir)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    elif p.name != MANIFEST:
        p = p.parent / MANIFEST
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{p}: no manifest here",
                            "give a dist/<target>/<model>/ directory, its manifest.json or its artifact") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{p}: unreadable manifest: {e}", "rebuild the artifact with `ortbuild build`") from None
    if not isinstance(data, dict) or data.get("manifest_version") != VERSION:
        raise ArtifactError(f"{p}: not an ortbuild manifest (version {VERSION})",
                            "rebuild the artifact with this ortbuild")
    return data, p.parent


def integrity_problems(manifest: dict[str, Any], folder: Path) -> list[str]:
    art = folder / manifest["artifact"]["file"]
    if not art.exists():
        return [f"artifact {art} is missing"]
    problems = []
    if art.stat().st_size != manifest["artifact"]["size"]:
        problems.append(f"artifact {art.name} is {art.stat().st_size} bytes, the manifest says "
                        f"{manifest['artifact']['size']}")
    if sha256_file(art) != manifest["artifact"]["sha256"]:
        problems.append(f"artifact {art.name} sha256 differs from the manifest (modified or corrupted)")
    return problems


def fit_problems(manifest: dict[str, Any]) -> list[str]:
    """Why this machine/environment should not use the artifact (empty: it fits)."""
    from . import runtime
    from .config import Provider

    problems = []
    tied = manifest["optimization"]["tied_to"]
    want_simd = tied.get("simd_level")
    if want_simd and want_simd != runtime.simd_level():
        problems.append(f"built with a {want_simd} NCHWc layout (optimization "
                        f"'{manifest['optimization']['applied']}'); this machine is {runtime.simd_level()}: "
                        "rebuild it here or use optimization = \"extended\"")
    flavor = runtime.installed_flavor()
    built = manifest["versions"]["onnxruntime"]
    if flavor is None:
        problems.append(f"no ONNX Runtime installed; the artifact was built with {built['distribution']} "
                        f"{built['version']}")
        return problems
    if flavor.distribution != built["distribution"]:
        problems.append(f"built with {built['distribution']}, this environment has {flavor.distribution}")
    for name in tied.get("providers", []):
        reason = runtime.probe_provider(Provider(name))
        if reason:
            problems.append(f"the graph holds ops fused for {name}: {reason}")
    for p in manifest["providers"]:
        if p["name"] not in tied.get("providers", []):
            reason = runtime.probe_provider(Provider(p["name"], p.get("options", {})))
            if reason:
                problems.append(f"the target's provider cannot run here, ORT would fall back silently: {reason}")
    return problems
