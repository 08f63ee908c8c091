"""Test reports: the summary table, dist/report.json and a self-contained dist/report.html.

Each `ortbuild test` run (one per target under nox) writes dist/<target>/<model>/test-report.json; the
reports gather every such file whose artifact is still the one tested (same build key), so after
`nox -s test` they cover every target of every runtime. The HTML has no external resources: inline CSS and
SVG (a latency histogram per artifact with its percentiles and budgets), readable offline.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ortbuild import files, paths
from ortbuild.artifact import manifest
from ortbuild.status import Verdict

REPORT_JSON, REPORT_HTML = "report.json", "report.html"


def _verdict(passed: bool) -> Verdict:
    return Verdict.PASS if passed else Verdict.FAIL


def _ms(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


def _latency_cell(r: dict[str, Any], key: str) -> str:
    lat = r.get("latency") or {}
    if key not in lat:
        return "-"
    budget = next((v["budget"] for v in lat.get("verdicts", []) if v["kind"] == key.removesuffix("_ms")), None)
    return _ms(lat[key]) + (f" / {budget:g}" if budget is not None else "")


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in results:
        size = r.get("size") or {}
        rel = (r.get("latency") or {}).get("relative")
        out.append([r["target"], r["model"],
                    f"{size['bytes'] / 1024:.1f} KB {size['ratio']:.2f}x/{size['max_ratio']:g}" if size else "-",
                    r["accuracy"] + (f" ({r['worst']})" if r["worst"] not in ("-", "") else ""),
                    _latency_cell(r, "p50_ms"), _latency_cell(r, "p90_ms"), _latency_cell(r, "p99_ms"),
                    (f"{rel['observed_ratio']:.2f}x/{rel['ratio']:g} {rel['target']}" if rel and "observed_ratio" in rel
                     else ("-" if not rel else Verdict.SKIPPED)),
                    r["status"]])
    return out


HEADER = ["target", "model", "size (vs src/max)", "accuracy (worst)", "p50 ms/budget", "p90", "p99",
          "relative", "verdict"]


def collect(dist: Path) -> list[dict[str, Any]]:
    """Every dist/<target>/<model>/test-report.json whose artifact is still the one it tested."""
    # a report whose artifact was rebuilt since is left out: its old verdict no longer applies
    return [doc for doc, m in manifest.reports(dist, "test-report.json")
            if doc.get("result", {}).get("build_key") in ("", m.build_key)]


PROFILE_TOP = 10  # operators per artifact in the report (the trace and profile.json have them all)


def profiles(dist: Path) -> list[dict[str, Any]]:
    """The current profiles of dist/'s artifacts (`ortbuild profile`), with their top operators only."""
    from ortbuild.gating import profile

    return [{**{k: v for k, v in doc.items() if k != "operators"}, "operators": doc["operators"][:PROFILE_TOP],
             "trace": f"{doc['target']}/{doc['model']}/{profile.TRACE}"} for doc in profile.collect(dist)]


def write(dist: Path, docs: list[dict[str, Any]]) -> tuple[Path, Path]:
    results = [d["result"] for d in docs]
    counts = {s: sum(r["status"] == s for r in results) for s in Verdict}  # PASS, FAIL, INCONCLUSIVE, SKIPPED
    created = manifest.iso_utc()
    doc = {"created": created, "counts": counts, "results": results,
           "environments": {f"{d['result']['target']}/{d['result']['model']}": d.get("environment") for d in docs},
           "profiles": profiles(dist)}
    jpath, hpath = paths.inside(dist, REPORT_JSON), paths.inside(dist, REPORT_HTML)
    files.atomic_write(jpath, (json.dumps(doc, indent=2, default=str) + "\n").encode())
    files.atomic_write(hpath, render_html(doc).encode())
    return jpath, hpath


