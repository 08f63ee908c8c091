"""The cells and rows of the text table of test results (`ortbuild test`, `ortbuild summary test`): one row per
artifact, its verdict cell naming the gates that failed (`FAIL (size)`), its figures and its change against the
comparison (ortbuild.gating.reports.report computes the changes)."""

from __future__ import annotations

from typing import Literal

from ortbuild import errors
from ortbuild.gating import records
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import selection
from ortbuild.status import Verdict
from ortbuild.units import human_size, signed_percent, signed_size

ORDER = (Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.PASS, Verdict.SKIPPED)  # the HTML's: failures first
# why a FAIL that no gate decided failed, by the result's exit code (errors.py)
FAILED_BY_CODE = {errors.ConfigError.exit_code: "config", errors.RuntimeMismatch.exit_code: "runtime",
                  errors.MissingProvider.exit_code: "provider", errors.StepError.exit_code: "build",
                  errors.ArtifactError.exit_code: "artifact", errors.KeyMissing.exit_code: "key"}



def number(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _ms(x: object) -> str:
    return f"{x:.3f}" if number(x) is not None else "-"


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
    return _ms(lat[name]) + (f" / {budget:g}" if number(budget) is not None else "")


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
        observed = number(v.get("observed"))
        if observed is None:
            observed = number((st.get(field) or {}).get("p50"))
        if observed is None:
            continue
        budget = number(v.get("budget"))
        parts.append(f"{_short(observed)} {unit}" + (f"/{budget:g}" if budget is not None else ""))
    return ", ".join(parts) or "-"


def _pct(c: records.Change) -> str:
    percent = c.get("percent")
    return "" if percent is None or number(percent) is None else signed_percent(percent)


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
    """The newer gates (ortbuild.gating.gates.registry), each by the summary its section carries:
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
