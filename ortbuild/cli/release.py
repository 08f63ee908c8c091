"""Publishing: `release`, `verify`, `pull` and the CI `matrix`. The release, verification and registry code
(numpy for the golden test, the OCI client) loads inside the commands that use it."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

from ortbuild import paths, workspace
from ortbuild.artifact import keys, loaders, manifest
from ortbuild.cli.common import dist_dir
from ortbuild.cli.options.release import MatrixOptions, PullOptions, ReleaseOptions, VerifyOptions
from ortbuild.errors import ArtifactError, GateFailed, KeyMissing, OrtbuildError, UsageError
from ortbuild.project import config, plan
from ortbuild.status import final_exit
from ortbuild.units import human_size

if TYPE_CHECKING:
    from ortbuild.publish.verify import Verified


def _public_key(public_key: str | None) -> bytes | EllipticCurvePublicKey:
    """signing.pub's Ed25519 key, or an EC public key (model-signing.pub: model.sig is then the trust root)."""
    found = keys.release_public_key(public_key)
    if found is None:
        raise KeyMissing("verifying a release needs the publisher's public key",
                         "pass --public-key signing.pub (what `ortbuild keygen` wrote; or model-signing.pub, which "
                         "checks the release's OpenSSF signature), or set ORTBUILD_PUBLIC_KEY_FILE")
    return found


def _development_keys(project: config.Project, names: Sequence[str], dist: Path,
                      sign_key: keys.SigningKey) -> list[str]:
    """What in a release would be DEVELOPMENT-keyed: the signing key, and each artifact whose manifest says its
    encryption or signing key was one (the release checks each manifest's signature afterwards)."""
    found = [f"the signing key ({sign_key.source}) is a development key"] if sign_key.development else []
    for name in names:
        for model in project.targets[name].models:
            try:
                m, _ = manifest.read(dist / name / model)
            except OrtbuildError:
                continue  # never built, or unreadable: the release says so itself
            which = [k for k, dev in (("encryption", m.encryption is not None and m.encryption.development_key),
                                      ("signing", m.signing.development_key)) if dev]
            if which:
                found.append(f"{name}/{model} was built with a development {' and '.join(which)} key")
    return found


UNKNOWN_PUBLIC_KEY = "SIGNING.PUB"  # in a printed verify command where the public key file is not known here


class Released(TypedDict):
    """One entry of `ortbuild release --json`'s "released": the target's release files, and where it was pushed."""
    target: str
    dir: str
    bundle: str
    index: str
    provenance: str
    sums: str
    signature: str
    model_signature: str             # model.sig, the OpenSSF model-signing bundle
    forced: list[str]
    pushed: NotRequired[str]         # oci://... with the tag
    digest: NotRequired[str]         # the pushed manifest's digest
    verify: NotRequired[str]         # the command that verifies it


def _verify_command(where: str, sign_key: keys.SigningKey) -> str:
    """A verify command that works from anywhere: the signing.pub beside the signing key file (when it holds
    this key's public half), else $ORTBUILD_PUBLIC_KEY_FILE, else a placeholder and what to put there."""
    command = f"ortbuild verify {shlex.quote(where)} --public-key "
    if sign_key.path:
        beside = Path(sign_key.path).parent / keys.PUBLIC_FILE
        try:
            if beside.is_file() and keys.read_public_key(beside) == sign_key.public_raw:
                return command + shlex.quote(str(beside.resolve()))
        except (OSError, OrtbuildError):
            pass
    env = os.environ.get("ORTBUILD_PUBLIC_KEY_FILE")  # a path to print, not a key read
    if env:
        return command + shlex.quote(str(Path(env).resolve()))
    return command + UNKNOWN_PUBLIC_KEY


def _model_signing_command(where: str, sign_key: keys.SigningKey) -> str | None:
    """The upstream `model_signing verify` command for a release directory, when the model-signing.pub beside the
    signing key file holds this key's P-256 public key (docs/release.md, "Verifying with OpenSSF model_signing")."""
    from ortbuild.artifact import keygen, p256

    beside = Path(sign_key.path).parent / p256.PUBLIC_FILE if sign_key.path else None
    try:
        if beside is None or beside.read_text() != keygen.model_signing_public(sign_key):
            return None
    except (OSError, UnicodeDecodeError):
        return None
    return (f"model_signing verify key {shlex.quote(where)} --signature {shlex.quote(where + '/model.sig')} "
            f"--public_key {shlex.quote(str(beside.resolve()))}")


