"""The build key and the reuse decision.

The key names everything an artifact depends on, part by part (so `plan` says which part changed); a published
artifact whose signed manifest records the same key is reused, after its signature and digests are checked.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from packaging.requirements import Requirement

from ortbuild import __version__, files, installed, machine, runtime
from ortbuild.artifact import keys, loaders, manifest, manifest_types
from ortbuild.errors import KeyMissing, WrongKey
from ortbuild.pipeline.steps import recipes
from ortbuild.project import options
from ortbuild.project.config import Target
from ortbuild.project.kinds import kind_rule
from ortbuild.project.plan import Job


class Sealing(TypedDict):
    """The build key's `sealing` part: how the artifact is sealed, never a key."""
    encrypted: bool
    signing_key_id: str
    deterministic: bool              # deterministic encryption (deterministic())
    epoch: int                       # [project] epoch


def key_parts(job: Job, sources: dict[str, str], inputs_sha: str, calib_sha: str | None, flavor: installed.Flavor,
              missing: dict[str, str], sealing: Sealing, *, plugins: dict[str, dict[str, str]],
              libraries: Sequence[runtime.CustomOpLibrary]) -> dict[str, object]:
    """Everything the artifact depends on, by name (plan says which one changed). `sources`: the model's
    files (ModelFiles.digests(): `source`, and `source:<location>` for each external-data file)."""
    parts: dict[str, object] = {  # each part only hashed (its JSON): build_key()
        **sources, "inputs": inputs_sha,
        # only the precisions that read calibration data depend on it
        "calibration": calib_sha if job.settings.rule.needs_calibration else None,
        **{f"settings.{k}": v for k, v in job.settings.as_json().items()},
        "runtime": flavor.as_json(), "onnx": md.version("onnx"), "ortbuild": __version__,
        "loader_templates": loaders.templates_digest(),  # a changed loader rebuilds, even within one ortbuild version
        "plugins": plugins,
        "custom_ops": [lib.as_json() for lib in libraries],
        "missing_providers": sorted(missing),
        "simd_level": machine.simd_level() if options.LEVEL_RULES[job.settings.optimization].nchwc else None,
        "sealing": sealing,  # key ids (never keys) and whether encryption is deterministic
    }
    if job.settings.rule.needs_calibration:  # int8-static: its recipes (steps/recipes.py) as this ortbuild has them
        parts["static_recipes"] = recipes.VERSION
    if kind_rule(job.model.kind).builder_in_key:  # the model builder's output depends on its packages' versions
        parts["builder"] = builder_versions()
    return parts


def builder_versions() -> dict[str, str]:
    """The installed versions of onnxruntime-genai's model builder and of what it imports ("" where absent)."""
    out = {}
    for name in ("onnxruntime-genai", "torch", "transformers", "onnx_ir"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = ""
    return out




def plugin_versions(target: Target) -> dict[str, dict[str, str]]:
    """The target's plugin EPs as installed here, by provider: package, import name, version, devices."""
    out = {}
    for req in target.plugins:
        plugin = options.PLUGINS[Requirement(req).name.lower()]
        try:
            version = md.version(plugin.package)
        except md.PackageNotFoundError:
            version = "not installed"
        out[plugin.provider] = {"package": plugin.package, "module": plugin.module, "version": version,
                                "devices": plugin.devices}
    return out


def _sha(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def build_key(parts: dict[str, object]) -> tuple[str, dict[str, str]]:
    """The build key (equal keys: the published artifact can be reused) and a short digest of each part."""
    return _sha(parts), {k: _sha(v)[:16] for k, v in parts.items()}


def changed_parts(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The names of the build key's parts that differ between a manifest and now."""
    return sorted(k for k in {*recorded, *now} if recorded.get(k) != now.get(k))


def digest(path: Path | None) -> str | None:
    if path is None:
        return None
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(path.rglob("*.pb")):
            h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        return h.hexdigest()
    return files.sha256_file(path)


def deterministic() -> bool:
    """Encryption is deterministic when the build asks for reproducible output (SOURCE_DATE_EPOCH set)."""
    return "SOURCE_DATE_EPOCH" in os.environ


def published(out_dir: Path, key: str, sign_key: keys.SigningKey | None, parts: dict[str, str] | None = None,
              enc_key: keys.EncryptionKey | None = None) -> tuple[str | None, manifest_types.Manifest | None]:
    """(why the published artifact must be rebuilt, None) or (None, its manifest).

    Trust first, with the configured signing key (never the manifest's own): a manifest whose signature does
    not verify, or a signed file (artifact, loaders, golden data, custom ops) that differs, raises Tampered
    whatever else changed: a build never replaces what someone modified (`--repair` does, on purpose). An
    intact artifact is rebuilt when its build key changed; one sealed for another encryption key raises WrongKey
    (`ortbuild rekey` rotated it: the old key no longer opens it)."""
    if not (out_dir / manifest_types.MANIFEST).exists():  # never built, or a publish cut short (the manifest goes
        return "no artifact yet", None             # first and comes last): files without one are no artifact
    if sign_key is None:
        raise KeyMissing("no signing key: the published artifacts are checked with its public half",
                         f"make keys: `{keys.MAKE_KEYS}`")
    # out_dir is dist/<target>/<model>/: another artifact's signed directory swapped in is Tampered, not rebuilt
    m = manifest.trusted(out_dir, sign_key.public_raw, development=sign_key.development, rebuildable=True,
                         place=(out_dir.parent.name, out_dir.name))
    if m is None:  # signed by this key, in another ortbuild's manifest format
        return "built by another ortbuild (manifest format)", None
    if m.build_key != key:
        if parts is not None and m.build_inputs:
            return "changed: " + ", ".join(changed_parts(m.build_inputs, parts)), None
        return "changed: the build key (built by an older ortbuild)", None
    if m.encryption is not None and enc_key is not None and m.encryption.key_id != enc_key.key_id:
        raise WrongKey(f"{out_dir}: encrypted for key id {m.encryption.key_id}, the configured key "
                       f"({enc_key.source}) is id {enc_key.key_id}",
                       "use the key it was built or re-keyed with (after `ortbuild rekey`, the new one); "
                       "`ortbuild build --repair` rebuilds it under this key")
    return None, m
