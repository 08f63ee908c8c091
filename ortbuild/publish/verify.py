"""`ortbuild verify` and the checks behind `ortbuild pull`: a release is trusted only after all of these hold.

    0. given an EC public key (model-signing.pub) instead of signing.pub: model.sig, the OpenSSF model-signing
       bundle, verifies with it; the directory holds exactly the files it signs, SHA256SUMS and its signature with
       the digests it signs (the others: through steps 2-4); the Ed25519 key its signed predicate names is the
       publisher's public key for the steps below (ortbuild.publish.openssf)
    1. SHA256SUMS.minisig verifies SHA256SUMS with the publisher's public key (minisign format)
    2. every file SHA256SUMS lists is present with that digest (the index, the provenance, the bundle)
    3. the provenance: a DSSE envelope signed by the same key; an in-toto statement with SLSA v1 provenance
       whose subjects are the bundle and the index with those digests; its test verdicts
    4. the bundle, streamed member by member (never `extractall`, never a member whole in memory): the signed
       index first, then only regular files the index lists, each once, each with the listed size and sha256,
       and the whole file's sha256, all on one pass (ortbuild.publish.tarball)
    5. every artifact's manifest signature and digests (the key given); the release's epoch (the lowest of its
       signed manifests') against the floors given (`--min-epoch`, the release `pull --to` would replace); then
       the golden test: the golden inputs through the bundle's own generated Python loader, compared under the
       rules the tests used
Step 5's golden run needs the target's runtime and the decryption key; `--no-run` stops after the artifact
checks (what anyone holding only the public key can check). Steps 1-5 but the golden run keep memory flat
whatever the bundle's size; the golden run loads each model into ONNX Runtime through its loader.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

from ortbuild import installed, paths
from ortbuild.artifact import ed25519, golden, loaders, manifest, minisign
from ortbuild.errors import ArtifactError, GateFailed, KeyMissing, RuntimeMismatch, Tampered, from_loader
from ortbuild.gating.measure import compare
from ortbuild.project.kinds import kind_rule
from ortbuild.publish import epochs, openssf, provenance, release, release_index, tarball
from ortbuild.status import Verdict

SUMS_LINE = re.compile(r"^([0-9a-f]{64})  ([A-Za-z0-9][A-Za-z0-9._+-]{0,200})$")
MAX_SMALL = 64 << 20  # SHA256SUMS, its signature, the index and the provenance are read whole: a sane bound


@dataclass
class Verified:
    name: str
    target: str
    index: release_index.ReleaseIndex
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    model_epochs: dict[str, int] = field(default_factory=dict)  # each artifact's signed epoch, by model

    @property
    def epoch(self) -> int:
        return epochs.release_epoch(self.model_epochs)


def _read(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SMALL + 1)
        if len(data) > MAX_SMALL:
            raise ArtifactError(f"{path}: larger than {MAX_SMALL >> 20} MiB, too large for {what}",
                                "fetch the release again; never use a bundle that fails verify")
        return data
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing ({what})", "publish or pull the whole release: the bundle, its "
                            f"index and provenance, {release.SUMS} and {release.SUMS_SIG}") from None
    except OSError as e:
        raise ArtifactError(f"{path}: unreadable: {e.strerror}") from None


def release_dir(path: Path) -> Path:
    """The directory holding a release: the path itself, or the directory of a bundle/SHA256SUMS given."""
    p = Path(path)
    if p.is_dir():
        return p
    if p.exists():
        return p.parent
    raise ArtifactError(f"{p}: no such release", "give a release directory (e.g. dist/release/<target>), its "
                                                 f"{release.BUNDLE_SUFFIX} bundle, or an oci://host:port/repo:tag "
                                                 "reference")


def _trust(folder: Path, public_key: bytes | EllipticCurvePublicKey) -> tuple[bytes, openssf.Signed | None, str]:
    """Step 0: the publisher's Ed25519 public key, the verified model.sig (None: signing.pub was given) and what
    was checked."""
    path = folder / openssf.SIGNATURE
    if isinstance(public_key, bytes):
        return public_key, None, (f"{openssf.SIGNATURE}    present, not checked: the OpenSSF signature, checked "
                                  "with --public-key model-signing.pub (or `model_signing verify key`)"
                                  if path.exists() or path.is_symlink() else "")
    if not (path.exists() or path.is_symlink()):
        raise ArtifactError(f"{path}: missing: the EC public key given checks a release's OpenSSF signature "
                            f"({openssf.SIGNATURE}), and this release has none (released by an earlier ortbuild, or "
                            "not fetched whole)", "verify it with the publisher's signing.pub (--public-key "
                            "signing.pub), or fetch the whole release again")
    signed = openssf.verify(path, _read(path, "the OpenSSF model-signing bundle"), public_key)
    if signed.ed25519 is None:
        raise ArtifactError(f"{path}: verified, but it names no ortbuild signing key (made by `model_signing sign`, "
                            "not `ortbuild release`): the manifests inside cannot be checked with it",
                            "verify with the publisher's signing.pub (--public-key signing.pub)")
    return signed.ed25519, signed, (f"signature    {openssf.SIGNATURE} verified (OpenSSF model signing, EC key "
                                    f"{signed.hint[:16]}); it signs the Ed25519 key id "
                                    f"{ed25519.public_key_id(signed.ed25519)}")


def publisher_key(path: Path, public_key: bytes | EllipticCurvePublicKey) -> bytes:
    """The publisher's Ed25519 public key for the release in `path`: `public_key` itself, or for an EC key the one
    the release's model.sig (verified with it) names."""
    return _trust(release_dir(path), public_key)[0]


