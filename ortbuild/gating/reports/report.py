"""Test reports: the summary table, dist/report.json and a self-contained dist/report.html (report_html).

Each `ortbuild test` run (one per target under nox) writes dist/<target>/<model>/test-report.json; the
reports gather every such file whose artifact is still the one tested (same build key), so after
`nox -s test` they cover every target of every runtime. A job whose last build failed has no artifact to test:
its build record (dist/logs/<target>/<model>.build.json) is its row, a FAIL (build), in place of any older
test report (an earlier PASS no longer says anything about what the configuration builds now).

A report says why: each row names the gates that failed (`FAIL (size)`), and its change against a comparison:
the previous dist/report.json (kept as dist/report.previous.json) or a `--baseline` report.json. A row this
write did not measure again (another target's session under nox, `ortbuild profile`) keeps the change it had.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortbuild import errors, files, paths
from ortbuild.artifact import manifest
from ortbuild.gating import records, timing_records
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import builds, report_html
from ortbuild.gating.reports.cells import header, number, ordered, rows
from ortbuild.status import Verdict

REPORT_JSON, REPORT_HTML, REPORT_PREVIOUS = "report.json", "report.html", "report.previous.json"
def key(r: records.ResultDoc) -> str:
    return f"{r.get('target')}/{r.get('model')}"


def reproduce(target: str, model: str, config_arg: str = "targets.toml", session: str = "") -> str:
    """The command that tests one artifact again (a failure's `reproduce`); `session`: the target's nox test
    session (default test(<target>))."""
    cfg = "" if config_arg == "targets.toml" else f" -c {shlex.quote(config_arg)}"
    return f"ortbuild test{cfg} -t {target} -m {model}   (or: nox -s \"{session or f'test({target})'}\" -- -m {model})"


def build_failure_row(record: records.BuildRecord) -> records.ResultDoc:
    """The report's row of a job whose last build failed: its build record's, as `ortbuild test` says it."""
    target, model = str(record.get("target")), str(record.get("model"))
    failed = builds.failure(record)
    row = TestResult(target, model, record.get("precision", ""), status=Verdict(failed["status"]),
                     reason=failed["reason"], failures=failed["failures"], exit_code=failed["exit_code"],
                     build=failed["build"], reproduce=reproduce(target, model))
    back: records.ResultDoc = json.loads(json.dumps(row.as_json()))  # as read back from report.json (enums as str)
    return back


def collect(dist: Path) -> list[records.ResultFile]:
    """Every dist/<target>/<model>/test-report.json whose artifact is still the one it tested, and a FAIL (build)
    row for every job whose last build failed (in place of its test report: its old verdict no longer applies)."""
    failed = builds.failed(dist)
    docs: list[records.ResultFile] = [{"result": build_failure_row(r), "environment": None} for r in failed.values()]
    for doc, m in manifest.reports(dist, "test-report.json"):
        r: records.ResultDoc = doc.get("result", {})
        # a report whose artifact was rebuilt since is left out: its old verdict no longer applies; so is the
        # report of a failed build (its record is the row while the build still fails; once a build succeeds, the
        # new artifact is untested)
        if key(r) not in failed and not r.get("build") and r.get("build_key") in ("", m.build_key):
            docs.append({"result": r, "environment": doc.get("environment")})
    return sorted(docs, key=lambda d: (str(d["result"].get("target")), str(d["result"].get("model"))))  # path order


PROFILE_TOP = 10  # operators per artifact in the report (the trace and profile.json have them all)


def profiles(dist: Path) -> list[timing_records.ProfileDoc]:
    """The current profiles of dist/'s artifacts (`ortbuild profile`), with their top operators only (last) and
    the trace's path under dist/."""
    from ortbuild.gating.measure import profile

    out = []
    for doc in profile.collect(dist):
        p = doc.copy()
        del p["operators"]
        p["operators"] = doc["operators"][:PROFILE_TOP]
        p["trace"] = f"{doc['target']}/{doc['model']}/{profile.TRACE}"
        out.append(p)
    return out


# ------------------------------------------------------------------------------------------- comparison

@dataclass(frozen=True)
class Baseline:
    """A report.json to compare against (`ortbuild test --baseline FILE`)."""

    file: str
    doc: records.ReportDoc


def not_a_report(doc: object) -> str | None:
    """Why a parsed JSON document is not a dist/report.json, or None."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    if not isinstance(doc.get("results"), list):
        if isinstance(doc.get("result"), dict):
            return "it is one artifact's test-report.json, not the dist/report.json that gathers them"
        return "it has no 'results' list"
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not isinstance(r.get("target"), str) or not isinstance(r.get("model"), str):
            return f"results[{i}] names no target and model"
    return None


BASELINE_LIMIT = 1 << 30  # a report.json beyond this is not one


def read_baseline(file: str) -> Baseline:
    """The report.json `--baseline` names, or a UsageError naming the file and what is wrong with it."""
    path = Path(file)
    hint = "give a dist/report.json that `ortbuild test` wrote (e.g. the last release's)"
    if path.is_dir() and (path / REPORT_JSON).is_file():
        hint = f"did you mean {path / REPORT_JSON}?"
    problem = paths.input_problem(path, limit=BASELINE_LIMIT)
    if problem:
        raise errors.UsageError(f"--baseline {file}: {problem}", hint)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise errors.UsageError(f"--baseline {file}: cannot be read: {e.strerror or e}", hint) from None
    try:
        doc = json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise errors.UsageError(f"--baseline {file}: not a test report: not JSON ({e})", hint) from None
    problem = not_a_report(doc)
    if problem:
        raise errors.UsageError(f"--baseline {file}: not a test report: {problem}", hint)
    return Baseline(file, doc)


def _change(before: object, after: object, digits: int) -> records.Change | None:
    a, b = number(before), number(after)
    if a is None or b is None:
        return None
    return {"before": before, "after": after, "change": round(b - a, digits),
            "percent": round((b - a) / a * 100, 2) if a else None}


def delta(cur: records.ResultDoc, old: records.ResultDoc | None,
          against: records.Comparison) -> records.DeltaDoc | None:
    """One row's change against the comparison's row (`old` None: the comparison has no such row); None for a
    SKIPPED row that was SKIPPED (or absent) there too: nothing was measured, nothing changed."""
    if cur.get("status") == Verdict.SKIPPED and (old is None or old.get("status") == Verdict.SKIPPED):
        return None
    if old is None:
        return {"against": against, "new": True}
    out: records.DeltaDoc = {"against": against, "verdict": {
        "before": old.get("status"), "after": cur.get("status"), "changed": old.get("status") != cur.get("status")}}
    lat_a, lat_b = old.get("latency") or {}, cur.get("latency") or {}
    names: tuple[Literal["p50_ms", "p90_ms"], ...] = ("p50_ms", "p90_ms")
    for name in names:
        c = _change(lat_a.get(name), lat_b.get(name), 4)
        if c:
            out[name] = c
    c = _change((old.get("size") or {}).get("bytes"), (cur.get("size") or {}).get("bytes"), 0)
    if c:
        out["size_bytes"] = c
    return out


def _same(report_row: records.ResultDoc, result: records.ResultDoc) -> bool:
    """Whether a report's row is this very result (not measured again since)."""
    # (`reproduce` names the -c the run was given: a failed build's row, from its record, says it without one)
    same = {k: v for k, v in report_row.items() if k not in ("delta", "reproduce")}
    return same == {k: v for k, v in result.items() if k not in ("delta", "reproduce")}


@dataclass(frozen=True)
class Report:
    doc: records.ReportDoc       # what report.json holds
    previous: bytes | None       # the report.json it replaces (kept as report.previous.json)


def _previous(dist: Path) -> tuple[bytes, records.ReportDoc] | None:
    try:
        data = files.read_document(dist / REPORT_JSON)
        doc = json.loads(data)
    except (OSError, ValueError):
        return None
    return (data, doc) if not_a_report(doc) is None else None


def compose(dist: Path, docs: list[records.ResultFile], baseline: Baseline | None = None) -> Report:
    """The report of `docs` (collect's), each row with its change against `baseline`, else the previous report."""
    found = [d["result"] for d in docs]
    previous = _previous(dist)
    comparison: records.Comparison | None = None
    results: list[records.RowDoc]
    if baseline is not None:
        comparison = {"kind": "baseline", "file": baseline.file, "created": baseline.doc.get("created")}
        ref = {key(r): r for r in baseline.doc["results"]}
        results = [{**r, "delta": delta(r, ref.get(key(r)), comparison)} for r in found]
    elif previous is not None:
        comparison = {"kind": "previous", "file": REPORT_PREVIOUS, "created": previous[1].get("created")}
        ref = {key(r): r for r in previous[1]["results"]}
        results = [{**r, "delta": ref[key(r)].get("delta")
                    if key(r) in ref and _same(ref[key(r)], r) and r.get("status") != Verdict.SKIPPED
                    else delta(r, ref.get(key(r)), comparison)} for r in found]
    else:
        results = [{**r, "delta": None} for r in found]
    counts: dict[str, int] = {s: sum(r["status"] == s for r in results) for s in Verdict}  # PASS, FAIL, ...
    doc: records.ReportDoc = {
        "created": manifest.iso_utc(), "counts": counts, "comparison": comparison, "results": results,
        "environments": {f"{d['result']['target']}/{d['result']['model']}": d.get("environment") for d in docs},
        "profiles": profiles(dist)}
    return Report(json.loads(json.dumps(doc, default=str)), None if previous is None else previous[0])


def save(dist: Path, rep: Report) -> tuple[Path, Path]:
    """report.previous.json (the report replaced), report.json and report.html, each atomically."""
    jpath, hpath = paths.inside(dist, REPORT_JSON), paths.inside(dist, REPORT_HTML)
    if rep.previous is not None:
        files.atomic_write(paths.inside(dist, REPORT_PREVIOUS), rep.previous, root=dist)
    files.atomic_write(jpath, (json.dumps(rep.doc, indent=2) + "\n").encode(), root=dist)
    files.atomic_write(hpath, render_html(rep.doc).encode(), root=dist)
    return jpath, hpath


def write(dist: Path, docs: list[records.ResultFile], baseline: Baseline | None = None) -> tuple[Path, Path]:
    return save(dist, compose(dist, docs, baseline))


def latest(results: list[records.RowDoc], dist: Path) -> list[records.RowDoc]:
    """A report's rows as dist/ stands now: a job whose last build failed since the report was written (`ortbuild
    build`) is its FAIL (build) row, not the verdict of the older artifact (`ortbuild summary test`)."""
    failed = builds.failed(dist)
    out = [r for r in results if key(r) not in failed]
    for k, record in failed.items():
        row = build_failure_row(record)
        old = next((r for r in results if key(r) == k), None)
        out.append(old if old is not None and _same(old, row) else {**row, "delta": None})
    return sorted(out, key=lambda r: (str(r.get("target")), str(r.get("model"))))


def this_run(doc: records.ReportDoc, results: list[records.ResultDoc]) -> list[records.RowDoc]:
    """This run's results (as_json), each with the report's change for it when the report's row is this very
    result (a target another environment tests shows its own there, not this run's SKIPPED)."""
    rows_by = {key(r): r for r in doc["results"]}
    out: list[records.RowDoc] = []
    for r in results:
        mine: records.ResultDoc = json.loads(json.dumps(r, default=str))
        row = rows_by.get(key(mine))
        out.append({**mine, "delta": row.get("delta") if row is not None and _same(row, mine) else None})
    return out


def render_html(doc: records.ReportDoc) -> str:
    """The self-contained page (report_html), failures first."""
    results = ordered(doc["results"])
    return report_html.render({**doc, "results": results}, header(doc.get("comparison")),
                              rows(results, full=True, comparison=doc.get("comparison")))