# ------------------------------------------------------------------------------------------- HTML

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.PASS{background:#d9f2d9}.FAIL{background:#f8d0d0}.INCONCLUSIVE{background:#fbefc5}
.SKIPPED{background:#e6e6e6}pre{background:#f7f7f7;padding:8px;white-space:pre-wrap}
section{border-top:2px solid #ddd;margin-top:20px;padding-top:8px}
"""


def _histogram(lat: dict[str, Any]) -> str:
    xs = lat.get("samples_ms") or []
    if not xs:
        return ""
    budgets = {v["kind"]: v["budget"] for v in lat.get("verdicts", [])}
    lo, hi = min(xs), max([*xs, *budgets.values()])
    hi = max(hi, lo * 1.01 + 1e-9)
    w, h, pad, bins = 640, 180, 30, 40
    counts = [0] * bins
    for x in xs:
        counts[min(bins - 1, int((x - lo) / (hi - lo) * bins))] += 1
    top = max(counts)
    bw = (w - 2 * pad) / bins
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 40}" role="img" '
             f'aria-label="latency distribution">',
             f'<rect x="0" y="0" width="{w}" height="{h + 40}" fill="#fff"/>']
    for i, c in enumerate(counts):
        bh = (h - 2 * pad) * c / top
        parts.append(f'<rect class="bar" x="{pad + i * bw:.1f}" y="{h - pad - bh:.1f}" width="{bw - 1:.1f}" '
                     f'height="{bh:.1f}" fill="#4a78c2"/>')

    def xpos(v: float) -> float:
        return float(pad + (v - lo) / (hi - lo) * (w - 2 * pad))
    for key, color in (("p50_ms", "#222"), ("p90_ms", "#555"), ("p99_ms", "#888")):
        if key in lat:
            x = xpos(lat[key])
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{pad}" y2="{h - pad}" stroke="{color}" '
                         f'stroke-dasharray="3,2"/><text x="{x + 2:.1f}" y="{pad - 4}" font-size="10">'
                         f'{key[:-3]}</text>')
    for kind, b in budgets.items():
        x = xpos(b)
        parts.append(f'<line class="budget" x1="{x:.1f}" x2="{x:.1f}" y1="{pad}" y2="{h - pad}" stroke="#d00" '
                     f'stroke-width="2"/><text x="{x + 2:.1f}" y="{h - pad + 24}" font-size="10" fill="#d00">'
                     f'{kind} budget {b:g} ms</text>')
    parts.append(f'<text x="{pad}" y="{h - pad + 12}" font-size="10">{lo:.3f} ms</text>'
                 f'<text x="{w - pad - 50}" y="{h - pad + 12}" font-size="10">{hi:.3f} ms</text></svg>')
    return "".join(parts)


def _explain_html(x: dict[str, Any]) -> list[str]:
    """The precision search of one artifact (`ortbuild test --explain`): layers, rebuilds, the override."""
    e = html.escape
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


def _profiles_html(profs: list[dict[str, Any]]) -> list[str]:
    """`ortbuild profile`'s top operators per target and model, each linking its trace."""
    e = html.escape
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


def _latency_html(lat: dict[str, Any]) -> list[str]:
    """One data set's timings, verdicts (with their bounds), relative budget, notes and histogram."""
    e = html.escape
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
    if lat.get("note"):
        out.append(f"<p>note: {e(lat['note'])}</p>")
    out.append(_histogram(lat))
    return out


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    results = doc["results"]
    profiled = {f"{p['target']}/{p['model']}": p["trace"] for p in doc.get("profiles") or []}
    out = ["<!doctype html><html lang=en><head><meta charset=utf-8><title>ortbuild test report</title>",
           f"<style>{CSS}</style></head><body><h1>ortbuild test report</h1>",
           f"<p>{e(doc['created'])}: " + ", ".join(f"{n} {s}" for s, n in doc["counts"].items()) + "</p>",
           "<table id=summary><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEADER) + "</tr>"]
    for r, row in zip(results, rows(results), strict=True):
        out.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row[:-1])
                   + f"<td class={r['status']}>{e(row[-1])}</td></tr>")
    out.append("</table>")
    for r in results:
        key = f"{r['target']}/{r['model']}"
        out.append(f"<section id='{e(key)}'><h2>{e(key)} <span class={r['status']}>{e(r['status'])}</span></h2>")
        if r.get("reason"):
            out.append(f"<p>{e(r['reason'])}</p>")
        if key in profiled:
            out.append(f"<p>profile: <a href='#profile-{e(key)}'>top operators</a>, "
                       f"<a href='{e(profiled[key])}'>trace</a></p>")
        if r["failures"]:
            out.append("<pre class=failures>" + e("\n".join(r["failures"])) + "</pre>")
            out.append(f"<p>reproduce: <code>{e(r['reproduce'])}</code></p>")
        if r.get("explain"):
            out += _explain_html(r["explain"])
        if r.get("size"):
            s = r["size"]
            out.append(f"<p>size {s['bytes'] / 1024:.1f} KB = {s['ratio']:.2f}x the source "
                       f"({s['source_bytes'] / 1024:.1f} KB); max_ratio {s['max_ratio']:g}"
                       + (f", max_mb {s['max_mb']:g}" if s.get("max_mb") is not None else "")
                       + f": <b class={r['size_verdict']}>{r['size_verdict']}</b></p>")
        if r["outputs"]:
            out.append(f"<h3>accuracy: {e(r['accuracy'])}</h3><p>golden: {e(r['golden'].get('made_by', ''))}</p>"
                       "<table><tr><th>output</th><th>data set</th><th>metric</th><th>observed</th><th>allowed</th>"
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
            out.append(f"<h3>latency: {e(r['latency_verdict'])}</h3>")
            sets = lat.get("data_sets") or []
            if len(sets) > 1:  # every golden data set timed: each its own block
                for d in sets:
                    out.append(f"<h4>data set {e(d['name'])}: <span class={d['verdict']}>{e(d['verdict'])}</span>"
                               "</h4>")
                    out += _latency_html({**d, "threads": lat.get("threads")})
            else:
                out += _latency_html(lat)
        out.append("</section>")
    out += _profiles_html(doc.get("profiles") or [])
    out.append("</body></html>\n")
    return "\n".join(out)