def _sums(folder: Path, public_key: bytes, signed: openssf.Signed | None) -> dict[str, str]:
    sums_path, sig_path = folder / release.SUMS, folder / release.SUMS_SIG
    sums = _read(sums_path, "the signed list of digests")
    sig = _read(sig_path, "the signature")
    if signed is not None:  # the files model.sig signs, and these two's digests, before either is trusted
        openssf.check_files(folder, signed, {release.SUMS: tarball.sha256(sums), release.SUMS_SIG: tarball.sha256(sig)})
    minisign.verify(sums, sig.decode(errors="replace"), public_key,
                    str(sig_path), str(sums_path), release.untrusted_comment(public_key))
    listed: dict[str, str] = {}
    for n, line in enumerate(sums.decode().splitlines(), 1):
        m = SUMS_LINE.match(line)
        if not m or m.group(2) in listed:
            raise ArtifactError(f"{sums_path}: line {n} is not '<sha256>  <file name>' (or names a file twice)")
        listed[m.group(2)] = m.group(1)
    return listed


def _provenance(path: Path, data: bytes, public_key: bytes, subjects: dict[str, str]) -> dict[str, Any]:
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    try:
        env = json.loads(data)
        body = base64.b64decode(env["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in env["signatures"]]
        statement = json.loads(body)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ArtifactError(f"{path}: not a DSSE envelope holding an in-toto statement") from None
    if env.get("payloadType") != provenance.DSSE_PAYLOAD_TYPE or \
            not any(ed25519.verify(public_key, s, openssf.pae(provenance.DSSE_PAYLOAD_TYPE, body)) for s in sigs):
        raise ArtifactError(f"{path}: its signature does not verify with the public key given (modified, or "
                            "signed by another key)")
    try:
        Statement([ResourceDescriptor(name=s["name"], digest=s["digest"]).pb for s in statement["subject"]],
                  statement["predicateType"], statement["predicate"]).validate()
        if statement["_type"] != provenance.STATEMENT_TYPE or statement["predicateType"] != provenance.PREDICATE_TYPE:
            raise ValueError("not an in-toto v1 statement of SLSA v1 provenance")
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{path}: {e}") from None
    got = {s["name"]: s["digest"].get("sha256") for s in statement["subject"]}
    if got != subjects:
        raise ArtifactError(f"{path}: its subjects {sorted(got)} do not match the released files {sorted(subjects)} "
                            "(provenance of another release)")
    pred: dict[str, Any] = statement["predicate"]
    return pred


def verify(path: Path, public_key: bytes | EllipticCurvePublicKey, *, run: bool, key: bytes | None = None,
           extract_to: Path | None = None, floors: Sequence[epochs.Floor] = ()) -> Verified:
    """Check the release in `path` (steps 0-5 above; 0 when `public_key` is an EC key: model-signing.pub);
    extract the bundle into `extract_to` (a new directory; a temporary one when None, removed afterwards). A
    release below one of `floors` is RolledBack (7). Raises ArtifactError (7), GateFailed (9), KeyMissing (8) or
    RuntimeMismatch (4), each naming the file and what to do."""
    folder = release_dir(path)
    public_key, signed, checked = _trust(folder, public_key)
    listed = _sums(folder, public_key, signed)
    sums_line = f"signature    {release.SUMS} verified ({release.SUMS_SIG}, key id {minisign.key_id(public_key).hex()})"
    lines = [checked, sums_line] if signed is not None else [sums_line, *([checked] if checked else [])]
    if signed is not None:
        openssf.check_files(folder, signed, listed)  # the three files SHA256SUMS lists: checked below against it
        if set(signed.resources) != {*listed, release.SUMS, release.SUMS_SIG}:
            raise ArtifactError(f"{folder / openssf.SIGNATURE}: signs {sorted(signed.resources)}, not the five files "
                                f"of this release", openssf.FETCH)
    kinds = {suffix: [n for n in listed if n.endswith(suffix)] for suffix in
             (release.BUNDLE_SUFFIX, release.OLD_BUNDLE_SUFFIX, f".{release.INDEX}", ".intoto.jsonl")}
    kinds = {"bundle": kinds[release.BUNDLE_SUFFIX] + kinds[release.OLD_BUNDLE_SUFFIX],
             "index": kinds[f".{release.INDEX}"], "provenance": kinds[".intoto.jsonl"]}
    if any(len(v) != 1 for v in kinds.values()) or len(listed) != 3:
        raise ArtifactError(f"{folder / release.SUMS}: lists {sorted(listed)}; a release lists one bundle, one "
                            "index and one provenance file")
    bundle, index_name, prov_name = (kinds[k][0] for k in ("bundle", "index", "provenance"))
    if not (folder / bundle).is_file():
        raise ArtifactError(f"{folder / bundle}: missing (listed in {release.SUMS})", "fetch the whole release again")
    small: dict[str, bytes] = {}
    for n in (index_name, prov_name):
        small[n] = _read(folder / n, "the index" if n == index_name else "the provenance")
        if tarball.sha256(small[n]) != listed[n]:
            raise ArtifactError(f"{folder / n}: sha256 differs from {release.SUMS} (modified or damaged)",
                                "fetch the release again; never use a bundle that fails verify")
    index_bytes = small[index_name]
    try:
        index: release_index.ReleaseIndex = json.loads(index_bytes)
        if index.get("format") != release.FORMAT:
            raise ValueError
        name = index["name"]
        files = {str(k): (int(v["size"]), str(v["sha256"])) for k, v in index["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ArtifactError(f"{folder / index_name}: not an ortbuild release index ({release.FORMAT})") from None
    expected = release.file_names(name)
    if bundle == f"{name}{release.OLD_BUNDLE_SUFFIX}":
        expected["bundle"] = bundle
    if expected != {"bundle": bundle, "index": index_name, "provenance": prov_name}:
        raise ArtifactError(f"{folder / release.SUMS}: file names do not match the release '{name}'")
    pred = _provenance(folder / prov_name, small[prov_name], public_key,
                       {bundle: listed[bundle], index_name: listed[index_name]})
    lines.append(f"provenance   {prov_name}: SLSA v1, signed, subjects match")
    warnings = []
    forced = pred["buildDefinition"]["externalParameters"].get("forced") or []
    for f in forced:
        warnings.append(f"released with --force although {f}")
    if index.get("signing", {}).get("development_key"):
        warnings.append("signed and encrypted with DEVELOPMENT keys (ortbuild keygen --dev): not for production")
    for b in pred["runDetails"].get("byproducts", []):
        status = b.get("annotations", {}).get("status")
        if status != Verdict.PASS and not forced:
            raise GateFailed(f"{folder / prov_name}: {b.get('name')} is {status}, and the release was not forced")

    # 4. the bundle, streamed member by member into a fresh directory; each member's digest and the whole file's
    # are checked on the same pass
    tmp_root = Path(tempfile.mkdtemp(prefix=".ortbuild-verify-", dir=extract_to.parent if extract_to else None))
    try:
        reader = tarball.Reader(folder / bundle, f"{name}/{release.INDEX}", index_bytes, files)
        for member, chunks in reader:
            out = paths.inside(tmp_root, *member.split("/"))
            out.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
        if reader.sha256 != listed[bundle]:
            raise ArtifactError(f"{folder / bundle}: sha256 differs from {release.SUMS} (modified outside its "
                                "members: a tar header, padding or trailing data)", "fetch the release again")
        lines.append(f"bundle       {bundle}: {len(files) + 1} files, every digest matches the signed index")
        tree = tmp_root / name
        found: dict[str, int] = {}
        for model in index["models"]:
            mfolder = paths.inside(tree, model)
            m, _ = manifest.read(mfolder)
            problems = manifest.integrity_problems(m, mfolder, public_key)
            if problems:
                raise Tampered(f"{bundle}: {name}/{model}: {problems[0]}",
                               "the bundle differs from what its publisher signed: fetch it again from the publisher")
            found[model] = m.epoch
        lines.append(f"artifacts    {', '.join(index['models'])}: manifests signed, artifact and loader digests match")
        epochs.check(name, found, floors)  # only signed epochs count, and before anything runs
        lines.append(f"epoch        {epochs.describe(found).removeprefix('epoch ')} (signed in the manifests"
                     + (f"; not below the minimum {max(f.epoch for f in floors)})" if floors else ")"))
        if run:
            lines += _golden(index, tree, key)
        else:
            lines.append("golden       not run (--no-run)")
        if extract_to is not None:
            os.replace(tree, extract_to)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    return Verified(name, index["target"], index, lines, warnings, found)


def _golden(index: release_index.ReleaseIndex, tree: Path, key: bytes | None) -> list[str]:
    how = ("run verify in an environment with that runtime (`python3 -m nox -s \"release(" + index["target"] +
           ")\"` does), or pass --no-run to check signatures and digests only")
    problem = installed.requirements_problem(index["target"], index["runtime"].split(), how)
    if problem:
        raise RuntimeMismatch(f"the golden test cannot run here: {problem}")
    if key is None:
        raise KeyMissing("the golden test needs the artifacts' decryption key (ORTBUILD_KEY or ORTBUILD_KEY_FILE, "
                         "or --key-file)", "give the key, or pass --no-run to check signatures and digests only")
    lines: list[str] = []
    failures: list[str] = []
    for model in index["models"]:
        folder = tree / model
        m, _ = manifest.read(folder)
        module = loaders.import_python_loader(loaders.python_loader_of(folder, m))
        try:
            loaded = module.load(key=key, folder=folder)
        except module.LoaderError as e:
            raise from_loader(e, f"{index['name']}/{model}") from None
        if kind_rule(m.kind).golden_tokens:  # its golden data: the artifact's greedy tokens on each prompt's ids
            lines.append(_golden_tokens(index["name"], model, folder, loaded, failures))
            continue
        rules = index["tests"][model]["rules"]
        results = []
        for ds in golden.read(folder, m.io):
            got = loaded.run(ds.inputs)
            for out in m.io["outputs"]:
                rule = rules.get(out["name"])
                if rule is None:
                    raise ArtifactError(f"{index['name']}/{release.INDEX}: no accuracy rule for {model} output "
                                        f"'{out['name']}'")
                results.append(compare.compare(out["name"], ds.name, ds.expected[out["name"]], got[out["name"]], rule))
        bad = [r for r in results if not r.passed]
        for r in bad:
            failures += compare.describe_failure(r)
        verdict = Verdict.FAIL if bad else Verdict.PASS
        lines.append(f"golden       {model}: {verdict} ({len(results)} output checks through "
                     f"the bundle's Python loader, worst {compare.worst_metric(results)})")
    if failures:
        raise GateFailed(f"{index['name']}: the golden test failed:\n  " + "\n  ".join(failures),
                         "the artifact does not reproduce its golden outputs on this machine")
    return lines


def _golden_tokens(name: str, model: str, folder: Path, loaded: Any, failures: list[str]) -> str:
    """A generative artifact's golden test: through the bundle's loader, each prompt's greedy tokens equal the
    ones its test recorded (golden/tokens.json); a failure names the prompt and the step."""
    from ortbuild.gating.measure.tokens import first_divergence

    doc = json.loads((folder / golden.GOLDEN_DIR / golden.TOKENS_JSON).read_text(encoding="utf-8"))
    bad = 0
    for p in doc["prompts"]:
        got = loaded.generate_ids(p["prompt_ids"], len(p["tokens"]))
        step = first_divergence(p["tokens"], got)  # 1-based; None: the same tokens
        if step is not None:
            bad += 1
            step -= 1
            failures.append(f"{model}: prompt {p['prompt'][:60]!r}: greedy token {step + 1} is "
                            f"{got[step] if step < len(got) else 'the end'}, the test recorded "
                            f"{p['tokens'][step] if step < len(p['tokens']) else 'the end'}")
    verdict = Verdict.FAIL if bad else Verdict.PASS
    return (f"golden       {model}: {verdict} ({len(doc['prompts'])} prompts' greedy tokens through the bundle's "
            f"Python loader{f', {bad} differ' if bad else ''})")