def _writable_dir(path: Path, given: str | None) -> None:
    """A release directory `path` (or the first of its parents that exists) must be a directory: a file there (or
    a dangling symlink) is a usage error naming it, never an internal error when the release writes."""
    for p in (path, *path.parents):
        if p.is_dir():
            return
        if p.exists() or p.is_symlink():
            where = f"--to {given}: " if given else ""
            raise UsageError(f"{where}{p} is not a directory (a file or a broken symlink is there): a release is "
                             "written into a directory, one subdirectory per target",
                             "give a directory (e.g. --to releases/), or move that file away")


def cmd_release(o: ReleaseOptions) -> int:
    """One signed, reproducible bundle per target, refused unless its tests passed (docs/release.md)."""
    from ortbuild import oci_ref
    from ortbuild.publish import registry, release

    project = config.load(o.config)
    names = plan.select(list(project.targets), o.target, "targets", str(project.file))
    dist = dist_dir(o.dist, project)
    sign_key = keys.signing_key(file=o.signing_key_file)  # the only key a release needs, read once
    if sign_key is None:
        raise KeyMissing("no signing key: a release is signed (ORTBUILD_SIGNING_KEY or ORTBUILD_SIGNING_KEY_FILE, "
                         "or --signing-key-file)", f"make one with `{keys.MAKE_KEYS}`")
    warnings: list[str] = []
    development = _development_keys(project, names, dist, sign_key)
    if development and not o.allow_development_key:
        raise KeyMissing("release refused: DEVELOPMENT keys (`keygen --dev`, for local builds only): "
                         + "; ".join(development),
                         f"build and release with your own keys: `{keys.MAKE_KEYS}`, then `ortbuild test` and "
                         "`ortbuild release` again; or pass --allow-development-key to release anyway (never "
                         "ship it)")
    if development:
        warnings.append("released with DEVELOPMENT keys (--allow-development-key): never ship it: "
                        + "; ".join(development))
        for w in warnings:
            print(f"ortbuild: WARNING: {w}", file=sys.stderr)
    ref = oci_ref.parse(o.to) if o.to and oci_ref.is_ref(o.to) else None
    if ref is not None and ref.tag and "{target}" not in ref.tag and len(names) > 1:
        raise UsageError(f"{o.to}: one tag names one bundle, and {len(names)} targets are selected",
                         "put {target} in the tag (e.g. :{version}-{target}), leave the tag out (it defaults "
                         "to {version}-{target}), or select one target with -t")
    # the default dist/release must stay inside dist/ (a symlink there leading out is refused, never written through)
    out_root = Path(o.to) if o.to and ref is None else paths.inside(dist, "release")
    write_root = out_root if o.to and ref is None else dist  # no symlink followed below it (files.py)
    if ref is None:
        for name in names:
            _writable_dir(paths.inside(out_root, name), o.to)
    done: list[Released] = []
    refused: list[OrtbuildError] = []
    lines: list[str] = []
    with workspace.Lock(dist, timeout=o.lock_timeout):
        for name in names:
            target = project.targets[name]
            try:
                pub = release.release_target(project, target, dist, paths.inside(out_root, name), sign_key,
                                             force=o.force, root=write_root)
            except (GateFailed, ArtifactError) as e:
                refused.append(e)
                continue
            index = pub.index
            entry: Released = {"target": name, "dir": str(pub.folder), "bundle": str(pub.files["bundle"]),
                               "index": str(pub.files["index"]), "provenance": str(pub.files["provenance"]),
                               "sums": str(pub.files["sums"]), "signature": str(pub.files["signature"]),
                               "model_signature": str(pub.files["model_signature"]), "forced": pub.forced}
            if ref is not None:
                tag = (ref.tag or "{version}-{target}").replace("{target}", name).replace("{version}",
                                                                                          project.version)
                where = ref.with_tag(tag)
                entry["pushed"], entry["digest"] = str(where), registry.push(where, pub, o.oci_format)
            done.append(entry)
            lines.append(f"{name}: {pub.files['bundle'].name} ({human_size(pub.files['bundle'].stat().st_size)}, "
                         f"{len(index['models'])} models) -> {pub.folder}"
                         + (f"\n  pushed {entry['pushed']} ({entry['digest']})" if "pushed" in entry else "")
                         + ("\n  FORCED: " + "; ".join(pub.forced) if pub.forced else ""))
    code = final_exit(err.exit_code for err in refused)
    for entry in done:
        entry["verify"] = _verify_command(entry.get("pushed") or str(Path(entry["dir"]).absolute()), sign_key)
    if o.json:
        print(json.dumps({"exit_code": code, "released": done, "refused": [err.message for err in refused],
                          "warnings": warnings}, indent=2))
        return code
    for line in lines:
        print(line)
    for err in refused:
        print(err.render(), file=sys.stderr)
    if done:
        print("\nverify with: " + "\n             ".join(entry["verify"] for entry in done))
        upstream = [c for e in done if "pushed" not in e
                    and (c := _model_signing_command(str(Path(e["dir"]).absolute()), sign_key))]
        if upstream:
            print("  or with OpenSSF model_signing: " + "\n    ".join(upstream))
        if done[0]["verify"].endswith(UNKNOWN_PUBLIC_KEY):
            print(f"  {UNKNOWN_PUBLIC_KEY}: the signing.pub `ortbuild keygen` wrote beside the signing key (public key "
                  f"id {sign_key.key_id}); set ORTBUILD_PUBLIC_KEY_FILE to it and this says its path")
    return code


