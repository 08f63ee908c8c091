"""`ortbuild release`: one signed, reproducible bundle per target, with SLSA provenance.

A release of target T is six files (docs/release.md):

    <project>-<version>-<T>.tar             the bundle: index, then per model the encrypted artifact, its
                                            signed manifest, both loaders and the golden data (deterministic,
                                            uncompressed: the bulk is encrypted bytes, which no compressor shrinks);
                                            for format = "ort" models, each one's signed required_operators.config
                                            and the target's own, merged from their signed manifests
    <project>-<version>-<T>.release.json    the bundle's index (the same bytes as its first member): every
                                            member's sha256 and size, and the test verdicts
    <project>-<version>-<T>.intoto.jsonl    a DSSE envelope (signed) holding an in-toto statement with SLSA v1
                                            provenance: subjects, materials, builder, the test verdicts
    SHA256SUMS, SHA256SUMS.minisig          digests of the three files above, signed in minisign's format
    model.sig                               the OpenSSF model-signing bundle over the five (ortbuild.publish.openssf)

One bundle per target, not one per model across targets: an app is deployed onto one kind of hardware,
pulls exactly that target's bundle (one OCI tag per target), and verifies it with that target's runtime.
Release refuses a model whose tests did not pass, are missing, or are older than its artifact, unless
`--force` (recorded in the index and the provenance); and an artifact below [project] epoch, whatever --force
says (ortbuild.publish.epochs).

Nothing is held whole in memory: every member is hashed once before the release (the manifest's integrity
check, or the golden data's), its digest comes from there into the index, and it is streamed into the bundle
and checked against that digest while copied; the bundle is hashed while written (ortbuild.publish.tarball).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ortbuild import __version__, files, modelfiles, paths
from ortbuild import files as files_
from ortbuild.artifact import golden, manifest, manifest_types, minisign
from ortbuild.artifact.keys import SigningKey
from ortbuild.errors import ArtifactError, GateFailed, Tampered
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import selection
from ortbuild.gating.reports.builds import last_build
from ortbuild.gating.runner import REPORT, gates_key
from ortbuild.pipeline.steps import operators as operator_config
from ortbuild.project import precisions
from ortbuild.project.config import Project, Target
from ortbuild.project.kinds import kind_rule
from ortbuild.project.settings import Gates
from ortbuild.publish import epochs, openssf, provenance, release_index, tarball
from ortbuild.status import JobStatus, Verdict

FORMAT = "ortbuild-release-v1"
SUMS, SUMS_SIG = "SHA256SUMS", "SHA256SUMS.minisig"
INDEX = "release.json"                     # the bundle's first member
BUNDLE_SUFFIX = ".tar"
OLD_BUNDLE_SUFFIX = ".tar.gz"              # the earlier format (gzip -9 over the tar): still verified


def bundle_name(project: Project, target: str) -> str:
    return f"{project.name}-{project.version}-{target}"


def file_names(name: str) -> dict[str, str]:
    return {"bundle": f"{name}{BUNDLE_SUFFIX}", "index": f"{name}.{INDEX}", "provenance": f"{name}.intoto.jsonl"}


def epoch_of(created: list[str]) -> int:
    """SOURCE_DATE_EPOCH, else the newest manifest's creation time: the same inputs give the same bundle."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        manifest.timestamp()  # says what is wrong with a malformed value
        return int(os.environ["SOURCE_DATE_EPOCH"])
    return max(int(dt.datetime.fromisoformat(c.replace("Z", "+00:00")).timestamp()) for c in created)


def iso(epoch: int) -> str:
    return manifest.iso_utc(dt.datetime.fromtimestamp(epoch, dt.UTC))


@dataclass
class ModelRelease:
    name: str
    folder: Path
    manifest: manifest_types.Manifest
    record: TestResult | None        # its test record (None: never tested)
    refusal: str | None = None
    environment: dict[str, object] = field(default_factory=dict)  # what its timings depended on (test report's)
    files: dict[str, Path] = field(default_factory=dict)  # name inside the model's folder -> file
    digests: dict[str, str] = field(default_factory=dict)  # name inside the model's folder -> its checked sha256
    source: modelfiles.ModelFiles | None = None  # the source model's files now, hashed once for the provenance


@dataclass(frozen=True)
class Published:
    target: str
    folder: Path
    files: dict[str, Path]       # bundle, index, provenance, sums, signature, model_signature
    forced: list[str]
    index: release_index.ReleaseIndex  # the index's content
    digests: dict[str, str] = field(default_factory=dict)  # sha256 by file name, as written (no file read again)


