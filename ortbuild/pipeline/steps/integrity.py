"""Verify step, on fresh and reused artifacts alike: the published files still match their signed manifest.
Light on purpose (no onnx, no numpy): it is all a no-op build runs."""

from __future__ import annotations

from pathlib import Path

from ortbuild.artifact import keys, manifest, manifest_types
from ortbuild.errors import ArtifactError


def run(out_dir: Path, signing: keys.SigningKey) -> manifest_types.Manifest:
    """The published artifact's manifest, once its signature and every digest verify (else Tampered)."""
    m = manifest.trusted(out_dir, signing.public_raw)
    if m is None:  # not rebuildable=True: trusted() raises rather than return None
        raise ArtifactError(f"{out_dir}: no manifest in this ortbuild's format")
    return m
