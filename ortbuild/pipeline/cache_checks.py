"""What a fetched build-cache entry must be before its files are used (docs/cache.md), checked before its
signature is (ortbuild.pipeline.cache then verifies it like dist/): its file names could be an artifact's, and its
manifest, fetched first, signs exactly its other files at the sizes they have. Anything else is Tampered: the entry
is refused and the build replaces it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ortbuild.artifact import manifest, manifest_types
from ortbuild.errors import OrtbuildError, Tampered

if TYPE_CHECKING:
    from ortbuild.oci_ref import Ref

MAX_UNSIZED = 256 << 20         # a file the manifest signs without a size (a loader, a custom-op library)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}(/[A-Za-z0-9][A-Za-z0-9._+-]{0,200}){0,3}$")
REFUSED = "the entry is refused; this build replaces it"


def names_problem(names: object) -> str | None:
    """Why an entry's list of file names cannot be an artifact's, or None: each a relative name of plain parts,
    once, none the directory of another."""
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return "its file list is not a list of names"
    bad = next((n for n in names if not NAME.match(n)), None)
    if bad is not None:
        return f"{bad[:80]!r} is not a file name of an artifact"
    if len(set(names)) != len(names):
        return "a file is listed twice"
    dirs = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    clash = sorted(dirs & set(names))
    return f"{clash[0]!r} is listed as a file and as a directory" if clash else None


def match_manifest(folder: Path | Ref, copied: Path, sizes: dict[str, tuple[int, int]]) -> None:
    """Before any other file is copied: Tampered when the entry's manifest (copied first; its signature is verified
    later) does not parse, when the entry holds a file it does not sign, or when a file's size is not the one it
    gives (a file it gives no size, a loader or a library, may be at most MAX_UNSIZED bytes)."""
    try:
        m = manifest_types.Manifest.from_json(copied.read_bytes(), str(copied))
    except (OrtbuildError, RecursionError):
        raise Tampered(f"cache entry {folder}: its {manifest_types.MANIFEST} is not an ortbuild manifest",
                       REFUSED) from None
    signed = {name: size for name, _, size, _ in m.signed_files()}
    for name, (_, got) in sizes.items():
        if name in (manifest_types.MANIFEST, manifest.SIGNATURE):
            continue
        if name not in signed:
            raise Tampered(f"cache entry {folder}: {name} is not a file its manifest signs", REFUSED)
        size = signed[name]
        if (size is not None and got != size) or (size is None and got > MAX_UNSIZED):
            raise Tampered(f"cache entry {folder}: {name} is {got} bytes, its manifest says "
                           + (str(size) if size is not None else f"nothing (at most {MAX_UNSIZED >> 20} MiB)"),
                           REFUSED)
