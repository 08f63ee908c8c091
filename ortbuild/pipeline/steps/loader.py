"""Verify step, on fresh artifacts: the generated Python loader opens the artifact and reproduces the build's
outputs (steps/integrity.py checks every artifact, reused ones too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ortbuild.artifact import loaders, manifest_types
from ortbuild.errors import ArtifactError
from ortbuild.pipeline.steps.reload import ReloadResult
from ortbuild.project.data import Feed


def through_loader(name: str, out_dir: Path, m: manifest_types.Manifest, feed: Feed, secret: bytes | None,
                   portable: bool, reference: ReloadResult | None) -> None:
    """Open the published artifact through its generated Python loader and run the golden inputs.

    Fresh builds must reproduce the unencrypted artifact's outputs (`reference`, from the reload step); where
    the target's providers cannot run here (`portable`), the loader must refuse to load it (no silent
    fallback) after verifying it.
    """
    module = loaders.import_python_loader(loaders.python_path(out_dir, m.model))
    if portable:
        module.verify(out_dir)
        try:
            module.load(key=secret, folder=out_dir)
        except module.ProviderUnavailableError:
            return
        raise ArtifactError(f"{name}: the Python loader opened an artifact whose providers cannot run "
                            "here: it must refuse (no silent fallback)")
    model = module.load(key=secret, folder=out_dir)
    got = model.run(feed)
    expected = [(o["name"], o["dtype"], o["shape"]) for o in m.golden_run.outputs]
    seen = [(n, str(np.asarray(v).dtype), list(np.asarray(v).shape)) for n, v in got.items()]
    if seen != expected:
        raise ArtifactError(f"{name}: the Python loader's outputs {seen} differ from the build's {expected}")
    if reference is not None:
        for (out, value), ref in zip(got.items(), reference.values, strict=True):
            a, b = np.asarray(value), np.asarray(ref)
            same = np.array_equal(a, b) if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=1e-5, atol=1e-6,
                                                                                  equal_nan=True)  # NaN golden inputs
            if not same:
                raise ArtifactError(f"{name}: output '{out}' through the Python loader differs from the "
                                    "unencrypted artifact's")
