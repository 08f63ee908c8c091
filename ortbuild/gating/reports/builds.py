"""The build records (dist/logs/<target>/<model>.build.json: JobResult.as_json() of each job's last build, written
by every command that builds) as the test reports read them: a job whose last build failed has no artifact to test,
and its record says why (report.collect makes it a FAIL (build) row; release refuses the older artifact still in
dist/). Light (stdlib): the noxfile's summary reads them."""

from __future__ import annotations

import json
from pathlib import Path

from ortbuild import errors, files, logs
from ortbuild.gating.records import BuildFailure, BuildRecord
from ortbuild.status import JobStatus, Verdict


def record_path(dist: Path, target: str, model: str) -> Path:
    """Where the last build of a job is recorded (JobResult.as_json(): its status, step times and log): dist/logs/."""
    return logs.log_path(dist, target, model, "build").with_suffix(".json")


def _record(f: Path) -> BuildRecord | None:
    try:
        doc = json.loads(files.read_document(f))
    except (OSError, ValueError):
        return None
    is_record = isinstance(doc, dict) and f.name == f"{doc.get('model')}.build.json" and \
        f.parent.name == doc.get("target")
    return doc if is_record else None


def last_build(dist: Path, target: str, model: str) -> BuildRecord | None:
    """The record of a job's last build (None: none recorded, or unreadable)."""
    return _record(record_path(dist, target, model))


def failed(dist: Path) -> dict[str, BuildRecord]:
    """The record of every job whose last build failed (`target/model` -> it), whichever environment built it."""
    found = (_record(f) for f in sorted((dist / logs.LOG_DIR).glob("*/*.build.json")))
    return {f"{r['target']}/{r['model']}": r for r in found if r is not None and r.get("status") == JobStatus.FAILED}


def failure(record: BuildRecord) -> BuildFailure:
    """What a test result says of a job whose build failed, from the build's record (JobResult.as_json()): FAIL,
    the reason (the step's error), the failure lines (with the error's hint and the build log), the error's exit
    code, and `build` (the step that failed and its log). `ortbuild test`'s result and the report's row both say
    this."""
    reason = f"build failed: {record.get('reason', '')}"
    log = (record.get("log") or {}).get("path")
    code = (record.get("error") or {}).get("exit_code")
    hint = (record.get("error") or {}).get("hint")
    return {"status": Verdict.FAIL, "reason": reason,
            "failures": [reason, *([f"hint: {hint}"] if hint else []), *([f"build log: {log}"] if log else [])],
            "exit_code": code if isinstance(code, int) and code else errors.StepError.exit_code,
            "build": {"status": JobStatus.FAILED, "step": record.get("step", ""), "log": log}}
