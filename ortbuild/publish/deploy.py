"""Where `ortbuild pull` puts a release: a verified release directory (what the registry gave, downloaded) is
extracted into `--to DIR`, replacing only a directory pull made itself, and never a newer release with an older
one unless `allow_downgrade` (docs/container.md, "Rollback protection"). No registry here: the tests place local
release directories."""

from __future__ import annotations

import shutil
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

from ortbuild import files as files_
from ortbuild.errors import ArtifactError, UsageError
from ortbuild.publish import epochs, verify

PULLED = ".ortbuild-pulled"  # in every directory `ortbuild pull` made: only such a directory is replaced


def check_destination(dest: Path) -> None:
    """Refuse a `--to` that pull would not replace: a symlink, a file, or a non-empty directory it did not make."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(f"{dest}: is a symlink or not a directory: pull replaces only a directory it made",
                         "choose another --to directory")
    above = next((p for p in dest.parents if p.exists() or p.is_symlink()), None)
    if above is not None and not above.is_dir():
        raise UsageError(f"{dest}: {above} is not a directory (a file or a broken symlink is there)",
                         "choose another --to directory")
    if dest.exists() and any(dest.iterdir()) and not (dest / PULLED).is_file():
        raise UsageError(f"{dest}: not empty, and not a release `ortbuild pull` made (no {PULLED} in it): pull "
                         "replaces only its own", "choose another --to directory, or an empty one")


def place(release_dir: Path, dest: Path, public_key: bytes | EllipticCurvePublicKey, *, source: str, run: bool,
          key: bytes | None, min_epoch: int = 0, allow_downgrade: bool = False) -> verify.Verified:
    """Verify the release in `release_dir` (every check of `ortbuild verify`; below `min_epoch`, or below the
    release already deployed in `dest` unless `allow_downgrade`: RolledBack, 7) and put its bundle's tree in
    `dest`, replacing what an earlier pull put there only once the new one is complete. `source` (the reference
    it came from) is written into the marker file."""
    check_destination(dest)
    floors = epochs.floors(min_epoch)
    publisher = verify.publisher_key(release_dir, public_key)  # the Ed25519 key (model.sig names it: step 0)
    try:
        there = epochs.deployed(dest, publisher)
    except ArtifactError:  # a damaged deployment: its epoch is unknown
        if not allow_downgrade:
            raise
        there = None
    if there is not None and not allow_downgrade:
        floors.append(epochs.downgrade_floor(dest, there))
    staged = dest.parent / f".{dest.name}.pulling"
    shutil.rmtree(staged, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    v = verify.verify(release_dir, public_key, run=run, key=key, extract_to=staged, floors=floors)
    if there is not None and v.epoch < epochs.release_epoch(there[1]):
        v.warnings.append(f"replaced {there[0]} ({epochs.describe(there[1])}) in {dest} with an older release "
                          f"({epochs.describe(v.model_epochs)}): --allow-downgrade")
    files_.atomic_write(staged / PULLED, f"# pulled by ortbuild from {source}: `ortbuild pull --to` may replace "
                        "it\n".encode(), root=staged, mode=0o644)
    old = dest.parent / f".{dest.name}.old"
    if dest.exists():
        dest.rename(old)
    staged.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return v
