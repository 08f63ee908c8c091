"""`ortbuild summary build|test` (cli/__init__ runs it): one table of every target's last build or test results
in dist/, read from what each run recorded there (dist/logs/<target>/<model>.build.json, dist/report.json),
whichever environment ran it. The last session of `nox -s build` / `nox -s test` prints it, so one table ends the run.

Light on purpose (stdlib, packaging): the noxfile calls `print_summary` in nox's own interpreter, which has
none of ortbuild's dependencies."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ortbuild import files, logs
from ortbuild.errors import SUMMARY_FAILED, GateFailed
from ortbuild.gating.record import TestResult
from ortbuild.gating.records import BuildRecord
from ortbuild.gating.reports import cells, report
from ortbuild.gating.reports.builds import record_path
from ortbuild.project import config
from ortbuild.status import JobStatus, Verdict
from ortbuild.units import human_size


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain text table: left-aligned columns, a dashed rule under the header."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*r) for r in rows)])


def build_rows(project: config.Project, docs: Sequence[BuildRecord]) -> list[list[str]]:
    """The build table's rows, from JobResult.as_json() documents; time: the job's, and its slowest step's."""
    rows = []
    for r in docs:
        size, source = r.get("size"), r.get("source_size")
        ratio = f"{size / source:.2f}x" if size and source else "-"
        level = r.get("level") or "-"
        t = project.targets.get(r["target"])
        requested = t.settings[r["model"]].optimization if t is not None and r["model"] in t.settings else ""
        if r.get("level") and requested and r["level"] != requested:
            level = f"{r['level']} (asked {requested})"
        converted = f"{r['converted']:.0%}" if r.get("converted") is not None else "-"
        steps = r.get("steps") or {}
        slowest = max(steps, key=steps.__getitem__) if steps else None
        took = f"{r.get('seconds', 0.0):.1f}s"
        if slowest is not None and steps[slowest] >= 0.1:
            took += f" ({slowest} {steps[slowest]:.1f}s)"
        rows.append([r["target"], r["model"], str(r["status"]).upper(), r.get("precision") or "-", converted, level,
                     human_size(r.get("size")), ratio, took])
    return rows


def grouped(said: dict[str, list[tuple[str, str]]], jobs_of: Counter[str]) -> list[str]:
    """Each reason or note once, with the (target, model) jobs it concerns: `target/*` for all the models of a
    target (`jobs_of`: how many jobs each target has)."""
    lines = []
    for text, who in said.items():
        shown = []
        for t, n in Counter(t for t, _ in who).items():
            shown += [f"{t}/*"] if n == jobs_of[t] > 1 else [f"{t}/{m}" for tt, m in who if tt == t]
        lines.append(f"  [{', '.join(shown)}] {text}")
    return lines


BUILD_HEADER = ["target", "model", "status", "precision", "converted", "level", "size", "vs src",
                "time (slowest step)"]


def _records(project: config.Project, dist: Path) -> list[BuildRecord]:
    out = []
    for t in project.targets.values():
        for m in t.models:
            path = record_path(dist, t.name, m)
            try:
                doc = json.loads(files.read_document(path))
            except (OSError, ValueError):
                continue
            is_record = isinstance(doc, dict) and doc.get("target") == t.name and doc.get("model") == m
            if is_record:
                out.append(doc)
    return out


def print_build(project: config.Project, dist: Path, out: TextIO) -> int:
    docs = _records(project, dist)
    if not docs:
        print(f"no build recorded in {dist}", file=out)
        return 0
    print(f"\nbuild summary, every target ({dist}):", file=out)
    print(table(build_rows(project, docs), BUILD_HEADER), file=out)
    said: dict[str, list[tuple[str, str]]] = {}
    for d in docs:
        if d["status"] in (JobStatus.PORTABLE, JobStatus.FAILED) and d.get("reason"):
            said.setdefault(f"{str(d['status']).upper()}: {d['reason']}", []).append((d["target"], d["model"]))
    for line in grouped(said, Counter(d["target"] for d in docs)):
        print(line, file=out)
    counts = {s: sum(d["status"] == s for d in docs) for s in JobStatus}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n), file=out)
    logged = [(f"{d['target']}/{d['model']}", logs.Captured(Path(log["path"]), log["lines"], log["warnings"]))
              for d in docs if (log := d.get("log"))]
    for line in logs.footer(logged):
        print(line, file=out)
    return SUMMARY_FAILED if counts[JobStatus.FAILED] else 0


def verdict_counts(statuses: Sequence[str], json_path: Path, html_path: Path) -> str:
    """The test table's last line: how many of each verdict, and where the reports are."""
    n = Counter(statuses)
    return ", ".join(f"{n[s]} {s}" for s in Verdict) + f"  ->  {json_path}, {html_path}"


def warning_lines(results: Sequence[TestResult]) -> list[str]:
    """The warnings of test results (golden outputs that test almost nothing; an artifact measured slower than
    the one it derives from, ortbuild.gating.measure.speed), one line each."""
    return [f"  [{r.target}/{r.model}] warning: {w}" for r in results
            for w in [*r.golden.get("warnings", []), *(x["message"] for x in r.speed)]]


def print_test(dist: Path, out: TextIO) -> int:
    path = dist / report.REPORT_JSON
    try:
        doc = json.loads(files.read_document(path))
    except (OSError, ValueError):
        print(f"no test report in {dist}", file=out)
        return 0
    results = cells.ordered(report.latest(doc.get("results", []), dist))
    try:
        head, body = cells.text_table(results, doc.get("comparison"))
        records = [TestResult.from_json(r) for r in results]
    except ValueError as e:
        print(f"{path}: not a test report that ortbuild wrote ({e}): run `ortbuild test` again", file=out)
        return GateFailed.exit_code
    print(f"\ntest summary, every target ({path}):", file=out)
    print(table(body, head), file=out)
    for r in records:
        if r.status in (Verdict.FAIL, Verdict.INCONCLUSIVE) and r.reason:
            print(f"  [{r.target}/{r.model}] {r.status}: {r.reason}", file=out)
    for line in warning_lines(records):
        print(line, file=out)
    print(verdict_counts([r.status for r in records], path, dist / report.REPORT_HTML), file=out)
    # a failed gate: the exit code `ortbuild test` gave (9), never 1 (an internal error)
    return GateFailed.exit_code if any(r.status == Verdict.FAIL for r in records) else 0


def print_summary(what: str, config_file: str | Path, dist: str | Path | None = None,
                  out: TextIO | None = None) -> int:
    """Print the summary of `what` ("build" or "test"); 1 where a job failed, else 0."""
    project = config.load(config_file, check_files=False)
    where = Path(dist) if dist else project.root / "dist"
    stream = out or sys.stdout
    return print_build(project, where, stream) if what == "build" else print_test(where, stream)
