"""dist/report.html: one self-contained page (inline CSS and SVG, no script, nothing fetched), readable offline.

The summary table (failures first, each row linking to its artifact's section), then a section per artifact:
why it failed, accuracy checks, size, latency (a histogram per data set whose axis fits the samples), startup
(cold start and peak memory), the precision search, and the profiles. report.py gives the rows; this module
imports nothing of it.
"""

from __future__ import annotations

import html
from typing import Literal

from ortbuild.gating.gates import registry
from ortbuild.gating.record import TestResult, doc_kind
from ortbuild.gating.records import Comparison, ExplainDoc, ReportDoc, RowDoc
from ortbuild.gating.reports import selection
from ortbuild.gating.timing_records import DataSetLatency, ProfileDoc
from ortbuild.status import Verdict
from ortbuild.units import human_size

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.PASS{background:#d9f2d9}.FAIL{background:#f8d0d0}.INCONCLUSIVE{background:#fbefc5}
.SKIPPED{background:#e6e6e6}pre{background:#f7f7f7;padding:8px;white-space:pre-wrap}
section{border-top:2px solid #ddd;margin-top:20px;padding-top:8px}.warning{background:#fbefc5;padding:4px 8px}
"""
e = html.escape


def _verdict(passed: bool) -> Verdict:
    return Verdict.PASS if passed else Verdict.FAIL


def _ms(x: object) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


# ------------------------------------------------------------------------------------------- the histogram

# the percentiles marked on the histogram, and their colours
PERCENTILES: tuple[tuple[Literal["p50_ms", "p90_ms", "p99_ms"], str], ...] = (
    ("p50_ms", "#222"), ("p90_ms", "#555"), ("p99_ms", "#888"))
CHAR_W, GAP, LINE = 6.2, 6.0, 12  # px per character of a 10px label (generous), between labels, per label line


def _axis_ms(v: float) -> str:
    return f"{v:.0f}" if v >= 1000 else f"{v:.4g}"


def _lanes(labels: list[tuple[float, str, str]], width: float) -> list[tuple[float, float, str, str, int]]:
    """(x, text, anchor) labels -> (left, right, text, anchor, lane): each kept inside 0..width, and placed on the
    first line (lane) where it overlaps no label already there."""
    out = []
    ends: list[float] = []
    placed = []
    for x, text, anchor in labels:
        w = len(text) * CHAR_W
        left = x if anchor == "start" else x - w
        if left + w > width:                     # would run off the right edge: end it at the line instead
            left, anchor = min(x, width) - w, "end"
        if left < 0:
            left, anchor = max(x, 0.0), "start"
        placed.append((left, left + w, text, anchor))
    for left, right, text, anchor in sorted(placed):
        lane = next((i for i, end in enumerate(ends) if left >= end + GAP), len(ends))
        if lane == len(ends):
            ends.append(right)
        ends[lane] = right
        out.append((left, right, text, anchor, lane))
    return out


def _text(left: float, right: float, text: str, anchor: str, y: float, cls: str, color: str = "#222") -> str:
    x = left if anchor == "start" else right
    return (f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="10" fill="{color}" '
            f'data-w="{right - left:.1f}">{e(text)}</text>')


def histogram(lat: DataSetLatency) -> str:
    """The samples' distribution on an axis from their min to their max (5% margin), the percentiles, and each
    budget: a line where it falls inside, else a marker at the edge it lies beyond, labelled with its value."""
    xs = [float(x) for x in lat.get("samples_ms") or [] if _num(x) is not None]
    if not xs:
        return ""
    budgets = {str(v.get("kind")): float(v["budget"]) for v in lat.get("verdicts") or []
               if isinstance(v, dict) and _num(v.get("budget")) is not None}
    span = max(xs) - min(xs)
    margin = span * 0.05 if span > 0 else max(abs(xs[0]) * 0.05, 1e-6)
    lo, hi = max(0.0, min(xs) - margin), max(xs) + margin
    w, pad, bars_h, bins = 640, 30, 110, 40
    counts = [0] * bins
    for x in xs:
        counts[min(bins - 1, max(0, int((x - lo) / (hi - lo) * bins)))] += 1

    def xpos(v: float) -> float:
        return float(pad + (v - lo) / (hi - lo) * (w - 2 * pad))

    marks = [(key[:-3], float(lat[key]), color) for key, color in PERCENTILES if _num(lat.get(key)) is not None]
    top_labels = _lanes([(xpos(v) + 2, name, "start") for name, v, _ in marks], w)
    budget_labels = []
    for kind, b in budgets.items():
        text = f"{kind} budget {b:g} ms"
        if b > hi:
            budget_labels.append((float(w - pad), "\u25b6 " + text, "end"))
        elif b < lo:
            budget_labels.append((float(pad), "\u25c0 " + text, "start"))
        else:
            budget_labels.append((xpos(b) + 2, text, "start"))
    bottom_labels = _lanes(budget_labels, w)
    top_lanes = 1 + max((lane for *_, lane in top_labels), default=0)
    bottom_lanes = 1 + max((lane for *_, lane in bottom_labels), default=-1)
    y_top = 6 + top_lanes * LINE          # the plot's top; percentile labels above it
    y0 = y_top + bars_h                   # the axis
    height = y0 + 16 + bottom_lanes * LINE + 6
    parts = [f'<svg class="histogram" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" role="img" '
             f'aria-label="latency distribution" data-lo="{lo:.6g}" data-hi="{hi:.6g}">',
             f'<rect x="0" y="0" width="{w}" height="{height}" fill="#fff"/>']
    top = max(counts)
    bw = (w - 2 * pad) / bins
    for i, c in enumerate(counts):
        bh = bars_h * c / top
        parts.append(f'<rect class="bar" x="{pad + i * bw:.1f}" y="{y0 - bh:.1f}" width="{bw - 1:.1f}" '
                     f'height="{bh:.1f}" fill="#4a78c2"/>')
    parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y0}" y2="{y0}" stroke="#999"/>')
    for _, v, color in marks:
        x = xpos(v)
        parts.append(f'<line class="percentile" x1="{x:.1f}" x2="{x:.1f}" y1="{y_top}" y2="{y0}" stroke="{color}" '
                     'stroke-dasharray="3,2"/>')
    for left, right, text, anchor, lane in top_labels:
        parts.append(_text(left, right, text, anchor, y_top - 3 - lane * LINE, "label"))
    for b in budgets.values():
        if lo <= b <= hi:
            x = xpos(b)
            parts.append(f'<line class="budget" data-budget="{b:g}" x1="{x:.1f}" x2="{x:.1f}" y1="{y_top}" '
                         f'y2="{y0}" stroke="#d00" stroke-width="2"/>')
        else:  # beyond the samples: a marker at that edge, pointing out
            x, d = (w - pad, 1) if b > hi else (pad, -1)
            parts.append(f'<path class="budget-edge" data-budget="{b:g}" d="M{x} {y_top + 4} l{6 * d} 6 l{-6 * d} 6 z" '
                         f'fill="#d00"/>')
    for left, right, text, anchor, lane in bottom_labels:
        parts.append(_text(left, right, text, anchor, y0 + 26 + lane * LINE, "label", "#d00"))
    lo_text, hi_text = f"{_axis_ms(lo)} ms", f"{_axis_ms(hi)} ms"
    parts.append(_text(pad, pad + len(lo_text) * CHAR_W, lo_text, "start", y0 + 12, "axis")
                 + _text(w - pad - len(hi_text) * CHAR_W, w - pad, hi_text, "end", y0 + 12, "axis") + "</svg>")
    return "".join(parts)


# ------------------------------------------------------------------------------------------- sections

def _explain_html(x: ExplainDoc) -> list[str]:
    """The precision search of one artifact (`ortbuild test --explain`): layers, rebuilds, the override."""
    out = [f"<h3>explain: {e(x['status'])}</h3>" + (f"<p>{e(x['reason'])}</p>" if x.get("reason") else "")]
    if x.get("layers"):
        out.append("<table class=layers><tr><th>node</th><th>op type</th><th>error vs fp32</th><th>added</th></tr>"
                   + "".join(f"<tr><td>{e(str(y['node']))}</td><td>{e(str(y['op_type']))}</td>"
                             f"<td>{e(str(y['error']))}</td><td>{e(str(y['added']))}</td></tr>"
                             for y in x["layers"][:10]) + "</table>")
    if x.get("trials"):
        out.append("<table class=trials><tr><th>rebuild</th><th>kept in float</th><th>verdict</th><th>worst</th></tr>"
                   + "".join(f"<tr><td>{i}</td><td>{e(', '.join(t['op_types']) or ', '.join(t['nodes']))}</td>"
                             f"<td class={_verdict(t['passed'])}>{_verdict(t['passed'])}</td>"
                             f"<td>{e(t['worst'])}</td></tr>" for i, t in enumerate(x["trials"], 1)) + "</table>")
    if x.get("override"):
        out.append(f"<p>paste into targets.toml ({x['rebuilds']} rebuilds, {x['seconds']} s):</p>"
                   f"<pre class=override>{e(x['override'])}</pre>")
    return out


def _profiles_html(profs: list[ProfileDoc]) -> list[str]:
    """`ortbuild profile`'s top operators per target and model, each linking its trace."""
    if not profs:
        return []
    out = ["<section id=profiles><h2>profiles (<code>ortbuild profile</code>)</h2>"]
    for target in dict.fromkeys(p["target"] for p in profs):
        out.append(f"<h3>{e(target)}</h3>")
        for p in (x for x in profs if x["target"] == target):
            per = ", ".join(f"{e(k.removesuffix('ExecutionProvider'))}: {v['nodes']} nodes"
                            for k, v in p["providers"].items())
            out.append(f"<p id='profile-{e(target)}/{e(p['model'])}'><b>{e(p['model'])}</b>: {p['runs']} runs, "
                       f"{p['run_ms']:.3f} ms per run; {per}; trace: <a href='{e(p['trace'])}'>{e(p['trace'])}</a>"
                       " (chrome://tracing, ui.perfetto.dev)</p>")
            if p["cpu_fallback"]:
                out.append(f"<p class=FAIL>CPU fallback: {len(p['cpu_fallback'])} node(s) ran on "
                           f"CPUExecutionProvider, not on {e(p['planned_providers'][0])}: "
                           + e(", ".join(f"{x['node']} ({x['op_type']})" for x in p["cpu_fallback"][:20])) + "</p>")
            out.append("<table class=profile><tr><th>op type</th><th>node</th><th>provider</th><th>calls</th>"
                       "<th>total ms</th><th>share</th></tr>")
            for r in p["operators"]:
                out.append(f"<tr><td>{e(r['op_type'])}</td><td>{e(r['node'])}</td><td>{e(r['provider'])}</td>"
                           f"<td>{r['calls']}</td><td>{r['total_us'] / 1e3:.3f}</td><td>{r['share']:.1%}</td></tr>")
            out.append("</table>")
    out.append("</section>")
    return out


def _latency_html(lat: DataSetLatency) -> list[str]:
    """One data set's timings, verdicts (with their bounds), relative budget, notes and histogram."""
    stop = ""
    if lat.get("stopped_early"):
        stop = f" (stopped at look {lat['looks']}: every budget decided)"
    out = [f"<p>{lat['samples']} samples{stop}, threads {e(str(lat['threads']))}; load {lat['session_ms']:.1f} ms, "
           f"first run {lat['first_run_ms']:.2f} ms (both excluded); p50 {_ms(lat['p50_ms'])} p90 "
           f"{_ms(lat['p90_ms'])} p99 {_ms(lat['p99_ms'])} max {_ms(lat['max_ms'])} ms</p>"]
    for v in lat.get("verdicts", []):
        out.append(f"<p>{e(v['kind'])} {_ms(v['observed'])} ms, {v['confidence']:.0%} bounds "
                   f"[{_ms(v['lower'])}, {_ms(v['upper'])}] vs budget {v['budget']:g} ms: "
                   f"<b class={v['verdict']}>{v['verdict']}</b> {e(v['note'])}</p>")
    rel = lat.get("relative")
    if rel:
        obs = f"{rel['observed_ratio']:.2f}x" if "observed_ratio" in rel else "-"
        out.append(f"<p>faster than {e(rel['target'])}: {obs} (ratio {rel['ratio']:g}): "
                   f"<b class={rel['verdict']}>{rel['verdict']}</b> {e(rel.get('note', ''))}</p>")
    retry = lat.get("retry")
    if retry:
        out.append(f"<p class=retry>measured again: {e(retry['why'])}; waited {retry['waited_s']:g} s for the load "
                   f"to fall ({'it fell' if retry['quiet'] else 'it did not'}: load {retry['load']:g}); attempts: "
                   + e(", ".join(f"{a['samples']} samples, load {a['load']} -> "
                                 + "/".join(f"{k} {x}" for k, x in a["verdicts"].items())
                                 for a in lat.get("attempts", []))) + "</p>")
    out += _compliance_html(lat.get("compliance"))
    if lat.get("note"):
        out.append(f"<p>note: {e(lat['note'])}</p>")
    out.append(histogram(lat))
    return out


def _compliance_html(c: object) -> list[str]:
    """Outputs under load (ortbuild.gating.measure.compliance): how many timed requests were checked, and each
    mismatch."""
    if not isinstance(c, dict) or not c:
        return []
    verdict = str(c.get("verdict", "-"))
    out = [f"<p>outputs under load: {e(str(c.get('checked')))} of {e(str(c.get('requests')))} timed requests "
           f"checked (every {e(str(c.get('every')))}th) against the accuracy run's: <b class={e(verdict)}>"
           f"{e(verdict)}</b></p>"]
    for m in c.get("mismatches") or []:
        if isinstance(m, dict):
            out.append(f"<pre class=failures>request {e(str(m.get('request')))} ({e(str(m.get('data_set')))}, output "
                       f"{e(str(m.get('output')))}): {e(chr(10).join(map(str, m.get('difference') or [])))}</pre>")
    return out


STARTUP: tuple[tuple[str, str, Literal["cold_start_ms", "peak_rss_mb"], str], ...] = (
    ("cold_start", "cold start", "cold_start_ms", "ms"), ("memory", "peak RSS", "peak_rss_mb", "MB"))


def _startup_html(r: RowDoc) -> list[str]:
    """Cold start and peak memory in fresh processes, each against its budget (the keys read defensively)."""
    st = r.get("startup")
    if not isinstance(st, dict) or not st:
        return []
    verdicts = [v for v in st.get("verdicts") or [] if isinstance(v, dict)]
    head = "/".join(e(str(r.get(f"{kind}_verdict", "-"))) for kind, *_ in STARTUP)
    stats = []
    for _, name, field, unit in STARTUP:
        s = st.get(field)
        if isinstance(s, dict) and s:
            stats.append(f"{name} p50 {e(str(s.get('p50', '-')))} {unit} (min {e(str(s.get('min', '-')))}, "
                         f"max {e(str(s.get('max', '-')))})")
    out = [f"<h3>startup: {head}</h3>",
           f"<p>{e(str(st.get('processes', '?')))} fresh processes: " + "; ".join(stats) + "</p>"]
    units = {kind: (name, unit) for kind, name, _, unit in STARTUP}
    for v in verdicts:
        name, unit = units.get(str(v.get("kind")), (str(v.get("kind")), ""))
        verdict = str(v.get("verdict", "-"))
        out.append(f"<p class=startup>{e(name)} {e(str(v.get('observed', '-')))} {unit} vs budget "
                   f"{e(str(v.get('budget', '-')))} {unit}: <b class={e(verdict)}>{e(verdict)}</b> "
                   f"{e(str(v.get('note', '')))}</p>")
    return out


def _cell(v: object) -> str:
    """A section's value as the generic renderer shows it: scalars, lists of scalars ("[a, b]"), tables of
    scalars ("k v, ..."); "" for what it leaves out (nested figures: the JSON has them)."""
    if isinstance(v, str | int | float | bool):
        return str(v)
    if isinstance(v, list) and all(isinstance(x, str | int | float | bool) for x in v):
        return "[" + ", ".join(map(str, v)) + "]"
    if isinstance(v, dict) and v and all(isinstance(x, str | int | float | bool) for x in v.values()):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    return ""


def _newer_gates(r: TestResult) -> list[str]:
    """The other gates' parts (ortbuild.gating.gates.registry): each by its own renderer, else its section's
    scalars."""
    out = []
    for name, section in r.sections.items():
        gate = registry.BY_NAME.get(name)
        render = gate.html if gate is not None else None
        if render is not None:
            out += render(section)
            continue
        verdict = str(section.get("verdict", "-"))
        out.append(f"<h3>{e(name)}: <span class={e(verdict)}>{e(verdict)}</span></h3><table>")
        out += [f"<tr><th>{e(k)}</th><td>{e(_cell(v))}</td></tr>" for k, v in section.items()
                if k != "verdict" and _cell(v)]
        out.append("</table>")
        given = section.get("data_sets")
        rows = [d for d in given if isinstance(d, dict)] if isinstance(given, list) else []
        columns = [k for k in dict.fromkeys(k for d in rows for k in d) if any(_cell(d.get(k)) for d in rows)]
        if rows and columns:  # each data set's figures (their scalars; the JSON has the rest)
            out.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in columns) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(_cell(d.get(c)))}</td>" for c in columns) + "</tr>" for d in rows]
            out.append("</table>")
    return out


def _section(row: RowDoc, verdict: str, profiled: dict[str, str]) -> list[str]:
    r = row
    key = f"{r['target']}/{r['model']}"
    status = str(r.get("status", "-"))
    out = [f"<section id=\"{e(key)}\"><h2>{e(key)} <span class={e(status)}>{e(verdict)}</span></h2>"]
    if r.get("reason"):
        out.append(f"<p>{e(r['reason'])}</p>")
    for w in [*(r.get("golden") or {}).get("warnings", []), *(x["message"] for x in r.get("speed") or [])]:
        out.append(f"<p class=warning>warning: {e(w)}</p>")
    if left := selection.not_judged(r.get("judged"), doc_kind(r)):
        out.append(f"<p>{e(left)}: `ortbuild release` needs every gate</p>")
    if key in profiled:
        out.append(f"<p>profile: <a href='#profile-{e(key)}'>top operators</a>, "
                   f"<a href='{e(profiled[key])}'>trace</a></p>")
    if r.get("failures"):
        out.append("<pre class=failures>" + e("\n".join(r["failures"])) + "</pre>")
        out.append(f"<p>reproduce: <code>{e(r.get('reproduce', ''))}</code></p>")
    if r.get("explain"):
        out += _explain_html(r["explain"])
    s = r.get("size") or {}
    if s.get("bytes") is not None:
        sv = str(r.get("size_verdict", "-"))
        out.append(f"<p>size {human_size(s['bytes'])} = {s['ratio']:.2f}x the source "
                   f"({human_size(s.get('source_bytes'))}); max_ratio {s['max_ratio']:g}"
                   + (f", max_mb {s['max_mb']:g}" if s.get("max_mb") is not None else "")
                   + f": <b class={e(sv)}>{e(sv)}</b></p>")
    if r.get("outputs"):
        out.append(f"<h3>accuracy: {e(r['accuracy'])}</h3><p>golden: {e((r.get('golden') or {}).get('made_by', ''))}"
                   "</p><table><tr><th>output</th><th>data set</th><th>metric</th><th>observed</th><th>allowed</th>"
                   "<th>verdict</th></tr>")
        for o in r["outputs"]:
            for c in o["checks"] or [{"metric": "ignored", "observed": "-", "allowed": "-", "passed": True}]:
                v = _verdict(c["passed"])
                out.append(f"<tr><td>{e(o['output'])}</td><td>{e(o['dataset'])}</td><td>{e(c['metric'])}</td>"
                           f"<td>{e(str(c['observed']))}</td><td>{e(str(c['allowed']))}</td>"
                           f"<td class={v}>{v}</td></tr>")
        out.append("</table>")
    lat = r.get("latency") or {}
    if lat:
        out.append(f"<h3>latency: {e(str(r.get('latency_verdict', '-')))}</h3>")
        sets = lat.get("data_sets") or []
        if len(sets) > 1:  # every golden data set timed: each its own block
            for d in sets:
                out.append(f"<h4>data set {e(d['name'])}: <span class={d['verdict']}>{e(d['verdict'])}</span></h4>")
                out += _latency_html({**d, "threads": lat.get("threads")})
        else:
            out += _latency_html(lat)
    out += _startup_html(r)
    out += _newer_gates(TestResult.from_json(row))
    out.append("</section>")
    return out


def _comparison(c: Comparison | None) -> str:
    if not c:
        return "<p class=comparison>no earlier report to compare with: the next run compares with this one</p>"
    if c.get("kind") == "baseline":
        return (f"<p class=comparison>changes against the baseline {e(str(c.get('file')))} of "
                f"{e(str(c.get('created')))}</p>")
    return (f"<p class=comparison>changes against the previous report (kept as {e(str(c.get('file')))}) of "
            f"{e(str(c.get('created')))}; a row not measured again since keeps the change it had</p>")


def render(doc: ReportDoc, header: list[str], rows: list[list[str]]) -> str:
    """The page of a report.json document whose results are in the order shown, `rows` their summary cells
    (the verdict last)."""
    results = doc["results"]
    profiled = {f"{p['target']}/{p['model']}": p["trace"] for p in doc.get("profiles") or []}
    out = ["<!doctype html><html lang=en><head><meta charset=utf-8><title>ortbuild test report</title>",
           f"<style>{CSS}</style></head><body><h1>ortbuild test report</h1>",
           f"<p>{e(doc['created'])}: " + ", ".join(f"{n} {s}" for s, n in doc["counts"].items()) + "</p>",
           _comparison(doc.get("comparison")),
           "<table id=summary><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
    for r, row in zip(results, rows, strict=True):
        link = f"<td><a href=\"#{e(row[0])}/{e(row[1])}\">{e(row[0])}</a></td>"
        out.append("<tr>" + link + "".join(f"<td>{e(c)}</td>" for c in row[1:-1])
                   + f"<td class={e(str(r.get('status')))}>{e(row[-1])}</td></tr>")
    out.append("</table>")
    for r, row in zip(results, rows, strict=True):
        out += _section(r, row[-1], profiled)
    out += _profiles_html(doc.get("profiles") or [])
    out.append("</body></html>\n")
    return "\n".join(out)
