"""Commands on built artifacts and dist/: `inspect`, `keygen`, `rekey`, `clean`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TypedDict

from ortbuild import files, workspace
from ortbuild import files as files_
from ortbuild.artifact import container, ed25519, fit, keygen, keys, manifest, manifest_types
from ortbuild.cli import owned
from ortbuild.cli.options.artifacts import CleanOptions, InspectOptions, KeygenOptions, RekeyOptions
from ortbuild.errors import ArtifactError, KeyMissing, Tampered, UsageError, WrongKey
from ortbuild.modelfiles import Signature
from ortbuild.project import config
from ortbuild.status import JobStatus, final_exit
from ortbuild.units import human_size

# ---------------------------------------------------------------------------------------------- inspect


class OnnxInfo(TypedDict):
    """`ortbuild inspect --json` of a plain ONNX model."""
    file: str
    size: int
    sha256: str
    ir_version: int
    opsets: dict[str, int]
    io: Signature
    producer: str
    nodes: int


def _inspect_onnx(path: Path) -> OnnxInfo:
    """onnx (and the check step, which imports it) load here: only inspecting a plain model needs them."""
    import onnx

    from ortbuild.pipeline.steps import check

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and friends
        raise ArtifactError(f"{path}: not an ONNX model: {str(e)[:200]}") from None
    return {"file": str(path), "size": path.stat().st_size, "sha256": files.sha256_file(path),
            "ir_version": model.ir_version, "opsets": check.opsets(model), "io": check.signature(model),
            "producer": f"{model.producer_name} {model.producer_version}".strip(), "nodes": len(model.graph.node)}


def _print_onnx(path: Path, info: OnnxInfo) -> None:
    print(f"{path}: plain ONNX model (no ortbuild manifest beside it)")
    print(f"  size {human_size(info['size'])}  sha256 {info['sha256']}")
    print(f"  ir {info['ir_version']}  opsets {info['opsets']}  nodes {info['nodes']}")
    for kind in ("inputs", "outputs"):
        for v in info["io"][kind]:
            print(f"  {kind[:-1]:<6} {v['name']}: {v['dtype']} {v['shape']}")


def cmd_inspect(o: InspectOptions) -> int:
    path = Path(o.path)
    if not path.exists():
        raise ArtifactError(f"{path}: no such file or directory")
    if path.is_file() and path.suffix == ".onnx" and not (path.parent / manifest_types.MANIFEST).exists():
        info = _inspect_onnx(path)
        if o.json:
            print(json.dumps(info, indent=2))
        else:
            _print_onnx(path, info)
        return 0
    folder = manifest.locate(path).parent
    # partial files: in an artifact directory, or in one a first build killed before its manifest left (its place
    # in dist/, or partial files in it); never searched for below a directory that is neither (inspect /etc/passwd)
    ours = (folder / manifest_types.MANIFEST).is_file() or _place(folder) is not None or any(
        next(folder.glob(pattern), None) for pattern in workspace.PARTIAL_GLOBS)
    left = [str(p) for p in workspace.leftovers(None) + (workspace.partial_files(folder) if ours else [])]
    for p in left:
        print(f"  LEFTOVER   {p}: left by an interrupted build; `ortbuild clean --stale` (or the next build) "
              "removes it", file=sys.stderr)
    folder = _artifact_folder(path)
    # one trust root: --public-key, else $ORTBUILD_PUBLIC_KEY_FILE, else the configured signing key's public half;
    # the public key a manifest names is information, never trust
    pinned = keys.public_key(o.public_key)
    if pinned and (sig := manifest.signature_problem(folder, pinned)):  # before reading what may be forged
        raise Tampered(f"{folder}: {sig}", "someone or something changed it after the build: find out what, then "
                                           "`ortbuild build --repair` rebuilds it on purpose")
    m, folder = manifest.read(path)
    unverified = None if pinned else ("no public key configured: nothing here is verified (pass --public-key "
                                      "signing.pub, or set ORTBUILD_PUBLIC_KEY_FILE or ORTBUILD_SIGNING_KEY_FILE)")
    place = _place(folder)
    swapped = manifest.place_problem(m, place) if place else None  # checked with or without a key: it names
    integrity = ([f"{folder}: {swapped}"] if swapped else []) + (  # what the directory holds
        manifest.integrity_problems(m, folder, pinned) if pinned else [])
    unfit = fit.problems(m)
    if o.json:
        print(json.dumps({"manifest": json.loads(m.to_json()), "verified": pinned is not None and not integrity,
                          "trusted_public_key_id": ed25519.public_key_id(pinned) if pinned else None,
                          "integrity_problems": integrity if pinned else [*integrity, unverified],
                          "fit_problems": unfit, "leftovers": left}, indent=2))
    else:
        _print_manifest(m, folder, pinned, integrity, unfit, unverified)
    # each finding's code, the gravest first: tampered, then unverified, then (with --strict) unfit
    return final_exit([Tampered.exit_code if integrity else 0, KeyMissing.exit_code if unverified else 0,
                       ArtifactError.exit_code if unfit and o.strict else 0])


def _artifact_folder(path: Path) -> Path:
    """The artifact directory `path` names (the directory, its manifest.json or a file beside it), or ArtifactError
    "not an artifact": no manifest there, or a manifest.json that is no ortbuild manifest and has no signature
    beside it (with a signature, a broken manifest is a tampered artifact: the signature check says so)."""
    found = manifest.locate(path)
    folder = found.parent
    hint = ("give a dist/<target>/<model>/ directory, its manifest.json or its artifact; `ortbuild inspect "
            "model.onnx` shows a plain ONNX model")
    if found.is_symlink() or not found.is_file():
        raise ArtifactError(f"{path}: not an artifact (no {manifest_types.MANIFEST} in {folder})", hint)
    if not (folder / manifest.SIGNATURE).exists():
        try:
            doc = json.loads(files_.read_document(found))
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict) or "format_version" not in doc:
            raise ArtifactError(f"{path}: not an artifact ({found} is not an ortbuild manifest, and no "
                                f"{manifest.SIGNATURE} is beside it)", hint)
    return folder


def _place(folder: Path) -> tuple[str, str] | None:
    """(target, model) whose place `folder` is when it lies in an ortbuild output directory (dist/<target>/<model>/,
    dist holding ortbuild's marker or lock), else None (a copy an app ships, an extracted release bundle)."""
    here = Path(os.path.abspath(folder))
    dist = here.parent.parent
    if here.parent == dist or not (workspace.owned(dist) or (dist / workspace.LOCK).is_file()):
        return None
    return here.parent.name, here.name


def _print_manifest(m: manifest_types.Manifest, folder: Path, pinned: bytes | None, integrity: list[str],
                    fit: list[str], unverified: str | None) -> None:
    opt, ort_version = m.optimization, m.versions["onnxruntime"]
    print(f"{m.target}/{m.model}  ({m.status})  built {m.created} with "
          f"{ort_version['distribution']} {ort_version['version']}")
    print(f"  artifact   {folder / m.artifact.file}  {human_size(m.artifact.size)}  "
          f"({m.artifact.size_ratio:.2f}x source)  sha256 {m.artifact.sha256[:16]}...")
    print(f"  source     {m.source.path}  {human_size(m.source.size)}  opsets {m.source.opsets}")
    for f in m.source.files[1:]:  # the external-data files the graph names
        print(f"             + {f['file']}  {human_size(int(f['size']))}  sha256 {str(f['sha256'])[:16]}...")
    if m.artifact.external_data:
        print(f"  weights    external data (model.onnx.data): {m.artifact.external_data}")
    if m.fusion is not None:
        fz = m.fusion
        print(f"  fusion     {fz.model_type}: " + (f"{fz.nodes_before} -> {fz.nodes_after} nodes, fused "
                                                + ", ".join(f"{op} {n}" for op, n in fz.fused_ops.items())
                                                if fz.applied else f"not applied ({fz.reason})"))
    print(f"  precision  {m.precision.name}  {m.precision.options or ''}")
    enc = m.encryption
    print("  encrypted  " + (f"{enc.algorithm}, {enc.container}, key id {enc.key_id}"
                             + (" (DEVELOPMENT KEY)" if enc.development_key else "") if enc else
                             "no (encrypt = false)"))
    print(f"  signed     {m.signing.algorithm}, public key id {m.signing.public_key_id}"
          + (" (DEVELOPMENT KEY)" if m.signing.development_key else "")
          + (f"; checked with the trusted key id {ed25519.public_key_id(pinned)}" if pinned else ""))
    print(f"  epoch      {m.epoch} (rollback counter: loaders generated at a higher epoch refuse this one)")
    counted = sum(len(f.pieces.sha256) for f in m.artifact.files if f.pieces is not None)
    print(f"  manifest   format {m.format_version}: " + (
        f"{counted} piece digests, checked on every core" if counted else
        "one sha256 per file (rebuild or `ortbuild rekey` adds piece digests, checked on every core)"))
    if m.golden:
        print(f"  golden     {len(m.golden)} signed file(s) under golden/")
    for lf in m.loaders:
        print(f"  loader     {lf.name}" + (f"  ({lf.note})" if lf.note else ""))
    print(f"  providers  {', '.join(p['name'] for p in m.providers)}")
    for name, why in m.missing_providers.items():
        print(f"  missing    {name} at build time: {why}")
    print(f"  level      {opt.applied} (asked {opt.requested}); "
          + (JobStatus.PORTABLE.value if opt.portable else f"tied to {opt.tied_to}"))
    if m.compiled:
        print(f"  compiled   ahead of time for {m.compiled['provider']} ({m.compiled['device']}): "
              f"{m.compiled['ep_context_nodes']} EPContext node(s), {m.compiled['other_nodes']} node(s) on "
              "the CPU; loads with session.disable_model_compile = 1")
    for name, info in m.plugins.items():
        print(f"  plugin     {name} from {info['package']} {info['version']} (registered by the loaders)")
    for c in m.custom_ops:
        named = f"{c['name']} {c['version']}".strip()
        print(f"  custom ops {named} ({c.get('file') or c['library']}, sha256 {c['sha256'][:16]}; registered by "
              "the Python loader after checking its sha256)")
    for kind in ("inputs", "outputs"):
        for v in m.io[kind]:
            print(f"  {kind[:-1]:<10} {v['name']}: {v['dtype']} {v['shape']}")
    print(f"  machine    {m.build_machine['cpu']} ({m.build_machine['simd_level']})")
    for n in m.notes:
        print(f"  note       {n}")
    for p in integrity:
        print(f"  TAMPERED   {p}")
    for p in fit:
        print(f"  WARNING    does not fit this environment: {p}")
    if unverified:
        print(f"  UNVERIFIED {unverified}")
    elif not integrity and not fit:
        print("  OK         signature and every signed file verified; fits this environment")
    if m.signing.development_key or (m.encryption is not None and m.encryption.development_key):
        print("  WARNING    built with a DEVELOPMENT key: never release it")


# ------------------------------------------------------------------------------------------------- keys

def cmd_keygen(o: KeygenOptions) -> int:
    if o.model_signing_pub:
        return _model_signing_pub(o)
    if o.signing_key_file:
        raise UsageError("--signing-key-file goes with --model-signing-pub (keygen otherwise makes a new signing "
                         "key)", "add --model-signing-pub, or leave --signing-key-file out")
    made = keygen.keygen(Path(o.out), development=o.dev)
    if o.json:
        print(json.dumps(made, indent=2))
        return 0
    kind = "DEVELOPMENT keys (never for a release)" if o.dev else "keys"
    print(f"wrote {kind}: {made['encryption_key']} (id {made['encryption_key_id']}), {made['signing_key']}, "
          f"{made['public_key']} (id {made['public_key_id']}), {made['model_signing_public_key']}")
    print(f"use them: export ORTBUILD_KEY_FILE={Path(made['encryption_key']).resolve()} "
          f"ORTBUILD_SIGNING_KEY_FILE={Path(made['signing_key']).resolve()}")
    print("keep encryption.key and signing.key secret; apps need encryption.key at run time, only the build "
          "needs signing.key")
    return 0


def _model_signing_pub(o: KeygenOptions) -> int:
    """`keygen --model-signing-pub`: model-signing.pub for the configured signing key, nothing else."""
    if o.dev:
        raise UsageError("--dev makes new keys; --model-signing-pub writes a public key for an existing one",
                         "leave one of them out")
    sign = keys.signing_key(file=o.signing_key_file)
    if sign is None:
        raise KeyMissing("--model-signing-pub needs the signing key (--signing-key-file, or ORTBUILD_SIGNING_KEY or "
                         "ORTBUILD_SIGNING_KEY_FILE)", f"make keys with `{keys.MAKE_KEYS}`")
    path = keygen.write_model_signing_public(Path(o.out), sign)
    if o.json:
        print(json.dumps({"model_signing_public_key": path, "public_key_id": sign.key_id}, indent=2))
        return 0
    print(f"wrote {path}: the public key `model_signing verify key` checks model.sig with (ECDSA P-256, derived "
          f"from the signing key id {sign.key_id})")
    return 0


def cmd_rekey(o: RekeyOptions) -> int:
    """Re-wrap every artifact's data keys under a new key and re-sign its manifest, in place: the model bytes are
    not re-encrypted and the build key does not change, so the next `ortbuild test` with the new key reuses the
    artifact, and the old key gets WrongKey. Each artifact is checked against the signing key first."""
    # the keys, read once, in this order (the first unreadable one is the error): the old, the new, the signing key
    old = keys.encryption_key(file=o.old_key_file)
    new = keys.encryption_key(file=o.new_key_file) if o.new_key_file else None
    sign = keys.signing_key(file=o.signing_key_file)
    if old is None or new is None or sign is None:
        raise KeyMissing("rekey needs --old-key-file, --new-key-file and a signing key "
                         "(--signing-key-file, ORTBUILD_SIGNING_KEY or ORTBUILD_SIGNING_KEY_FILE)",
                         f"make a new key: `{keys.MAKE_KEYS}`")
    keys.check_kinds(old, sign)
    keys.check_kinds(new, sign)
    folders = []
    for path in o.paths:
        p = Path(path)
        found = sorted(p.rglob(manifest_types.MANIFEST)) if p.is_dir() and not (p / manifest_types.MANIFEST).exists() \
            else [manifest.locate(p)]
        if not found or not found[0].exists():
            raise ArtifactError(f"{p}: no artifact (manifest.json) here", "give dist/ or a dist/<target>/<model>/")
        folders += [(f.parent, p if p.is_dir() else f.parent) for f in found]  # (artifact, where it was asked)
    done = 0
    for folder, asked in folders:
        dist = folder.parent.parent  # a dist/<target>/<model>/ is re-keyed under dist's lock
        locked = (dist / workspace.LOCK).exists()
        place = _place(folder)
        # no write goes through a symlink below its output directory when it lies in one, else below what was asked
        root = Path(os.path.abspath(folder)).parent.parent if place else asked
        with workspace.Lock(dist, timeout=o.lock_timeout) if locked else contextlib.nullcontext():
            done += _rekey_one(folder, root, place, old, new, sign)
    print(f"{done} artifact(s) re-keyed to key id {new.key_id}; build keys unchanged (no rebuild), the old key "
          "no longer opens them")
    return 0


def _rekey_one(folder: Path, root: Path, place: tuple[str, str] | None, old: keys.EncryptionKey,
               new: keys.EncryptionKey, sign: keys.SigningKey) -> int:
    # Tampered (a swapped directory of dist/ included): rekey never signs what it did not check
    m = manifest.trusted(folder, sign.public_raw, place=place)
    assert m is not None
    if m.encryption is None:
        return 0
    if m.encryption.key_id == new.key_id:
        print(f"{folder}: already under key id {new.key_id}")
        return 0
    if m.encryption.key_id != old.key_id:
        raise WrongKey(f"{folder}: encrypted under key id {m.encryption.key_id}, --old-key-file ({old.source}) is "
                       f"id {old.key_id}", "give the key it is encrypted under as --old-key-file")
    files, partials = [], []
    try:
        for f in m.artifact.files:
            partial = files_.partial_file(folder / f.name, root)
            partials.append(partial)
            with files_.open_partial(partial) as out:
                sha, length, digests = container.rewrap_file(folder / f.name, out, old.secret, new.secret)
                out.flush()
                os.fsync(out.fileno())
            files.append((dataclasses.replace(f, sha256=sha, size=length, pieces=digests), partial))
        main = next(f for f, _ in files if f.role == "model")
        m = dataclasses.replace(
            m, format_version=manifest_types.FORMAT_VERSION,  # a format-2 artifact is rewritten in the current format
            artifact=dataclasses.replace(m.artifact, files=[f for f, _ in files], sha256=main.sha256),
            encryption=dataclasses.replace(m.encryption, key_id=new.key_id, development_key=new.development))
        manifest.write_signed(folder, {f.name: partial for f, partial in files}, m, sign.sign, root=root)
    finally:
        for partial in partials:
            partial.unlink(missing_ok=True)
    print(f"{folder}: re-wrapped {len(files)} file(s) from key id {old.key_id} to {new.key_id}")
    return 1


# ------------------------------------------------------------------------------------------------ clean

def cmd_clean(o: CleanOptions) -> int:
    """--stale: remove what interrupted builds left; else every file ortbuild made in dist/ as well (its own list,
    cli.owned), saying what it kept: files it did not make stay."""
    dist = Path(o.dist) if o.dist else config.load(o.config, check_files=False).root / "dist"
    if not dist.exists():
        print(f"nothing to clean: {dist} does not exist")
        return 0
    if not o.stale and not workspace.owned(dist):
        raise UsageError(f"{dist}: not an ortbuild output directory (no {workspace.MARKER} marker in it): clean "
                         "empties only directories ortbuild made", f"check --dist; if {dist} holds only build output "
                                                                   "of an older ortbuild, remove it yourself")
    kept: list[Path] = []
    with workspace.Lock(dist, timeout=o.lock_timeout):
        removed = workspace.clean(dist)
        if not o.stale:
            ours, kept = owned.sort_out(dist)
            for entry in ours:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
            emptied = owned.prune_empty(dist, ours)
            # a directory that is gone whole is named once, not with every file it held
            removed += [p for p in [*ours, *emptied] if not any(d in p.parents for d in emptied)]
    for p in sorted(removed):
        print(f"removed {p}")
    for p in kept:
        print(f"kept    {p}: not made by ortbuild")
    print(f"{len(removed)} removed" + (" (leftovers of interrupted builds)" if o.stale else f" from {dist}")
          + (f"; kept {len(kept)} path(s) ortbuild did not make (listed above): remove them yourself if you mean to"
             if kept else ""))
    return 0