def _test_problem(folder: Path, m: manifest_types.Manifest, r: TestResult | None, target: str,
                  gates: Gates | None = None, judged_by: str | None = None) -> str | None:
    session = kind_rule(m.kind if m is not None else "onnx").session("test", target)  # e.g. test-generative(T)
    test = f"`ortbuild test -t {target}` (or `python3 -m nox -s \"{session}\"`)"
    if r is None:
        return f"never tested: run {test}"
    if r.status == Verdict.INCONCLUSIVE:
        return selection.undecided_refusal(r, target, session)
    if r.status != Verdict.PASS:
        why = r.reason or "; ".join(r.failures)
        return f"its tests did not pass ({r.status}: {why[:300]})"
    if r.quick:
        confidence = r.latency.get("confidence", 0.9)
        return f"tested with --quick (latency at {confidence:.0%} confidence): run {test}"
    if left := selection.left_out(r.judged, r.kind):  # test --gates
        return f"tested with {selection.flag(r.judged)}, its {', '.join(left)} gate(s) not judged: run {test}"
    untimed = [g for g, v in r.gates().items() if v == Verdict.SKIPPED]
    if untimed:  # an emulated platform: its budgets were never measured
        return (f"its {', '.join(untimed)} gate(s) were SKIPPED ({r.reason[:300]}): release it from a "
                f"runner of its platform (`ortbuild matrix`), where they run, or with --force")
    if missing := selection.unjudged(r, gates):
        return (f"its {', '.join(missing)} gate(s) have a budget that its last test did not judge (set since): "
                f"run {test}")
    if r.gates_key and judged_by is not None and r.gates_key != judged_by:
        return (f"its budgets, accuracy rules or evaluation set changed since its last test (they never rebuild; "
                f"its verdicts judged the old ones): run {test}")
    art = folder / m.artifact.file
    if r.build_key != m.build_key or r.artifact_sha256 != m.artifact.sha256 or \
            (folder / REPORT).stat().st_mtime < art.stat().st_mtime:
        return f"its test report is older than its artifact (rebuilt since): run {test}"
    return None


def _build_problem(dist: Path, target: str, model: str, session: str = "") -> str | None:
    """Why the artifact in dist/ is not what the configuration builds now: its last build failed (it and its test
    report are an older build's). `session`: the target's nox test session."""
    last = last_build(dist, target, model)
    if last is None or last.get("status") != JobStatus.FAILED:
        return None
    return (f"its last build failed ({str(last.get('reason', ''))[:300].rstrip(': ')}): the artifact in dist/ is an "
            f"older build's; fix the build, then run `ortbuild test -t {target}` (or `python3 -m nox -s \""
            f"{session or f'test({target})'}\"`)")


def _report(folder: Path, public_key: bytes) -> tuple[TestResult | None, dict[str, object], str | None]:
    """The test record beside an artifact (None: never tested), the environment its timings depended on, and why
    it is not trusted (None: its signature verifies with the trusted key)."""
    from ortbuild.artifact.ed25519 import verify_detached
    from ortbuild.gating.runner import REPORT_SIG

    try:
        text = files_.read_document(folder / REPORT)
    except FileNotFoundError:
        return None, {}, None
    except OSError as e:  # a FIFO or a huge file planted there: no verdict to trust
        return None, {}, f"unreadable ({e.strerror or e})"
    try:
        verified = verify_detached(text, folder / REPORT_SIG, public_key)
    except (OSError, ValueError):
        return None, {}, f"no valid signature beside it ({REPORT_SIG})"
    if not verified:
        return None, {}, f"{REPORT_SIG} does not verify it with the trusted public key"
    try:
        doc = json.loads(text)
    except ValueError:
        return None, {}, "not JSON"
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
        return None, {}, None
    env = doc.get("environment")
    try:
        return TestResult.from_json(doc["result"]), env if isinstance(env, dict) else {}, None
    except ValueError as e:
        return None, {}, f"not a test report ortbuild wrote ({e})"


def _source_changes(m: manifest_types.Manifest, now: modelfiles.ModelFiles) -> list[str]:
    """The source files whose sha256 differs from what the manifest says the artifact was built from."""
    if not m.source.files:  # built by an ortbuild that recorded only the graph file
        return [] if m.source.sha256 == now.graph.sha256 else [now.graph.path.name]
    built = {str(f["file"]): str(f["sha256"]) for f in m.source.files}
    current = {f.location or f.path.name: f.sha256 for f in now.files}
    return sorted(k for k in {*built, *current} if built.get(k) != current.get(k))


