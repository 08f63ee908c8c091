"""The SLSA v1 provenance of a release (docs/release.md): an in-toto statement whose subjects are the bundle and
its index, whose materials are targets.toml and every source, golden and calibration file the release's models were
built from, and whose byproducts are the test verdicts; signed as a DSSE envelope (`*.intoto.jsonl`). `canonical`:
the exact bytes of a signed JSON document (the index, the statement).
"""

from __future__ import annotations

import base64
import json
import os
import platform
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ortbuild import __version__, files, modelfiles
from ortbuild.artifact import manifest, manifest_types
from ortbuild.artifact.keys import SigningKey
from ortbuild.gating.record import TestResult
from ortbuild.gating.runner import REPORT
from ortbuild.project import precisions
from ortbuild.project.config import Project, Target
from ortbuild.publish import release_index
from ortbuild.publish.openssf import pae

STATEMENT_TYPE, PREDICATE_TYPE = "https://in-toto.io/Statement/v1", "https://slsa.dev/provenance/v1"
DSSE_PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://github.com/ortbuild/ortbuild/blob/main/docs/release.md#provenance-v1"


class Released(Protocol):
    """What the provenance reads of one model of the release (ortbuild.publish.release.ModelRelease)."""

    name: str
    folder: Path
    manifest: manifest_types.Manifest
    record: TestResult | None        # its test record (None: never tested)
    refusal: str | None              # why release refused it (forced)
    environment: dict[str, object]   # what its timings depended on
    source: modelfiles.ModelFiles | None  # the source model's files, hashed once (None: hash them here)


def canonical(doc: object) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def file_digest(path: Path) -> dict[str, str]:
    return {"sha256": files.sha256_file(path)}


def materials(project: Project, target: Target, models: Sequence[Released]) -> list[release_index.Material]:
    root = project.root

    def rel(p: Path) -> str:
        try:
            return str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            return str(p)

    seen: dict[str, release_index.Material] = {}

    def record(f: Path, role: str, digest: str | None = None, **annotations: str) -> None:
        if rel(f) not in seen:
            seen[rel(f)] = {"name": rel(f), "uri": f"file:{rel(f)}",
                            "digest": {"sha256": digest} if digest else file_digest(f),
                            "annotations": {"role": role, **annotations}}

    def add(p: Path, role: str) -> None:
        for f in sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]:
            record(f, role)

    add(project.file, "config")
    for mr in models:
        model = project.models[mr.name]
        # the graph file and every external-data (weights) file it names, each hashed once, streaming
        source = mr.source or modelfiles.of_source(model.path, where=f"models.{mr.name}")
        record(source.graph.path, "source model", source.graph.sha256)
        for data in source.external:
            record(data.path, "source model external data", data.sha256, location=data.location,
                   model=rel(source.graph.path))
        add(model.inputs, "golden inputs")
        if model.expected is not None:
            add(model.expected, "golden outputs")
        if model.calibration is not None and precisions.rule(mr.manifest.precision.name).needs_calibration:
            add(model.calibration, "calibration data")
    return [seen[k] for k in sorted(seen)]


def statement(project: Project, target: Target, models: Sequence[Released], subjects: dict[str, str],
              started: str, forced: list[str]) -> release_index.ProvenanceStatement:
    """The in-toto statement of a release: SLSA v1 provenance over `subjects` (file name -> sha256), checked against
    the SLSA schema; `forced`: what --force released anyway."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    m0 = models[0].manifest
    versions = m0.versions
    ci = os.environ.get("GITHUB_ACTIONS") == "true"
    run_url = (f"{os.environ.get('GITHUB_SERVER_URL', '')}/{os.environ.get('GITHUB_REPOSITORY', '')}/actions/runs/"
               f"{os.environ.get('GITHUB_RUN_ID', '')}") if ci else ""
    byproducts = []
    for mr in models:
        r = mr.record if mr.record is not None else TestResult(mr.name, mr.name, "")  # never tested: all "-"
        lat = r.latency
        report_file = mr.folder / REPORT
        annotations: dict[str, object] = {
            "status": str(r.status) if mr.record is not None else "UNTESTED", "accuracy": str(r.accuracy),
            "worst": r.worst, "latency": str(r.latency_verdict), "size": str(r.size_verdict),
            **{k: lat[k] for k in ("p50_ms", "p90_ms", "p99_ms", "samples") if k in lat},
            **{name: str(s.get("verdict", "-")) for name, s in r.sections.items()}}
        byproducts.append({
            "name": f"test-report/{mr.name}", "mediaType": "application/json",
            **({"digest": file_digest(report_file)} if report_file.exists() else {}),
            "annotations": {**annotations,
                            "environment": mr.environment,
                            **({"forced": mr.refusal} if mr.refusal else {})}})
    predicate: dict[str, object] = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {"target": target.name, "config": project.file.name, "models": list(target.models),
                                   "project": {"name": project.name, "version": project.version},
                                   "force": bool(forced), "forced": forced},
            "internalParameters": {"runtime": target.runtime_text, "precision": {mr.name: mr.manifest.precision.name
                                                                            for mr in models},
                                   "providers": m0.providers,
                                   "build_keys": {mr.name: mr.manifest.build_key for mr in models},
                                   "encryption_key_id": m0.encryption.key_id if m0.encryption else None,
                                   "development_key": m0.signing.development_key},
            "resolvedDependencies": materials(project, target, models),
        },
        "runDetails": {
            "builder": {"id": run_url or f"https://github.com/ortbuild/ortbuild/local@{platform.node() or 'host'}",
                        "version": {"ortbuild": __version__, "onnx": str(versions.get("onnx")),
                                    "onnxruntime": json.dumps(versions.get("onnxruntime"), sort_keys=True),
                                    "python": platform.python_version()}},
            "metadata": {"invocationId": os.environ.get("GITHUB_RUN_ID") or str(uuid.uuid4()),
                         "startedOn": started, "finishedOn": manifest.iso_utc()},
            "byproducts": byproducts,
        },
    }
    json_format.ParseDict(predicate, provenance_pb2.Provenance())  # the SLSA v1 schema: a typo'd field fails here
    subject: list[release_index.Subject] = [{"name": n, "digest": {"sha256": d}} for n, d in sorted(subjects.items())]
    out: release_index.ProvenanceStatement = {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE,
                                              "predicate": predicate, "subject": subject}
    Statement([ResourceDescriptor(name=s["name"], digest=s["digest"]).pb for s in subject],
              PREDICATE_TYPE, predicate).validate()
    return out


def envelope(statement: release_index.ProvenanceStatement, sign_key: SigningKey) -> bytes:
    """The statement as a DSSE envelope signed by the release's signing key (the `*.intoto.jsonl` file)."""
    body = canonical(statement)
    sig = sign_key.sign(pae(DSSE_PAYLOAD_TYPE, body))
    env = {"payloadType": DSSE_PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
           "signatures": [{"keyid": sign_key.key_id, "sig": base64.b64encode(sig).decode()}]}
    return (json.dumps(env, sort_keys=True) + "\n").encode()
