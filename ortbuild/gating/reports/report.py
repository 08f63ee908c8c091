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
from ortbuild.gating.reports import builds, report_html, selection
from ortbuild.status import Verdict
from ortbuild.units import human_size, signed_percent, signed_size

REPORT_JSON, REPORT_HTML, REPORT_PREVIOUS = "report.json", "report.html", "report.previous.json"
ORDER = (Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.PASS, Verdict.SKIPPED)  # the HTML's: failures first
# why a FAIL that no gate decided failed, by the result's exit code (errors.py)
FAILED_BY_CODE = {errors.ConfigError.exit_code: "config", errors.RuntimeMismatch.exit_code: "runtime",
                  errors.MissingProvider.exit_code: "provider", errors.StepError.exit_code: "build",
                  errors.ArtifactError.exit_code: "artifact", errors.KeyMissing.exit_code: "key"}


def key(r: records.ResultDoc) -> str:
    return f"{r.get('target')}/{r.get('model')}"


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _ms(x: object) -> str:
    return f"{x:.3f}" if _num(x) is not None else "-"


# ------------------------------------------------------------------------------------------- why: the gates

def failure_kind(r: TestResult) -> str:
    """Why a FAIL failed when no gate did: a required target that cannot run here, the error's kind (`artifact`:
    a TAMPERED artifact, whether its build or its test found it), else its build, else an error."""
    if any(x.startswith("required, but cannot run here") for x in r.failures):
        return "required"
    fallback = "build" if r.reason.startswith("build failed") else "error"
    return FAILED_BY_CODE.get(r.exit_code, fallback)


def verdict_cell(r: TestResult) -> str:
    """`FAIL (size)`, `FAIL (accuracy, cold_start)`, `FAIL (build)`, `INCONCLUSIVE (latency)`, `PASS`; a test
    that judged some gates only says which: `PASS (--gates accuracy)`."""
    status = str(r.status)
    why: list[str] = []
    if status == Verdict.FAIL:
        why = r.failed_gates() or [failure_kind(r)]
    elif status == Verdict.INCONCLUSIVE:
        why = [name for name, v in r.gates().items() if v == Verdict.INCONCLUSIVE]
    said = [", ".join(why)] if why else []
    if selection.left_out(r.judged, r.kind) and status != Verdict.SKIPPED:
        said.append(selection.flag(r.judged))
    return status + (f" ({'; '.join(said)})" if said else "")


def ordered(results: list[records.RowDoc]) -> list[records.RowDoc]:
    """FAIL first, then INCONCLUSIVE, PASS, SKIPPED (stable: path order within each)."""
    rank = {str(v): i for i, v in enumerate(ORDER)}
    return sorted(results, key=lambda r: rank.get(str(r.get("status")), len(ORDER)))


# ------------------------------------------------------------------------------------------- table cells

def _latency_cell(r: TestResult, name: Literal["p50_ms", "p90_ms", "p99_ms"]) -> str:
    lat = r.latency
    if name not in lat:  # a gate SKIPPED on its own (an emulated platform's timing) says so
        return Verdict.SKIPPED.lower() if r.latency_verdict == Verdict.SKIPPED and name == "p50_ms" else "-"
    budget = next((v.get("budget") for v in lat.get("verdicts") or []
                   if v.get("kind") == name.removesuffix("_ms")), None)
    return _ms(lat[name]) + (f" / {budget:g}" if _num(budget) is not None else "")