def _collect(project: Project, target: Target, dist: Path, public_key: bytes) -> list[ModelRelease]:
    out = []
    for name in target.models:
        folder = paths.inside(dist, target.name, name)
        if not (folder / manifest_types.MANIFEST).exists():
            raise ArtifactError(f"{target.name}/{name}: never built ({folder} has no manifest): nothing to release",
                                f"build and test it: `ortbuild test -t {target.name}` (or `python3 -m nox -s "
                                f"\"{target.session('test')}\"`)")
        # Tampered, naming what differs (another target's or model's directory swapped in too); nothing is released
        m = manifest.trusted(folder, public_key, place=(target.name, name))
        assert m is not None
        record, environment, unsigned = _report(folder, public_key)
        mr = ModelRelease(name, folder, m, record, environment=environment)
        gates = target.settings[name].gates
        mr.refusal = _build_problem(dist, target.name, name, target.session("test")) or _test_problem(
            folder, m, record, target.name, gates, gates_key(gates, project.models[name].eval))
        if unsigned:
            raise Tampered(f"{folder / REPORT}: {unsigned}", f"the verdicts cannot be trusted: run `ortbuild test -t "
                                                              f"{target.name}` again")
        mr.source = modelfiles.of_source(project.models[name].path, where=f"models.{name}")
        changed = _source_changes(m, mr.source)
        if changed and mr.refusal is None:  # the provenance must name what the artifact was built from
            mr.refusal = (f"its source changed since it was built ({', '.join(changed)}): rebuild and test it: "
                          f"`ortbuild test -t {target.name}`")
        # the digests the integrity check just verified each file against (the bundle's writer checks them again
        # while copying): no file is read twice before the release. The golden data is signed in the manifest.
        checked = {name: sha for name, sha, _, _ in m.signed_files()}
        for f in [manifest_types.MANIFEST, manifest.SIGNATURE, *checked]:
            mr.files[f] = paths.inside(folder, *f.split("/"))
            mr.digests[f] = checked.get(f) or files.sha256_file(mr.files[f])
        if not m.golden and mr.refusal is None:
            mr.refusal = f"it has no signed golden data ({golden.GOLDEN_DIR}/): run `ortbuild test` first"
        out.append(mr)
    # below [project] epoch: never rebuilt since it was raised, or an older signed artifact (with its older
    # loaders, which would accept it) put back: RolledBack, whatever --force says
    epochs.below_project(project, target.name, {mr.name: mr.manifest.epoch for mr in out})
    return out


def merged_operators(target: str, manifests: dict[str, manifest_types.Manifest]) \
        -> tuple[bytes, release_index.OperatorsEntry] | None:
    """The target's required_operators.config: the union of its format = "ort" models' signed operator sections
    (`manifests`: by model name, each trusted), in ONNX Runtime's format, and its index entry; None when no model
    of the target has one."""
    ops = {n: m for n, m in manifests.items() if m.operators is not None}
    older = sorted(n for n, m in manifests.items()
                   if (fmt := precisions.find_format(m.artifact.format)) is not None and fmt.operators
                   and m.operators is None)
    if older:  # built before ortbuild wrote operator configs: the target's config would miss their operators
        raise ArtifactError(f"{target}/{older[0]}: its .ort artifact has no operator config (built by an earlier "
                            "ortbuild)", f"rebuild it: `ortbuild build --force -t {target}`, then test it")
    if not ops:
        return None
    names = [f"{target}/{n}/{next(f.location for f in m.artifact.files if f.role == 'model')}" for n, m in ops.items()]
    text, typed = operator_config.merge([m.operators for m in ops.values() if m.operators is not None], names)
    data = text.encode()
    return data, {"config": operator_config.CONFIG, "sha256": tarball.sha256(data), "type_reduction": typed,
                  "models": sorted(ops)}


def untrusted_comment(public_raw: bytes) -> str:
    return f"ortbuild release signature, key id {minisign.key_id(public_raw).hex()}"


def sums_text(digests: dict[str, str]) -> bytes:
    return "".join(f"{d}  {n}\n" for n, d in sorted(digests.items())).encode()


