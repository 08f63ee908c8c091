"""manifest.json: what an artifact is, how it was built, and where it may be used.

`Manifest` (ortbuild.artifact.manifest_types) is the only place that knows the manifest's keys: the
build assembles one from the steps' typed results, readers (cli, nox, the loaders' generator) get one from
`read()`. It is written last and atomically beside the artifact, signed (`write_signed`): a reader that finds a
manifest finds the artifact it describes (sha256 and size recorded), never a half-written one, and `trusted()`
checks the signature and every signed file before anything is used. Stdlib only at import (the noxfile reads
manifests before any venv exists): checking a signature imports the Ed25519 module when it is needed.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ortbuild.artifact import pieces
from ortbuild.artifact.manifest_types import (
    MANIFEST,
    ArtifactFile,
    Manifest,
    SignedFile,
)
from ortbuild.errors import ArtifactError, Tampered
from ortbuild.files import atomic_copy, atomic_write, publish, read_document, safe_mkdir, sha256_file
from ortbuild.paths import inside

SIGNATURE = "manifest.sig"
GOLDEN_DIR = "golden"               # golden data beside the artifact, written by `ortbuild test` and signed here


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
    return iso_utc(when)


def iso_utc(when: dt.datetime | None = None) -> str:
    """A UTC time (default: now) as ortbuild writes it everywhere: 2026-01-01T00:00:00Z."""
    return (when or dt.datetime.now(dt.UTC)).replace(microsecond=0).isoformat().replace("+00:00", "Z")



def locate(path: Path) -> Path:
    """The manifest file for a dist/<target>/<model>/ directory, a manifest, or an artifact."""
    p = Path(path)
    if p.is_dir():
        return p / MANIFEST
    return p if p.name == MANIFEST else p.parent / MANIFEST


def read(path: Path) -> tuple[Manifest, Path]:
    """Load a manifest given the manifest, its directory, or its artifact. Returns (manifest, its dir)."""
    p = locate(path)
    try:
        text = read_document(p)
    except FileNotFoundError:
        raise ArtifactError(f"{p}: no manifest here",
                            "give a dist/<target>/<model>/ directory, its manifest.json or its artifact") from None
    except OSError as e:
        raise ArtifactError(f"{p}: unreadable manifest: {e.strerror or e}",
                            "rebuild the artifact with `ortbuild build --repair`") from None
    return Manifest.from_json(text, str(p)), p.parent


def reports(dist: Path, name: str) -> Iterator[tuple[dict[str, Any], Manifest]]:
    """Every readable JSON document dist/<target>/<model>/<name> (a test report, a profile) with the manifest of
    the artifact beside it, in path order; callers compare the build key the document was made for."""
    for f in sorted(dist.glob(f"*/*/{name}")):
        try:
            doc = json.loads(read_document(f))
            m, _ = read(f.parent)
        except (OSError, ValueError, RecursionError, ArtifactError):
            continue
        if isinstance(doc, dict):
            yield doc, m


def write_signed(folder: Path, files: dict[str, bytes | Path], m: Manifest, sign: Callable[[bytes], bytes], *,
                 root: Path, prune: bool = False) -> None:
    """Publish `files` (names relative to `folder`), then manifest.sig, then manifest.json, each atomically, below
    `root` (the output directory) without following a symlink (files.py).

    A file given as a Path is an already written (and synced) partial file: one inside `folder` is renamed into
    place, any other is copied. The old manifest goes first, so no reader finds a manifest describing files
    half-replaced; `prune` also removes the folder's other plain files (an earlier build's artifact files).
    """
    targets = {name: inside(folder, name) for name in [*files, SIGNATURE, MANIFEST]}  # refuse names leading out
    safe_mkdir(folder, root)
    (folder / MANIFEST).unlink(missing_ok=True)
    if prune:
        keep = {*files, SIGNATURE, *(v.name for v in files.values() if isinstance(v, Path) and v.parent == folder)}
        for stale in folder.iterdir():
            if (stale.is_file() or stale.is_symlink()) and stale.name not in keep:
                stale.unlink()
        if (folder / GOLDEN_DIR).is_dir() and not (folder / GOLDEN_DIR).is_symlink():  # the old artifact's
            shutil.rmtree(folder / GOLDEN_DIR)
    for name, blob in files.items():
        if isinstance(blob, Path) and blob.parent.resolve() == folder.resolve():
            publish(blob, targets[name], root)
        elif isinstance(blob, Path):
            atomic_copy(blob, targets[name], root=root)
        else:
            atomic_write(targets[name], blob, root=root)
    doc = m.to_json()
    atomic_write(targets[SIGNATURE], base64.b64encode(sign(doc)) + b"\n", root=root)
    atomic_write(targets[MANIFEST], doc, root=root)


def signature_problem(folder: Path, public_key: bytes) -> str | None:
    """Why manifest.sig does not verify the exact bytes of manifest.json with `public_key` (the trust root: the
    configured one, never the key a manifest names), or None."""
    from ortbuild.artifact import ed25519  # cryptography: not at import (the noxfile reads manifests)

    try:
        text = read_document(folder / MANIFEST)
        verified = ed25519.verify_detached(text, folder / SIGNATURE, public_key)
    except FileNotFoundError as e:
        return f"{e.filename} is missing"
    except OSError as e:
        return f"{folder}: cannot read the manifest or its signature: {e.strerror or e}"
    except ValueError:
        return f"{folder / SIGNATURE} is not a base64 signature"
    if not verified:
        named = ""
        with contextlib.suppress(ValueError, KeyError, TypeError, RecursionError):  # unverified: anything at all
            named = f"; the manifest names key id {json.loads(text)['signing']['public_key_id']}"
        return (f"the signature of {folder / MANIFEST} does not verify with the trusted public key (id "
                f"{ed25519.public_key_id(public_key)}){named}")
    return None


def golden_listing(folder: Path) -> list[str]:
    """Every file under folder/golden/, as names relative to `folder` (golden/test_data_set_0/input_0.pb)."""
    root = folder / GOLDEN_DIR
    if not root.exists() and not root.is_symlink():
        return []
    if root.is_symlink() or not root.is_dir():
        return [GOLDEN_DIR]
    return sorted(str(p.relative_to(folder)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink())


def _file_problem(folder: Path, name: str, sha256: str, size: int | None, what: str,
                  entry: ArtifactFile | None = None) -> str | None:
    path = folder / name
    if path.is_symlink() or not path.is_file():
        return f"{what} {path} is missing" if not path.exists() else f"{what} {path} is not a plain file"
    if size is not None and path.stat().st_size != size:
        return f"{what} {name} is {path.stat().st_size} bytes, the manifest says {size}"
    if entry is not None and entry.pieces is not None:  # format 3: the whole sha256 and every piece
        return pieces.problem(path, name, entry.sha256, entry.pieces)
    if sha256_file(path) != sha256:
        return f"{what} {name} sha256 differs from the manifest (modified or corrupted)"
    return None


def integrity_problems(m: Manifest, folder: Path, public_key: bytes) -> list[str]:
    """The signature (with `public_key`), then every signed file against its size and sha256: the artifact's
    files, the loaders, custom-op libraries shipped beside it, the operator config (format = "ort") and the golden
    data (golden/ holds exactly the files the manifest lists)."""
    problems = []
    sig = signature_problem(folder, public_key)
    if sig:
        problems.append(sig)
    entries = {f.name: f for f in m.artifact.files}
    for name, sha, size, what in m.signed_files():
        problem = _file_problem(folder, name, sha, size, what, entries.get(name) if what == "artifact file" else None)
        if problem:
            problems.append(problem)
    extra = sorted(set(golden_listing(folder)) - {g.name for g in m.golden})
    if extra and not sig and _predates_signed_golden(folder):
        extra = []  # an older ortbuild's layout (golden data beside, unsigned): its build key changed, it rebuilds
    if extra:
        problems.append(f"golden data not in the signed manifest: {folder / extra[0]}"
                        + (f" and {len(extra) - 1} more" if len(extra) > 1 else ""))
    return problems


def _predates_signed_golden(folder: Path) -> bool:
    """Whether the (signature-checked) manifest was written before manifests listed their golden data."""
    try:
        return "golden" not in json.loads(read_document(folder / MANIFEST))
    except (OSError, ValueError, RecursionError):
        return False


def place_problem(m: Manifest, place: tuple[str, str]) -> str | None:
    """Why the directory that is the place of `place` = (target, model) (dist/<target>/<model>/) holds another
    artifact: its manifest `m` names another target or model (a signed directory copied or moved there), or None.
    The text does not name the directory (callers prefix it)."""
    target, model = place
    if (m.target, m.model) == (target, model):
        return None
    return (f"the directory holds {m.model} for {m.target} (its manifest says so), not {model} for {target}, "
            "whose place it is: another artifact's directory was copied or moved here")


def trusted(folder: Path, public_key: bytes, *, development: bool = False, rebuildable: bool = False,
            place: tuple[str, str] | None = None) -> Manifest | None:
    """The manifest of an artifact directory whose signature verifies with `public_key` and whose every signed
    file matches it, else Tampered (naming the first problem, and how many more). `rebuildable`: None for a
    manifest signed with this key in another ortbuild's format (a rebuild replaces it), rather than an error.
    `place`: the (target, model) the directory is the place of (dist/<target>/<model>/): a validly signed
    manifest of another target or model there is Tampered too (a swapped directory is never reused or rebuilt
    over silently)."""
    hint = ("someone or something changed it after the build: find out what, then `ortbuild build --repair` "
            "(or `ortbuild clean`) rebuilds it on purpose" + (" (checked with a DEVELOPMENT key)" if development
                                                                else ""))
    sig = signature_problem(folder, public_key)
    if sig:
        raise Tampered(f"{folder}: {sig}", hint)
    try:
        m, _ = read(folder)
    except ArtifactError:
        if rebuildable:
            return None
        raise
    swapped = place_problem(m, place) if place is not None else None
    problems = ([swapped] if swapped else []) + integrity_problems(m, folder, public_key)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Tampered(f"{folder}: {problems[0]}{more}", hint)
    return m


def sign_golden(folder: Path, files: dict[str, tuple[str, int]], sign: Callable[[bytes], bytes],
                public_key: bytes, *, root: Path) -> Manifest:
    """Re-sign the manifest of a trusted artifact with its golden data (`files`: name -> (sha256, size), names
    relative to `folder`); nothing else in it changes."""
    sig = signature_problem(folder, public_key)  # the artifact's files were checked by the build, under the lock
    if sig:
        raise Tampered(f"{folder}: {sig}", "`ortbuild build --repair` rebuilds it")
    m, _ = read(folder)
    listed = [SignedFile(name, sha, size) for name, (sha, size) in sorted(files.items())]
    if listed != m.golden:
        m = dataclasses.replace(m, golden=listed)
        write_signed(folder, {}, m, sign, root=root)
    return m