def _short(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


STARTUP: tuple[tuple[str, Literal["cold_start_ms", "peak_rss_mb"], str], ...] = (
    ("cold_start", "cold_start_ms", "ms"), ("memory", "peak_rss_mb", "MB"))


def startup_cell(r: TestResult) -> str:
    """Cold start and peak memory against their budgets: `812 ms/1000, 95 MB/256`, or `-`."""
    st = r.startup
    if not st:
        return "-"
    verdicts = {v.get("kind"): v for v in st.get("verdicts") or [] if isinstance(v, dict)}
    parts = []
    for kind, field, unit in STARTUP:
        v = verdicts.get(kind, {})
        observed = _num(v.get("observed"))
        if observed is None:
            observed = _num((st.get(field) or {}).get("p50"))
        if observed is None:
            continue
        budget = _num(v.get("budget"))
        parts.append(f"{_short(observed)} {unit}" + (f"/{budget:g}" if budget is not None else ""))
    return ", ".join(parts) or "-"


def _pct(c: records.Change) -> str:
    percent = c.get("percent")
    return "" if percent is None or _num(percent) is None else signed_percent(percent)


def delta_cell(d: records.DeltaDoc | None, full: bool = False, comparison: records.Comparison | None = None) -> str:
    """A row's change against the comparison: compact (`PASS->FAIL, p90 +12%`: the verdict when it changed, p90
    (else p50), the size when it changed) or full (the HTML's: both percentiles and the size, absolute and %, and
    the report compared with when it is not the report's `comparison`: a row not measured again keeps its own)."""
    if not d:
        return "-"
    if d.get("new"):
        return "new (not in the comparison)" if full else "new"
    parts = []
    v = d.get("verdict")
    if v is not None and v.get("before") != v.get("after"):
        parts.append(f"{v.get('before')} -> {v.get('after')}" if full else f"{v.get('before')}->{v.get('after')}")
    shown: list[Literal["p50_ms", "p90_ms"]] = ["p50_ms", "p90_ms"] if full else [
        "p90_ms" if d.get("p90_ms") else "p50_ms"]
    for name in shown:
        c = d.get(name)
        if c:
            label = name.removesuffix("_ms")
            ms = f"{c['change']:+.3f} ms"
            parts.append(f"{label} {ms} ({_pct(c) or 'from 0'})" if full else f"{label} {_pct(c) or ms}")
    s = d.get("size_bytes")
    if s and full:
        parts.append(f"size {signed_size(s['change'])}" + (f" ({_pct(s)})" if _pct(s) else "") if s.get("change")
                     else "size unchanged")
    elif s and s.get("change"):
        parts.append(f"size {_pct(s) or signed_size(s['change'])}")
    text = ("; " if full else ", ").join(parts) or "="
    against = d.get("against")
    if full and against and against.get("created") and against != comparison:
        text += f" (vs the {against.get('kind', 'previous')} report of {against['created']})"
    return text


def rows(results: list[records.RowDoc], full: bool = False,
         comparison: records.Comparison | None = None) -> list[list[str]]:
    """One row per result, HEADER's columns (the verdict last: the HTML colours it)."""
    out = []
    for row in results:
        r = TestResult.from_json(row)
        size = r.size
        rel = r.latency.get("relative")
        size_cell = (f"{human_size(size['bytes'])} {size['ratio']:.2f}x/{size['max_ratio']:g}"
                     if size.get("bytes") is not None and "ratio" in size else "-")
        worst = r.worst
        out.append([r.target, r.model, size_cell, str(r.accuracy) + (f" ({worst})" if worst not in ("-", "") else ""),
                    _latency_cell(r, "p50_ms"), _latency_cell(r, "p90_ms"), _latency_cell(r, "p99_ms"),
                    (f"{rel['observed_ratio']:.2f}x/{rel['ratio']:g} {rel['target']}" if rel and "observed_ratio" in rel
                     else ("-" if not rel else Verdict.SKIPPED)),
                    startup_cell(r), gates_cell(r), delta_cell(row.get("delta"), full, comparison), verdict_cell(r)])
    return out


def gates_cell(r: TestResult) -> str:
    """The newer gates (ortbuild.gating.gates.catalog), each by the summary its section carries:
    `throughput 812/s >= 500; eval -0.4 pt`, or `-`."""
    said = [f"{name} {s.get('summary') or s.get('verdict', '-')}" for name, s in r.sections.items()]
    return "; ".join(said) or "-"


HEADER = ["target", "model", "size (vs src/max)", "accuracy (worst)", "p50 ms/budget", "p90", "p99",
          "relative", "startup", "more gates", "vs previous", "verdict"]
OPTIONAL = ("startup", "more gates", "vs previous")  # left out of the text table when no row has anything in it


def header(comparison: records.Comparison | None) -> list[str]:
    kind = comparison.get("kind", "previous") if comparison else "previous"
    return [f"vs {kind}" if h == "vs previous" else h for h in HEADER]


def text_table(results: list[records.RowDoc],
               comparison: records.Comparison | None) -> tuple[list[str], list[list[str]]]:
    """The `ortbuild test` summary: HEADER's columns, less the optional ones no row has anything in."""
    body = rows(results)
    # nothing to compare: no previous run, or every row new since it (the first `nox -s test`: each target's
    # session finds only the targets before it); a baseline given on the command line is always shown
    kind = comparison.get("kind", "previous") if comparison else "previous"
    empty = {"-", "new"} if kind == "previous" else {"-"}
    keep = [i for i, h in enumerate(HEADER) if h not in OPTIONAL or any(r[i] not in empty for r in body)]
    head = header(comparison)
    return [head[i] for i in keep], [[r[i] for i in keep] for r in body]


# ------------------------------------------------------------------------------------------- gathering

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
    a, b = _num(before), _num(after)
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