def _verify_lines(v: Verified, as_json: bool, extra: dict[str, str] | None = None) -> None:
    if as_json:
        print(json.dumps({"name": v.name, "target": v.target, "epoch": v.epoch, "checks": v.lines,
                          "warnings": v.warnings, "tests": v.index["tests"], **(extra or {})}, indent=2))
        return
    print(f"{v.name}: verified")
    for line in v.lines:
        print(f"  {line}")
    for w in v.warnings:
        print(f"  WARNING: {w}")


def cmd_verify(o: VerifyOptions) -> int:
    """Signature, digests, provenance, safe extraction, then the golden test through the bundle's loader."""
    from ortbuild import oci_ref
    from ortbuild.publish import epochs, registry, verify

    c = o.checks
    public = _public_key(c.public_key)
    secrets = keys.Secrets(encryption=keys.encryption_key(file=c.key_file))  # the golden test decrypts
    with tempfile.TemporaryDirectory(prefix="ortbuild-verify-") as tmp:
        where = Path(o.bundle)
        if oci_ref.is_ref(o.bundle):
            registry.pull(oci_ref.parse(o.bundle), Path(tmp))
            where = Path(tmp)
        v = verify.verify(where, public, run=not c.no_run, key=secrets.secret, floors=epochs.floors(c.min_epoch))
    _verify_lines(v, c.json)
    return 0


def cmd_pull(o: PullOptions) -> int:
    """Fetch a release from an OCI registry, verify it, and place the verified bundle in --to (never over a newer
    release unless --allow-downgrade: ortbuild.publish.deploy)."""
    from ortbuild import oci_ref
    from ortbuild.publish import deploy, registry, release

    c = o.checks
    ref = oci_ref.parse(o.ref)
    public = _public_key(c.public_key)
    secrets = keys.Secrets(encryption=keys.encryption_key(file=c.key_file))
    if o.to:
        deploy.check_destination(Path(o.to))  # before the download
    with tempfile.TemporaryDirectory(prefix="ortbuild-pull-") as tmp:
        pulled = registry.pull(ref, Path(tmp))
        dest = Path(o.to) if o.to else Path.cwd() / pulled["index"].name.removesuffix(f".{release.INDEX}")
        v = deploy.place(Path(tmp), dest, public, source=str(ref), run=not c.no_run, key=secrets.secret,
                         min_epoch=c.min_epoch, allow_downgrade=o.allow_downgrade)
    _verify_lines(v, c.json, {"dir": str(dest)})
    if not c.json:
        print(f"  -> {dest}")
        for model in v.index["models"]:  # each model's Python loader, as its (verified) manifest names it
            m, _ = manifest.read(dest / model)
            loader = loaders.python_loader_of(dest / model, m)
            print(f"     {model}: `import {loader.stem}` with {loader.parent} on sys.path (docs/loaders.md)")
    return 0


def cmd_matrix(o: MatrixOptions) -> int:
    """A GitHub Actions matrix: one entry per target, on a runner with its hardware (docs/ci.md)."""
    project = config.load(o.config, check_files=False)
    names = plan.select(list(project.targets), o.target, "targets", str(project.file))
    from ortbuild.pipeline import cache  # not at import: the matrix is printed where little is installed

    shared = cache.configured(project.file, project.cache, o.cache, False)
    # a directory as the runners' checkout reaches it: relative to the directory the matrix is made in (CI's
    # checkout root) where it lies below it
    where = "" if shared is None else shared.where if shared.is_oci or not Path(shared.where).is_relative_to(
        Path.cwd()) else os.path.relpath(shared.where)
    include = [{"target": n, "cache": where, "runs-on": list(project.targets[n].runner),
                "runtime": project.targets[n].runtime_text,
                "required": project.targets[n].require, "session": project.targets[n].session("test"),
                "release_session": project.targets[n].session("release"),
                "platform": project.targets[n].platform,
                "models": list(project.targets[n].models)} for n in names]
    print(json.dumps({"include": include}, indent=None if o.compact else 2))
    return 0