def release_target(project: Project, target: Target, dist: Path, out: Path, sign_key: SigningKey, *,
                   force: bool, root: Path) -> Published:
    """Write target's release into `out` (files appear only when complete; an old release there is replaced),
    below `root` (dist/, or the directory given with --to) without following a symlink (files.py)."""
    started = manifest.iso_utc()
    models = _collect(project, target, dist, sign_key.public_raw)
    refused = [f"{target.name}/{mr.name}: {mr.refusal}" for mr in models if mr.refusal]
    if refused and not force:
        raise GateFailed(f"{target.name}: release refused:" + "".join(f"\n  {r}" for r in refused),
                         "test the target until it passes; `--force` releases anyway and records why in the "
                         "bundle and its provenance")
    name = bundle_name(project, target.name)
    names = file_names(name)
    epoch = epoch_of([mr.manifest.created for mr in models])
    members: dict[str, bytes | Path] = {}
    digests: dict[str, str] = {}
    for mr in models:
        for rel, p in mr.files.items():
            members[f"{name}/{mr.name}/{rel}"] = p
            digests[f"{name}/{mr.name}/{rel}"] = mr.digests[rel]
    operators = merged_operators(target.name, {mr.name: mr.manifest for mr in models})
    if operators is not None:  # format = "ort": the one config a reduced ONNX Runtime build for the target takes
        members[f"{name}/{operator_config.CONFIG}"] = operators[0]
        digests[f"{name}/{operator_config.CONFIG}"] = operators[1]["sha256"]
    index: release_index.ReleaseIndex = {
        "format": FORMAT, "name": name, "target": target.name, "description": target.description,
        "project": {"name": project.name, "version": project.version}, "runtime": target.runtime_text,
        "providers": models[0].manifest.providers, "models": [mr.name for mr in models], "created": iso(epoch),
        "files": {k: {"sha256": digests[k], "size": v.stat().st_size if isinstance(v, Path) else len(v)}
                  for k, v in sorted(members.items())},
        "tests": {mr.name: release_index.verdicts(mr.record, mr.refusal) for mr in models},
        "forced": refused,
        "signing": {"algorithm": "Ed25519", "public_key_id": sign_key.key_id,
                    "development_key": sign_key.development or models[0].manifest.signing.development_key},
        "ortbuild": __version__,
    }
    if operators is not None:
        index["operators"] = operators[1]
    index_bytes = provenance.canonical(index)
    tmp = files_.partial_file(out / names["bundle"], root)
    try:
        bundle_digest = tarball.write(tmp, {f"{name}/{INDEX}": index_bytes, **members}, epoch,
                                      first=f"{name}/{INDEX}", digests=digests)
        subjects = {names["bundle"]: bundle_digest, names["index"]: tarball.sha256(index_bytes)}
        statement = provenance.statement(project, target, models, subjects, started, refused)
        prov = provenance.envelope(statement, sign_key)
        signed = {**subjects, names["provenance"]: tarball.sha256(prov)}
        sums = sums_text(signed)
        sig = minisign.sign(sums, sign_key.sign, sign_key.public_raw,
                            trusted_comment=f"timestamp:{epoch}\tfile:{SUMS}\tortbuild release {name}",
                            untrusted_comment=untrusted_comment(sign_key.public_raw))
        # the bundle last-but-one, the signature last: a reader never pairs a new bundle with an old signature
        for f in (openssf.SIGNATURE, SUMS_SIG, SUMS):
            (out / f).unlink(missing_ok=True)
        # published files: readable by anyone (they hold no secret)
        files_.atomic_write(out / names["index"], index_bytes, root=root, mode=0o644)
        files_.atomic_write(out / names["provenance"], prov, root=root, mode=0o644)
        os.chmod(tmp, 0o644)
        files_.publish(tmp, out / names["bundle"], root)
        files_.atomic_write(out / SUMS, sums, root=root, mode=0o644)
        files_.atomic_write(out / SUMS_SIG, sig.encode(), root=root, mode=0o644)
        signed.update({SUMS: tarball.sha256(sums), SUMS_SIG: tarball.sha256(sig.encode())})  # no file read again
        files_.atomic_write(out / openssf.SIGNATURE, openssf.sign(out.name, signed, sign_key), root=root, mode=0o644)
    finally:
        tmp.unlink(missing_ok=True)
    files = {"bundle": out / names["bundle"], "index": out / names["index"], "provenance": out / names["provenance"],
             "sums": out / SUMS, "signature": out / SUMS_SIG, "model_signature": out / openssf.SIGNATURE}
    return Published(target.name, out, files, refused, index, signed)
