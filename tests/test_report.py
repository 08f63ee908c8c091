"""The report answers why: each row names the gates that failed, its change against the previous run (or a
`--baseline` report.json), failures come first in the HTML with each row linking its section, and the latency
histogram's axis fits the samples. Built from TestResult-like documents: no ONNX Runtime, no build; except a build
that fails inside `ortbuild test` (ONNX Runtime rejects the golden inputs), built for real: it is a FAIL row."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ortbuild.artifact import manifest
from ortbuild.errors import UsageError
from ortbuild.gating.record import TestResult
from ortbuild.gating.reports import cells as table_cells
from ortbuild.gating.reports import report, report_html
from ortbuild.units import human_size
from tests.conftest import here_runtime, run_cli

GATES = ("accuracy", "size", "latency", "cold_start", "memory")


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each report written a minute after the last (they are seconds apart in real use)."""
    minutes, real = iter(range(60)), manifest.iso_utc  # (the CLI runs in this process: a given time stays as it is)
    monkeypatch.setattr(manifest, "iso_utc",
                        lambda when=None: real(when) if when else f"2025-01-01T10:{next(minutes):02d}:00Z")


def result(target: str, model: str = "m", status: str = "PASS", *, p50: float = 1.0, p90: float = 1.2,
           size: int = 1000, failed: tuple[str, ...] = (), legacy: bool = False, **extra: Any) -> dict[str, Any]:
    """A test-report.json `result` as TestResult.as_json() writes it (`legacy`: without `gates`, as older
    ortbuilds wrote it)."""
    gates = {g: ("FAIL" if g in failed else "PASS" if g in ("accuracy", "size", "latency") else "-") for g in GATES}
    r: dict[str, Any] = {
        "target": target, "model": model, "precision": "fp32", "status": status, "reason": "",
        "accuracy": gates["accuracy"], "worst": "-", "outputs": [], "golden": {},
        "latency": {"samples": 3, "p50_ms": p50, "p90_ms": p90, "p99_ms": p90, "max_ms": p90,
                    "samples_ms": [p50, p50, p90], "threads": 1, "session_ms": 5.0, "first_run_ms": 0.5,
                    "verdicts": [{"kind": "p90", "budget": 50, "verdict": gates["latency"], "observed": p90,
                                  "confidence": 0.99, "lower": p50, "upper": p90, "note": ""}]},
        "latency_verdict": gates["latency"],
        "size": {"bytes": size, "source_bytes": size, "ratio": 1.0, "max_ratio": 1.1, "max_mb": None},
        "size_verdict": gates["size"], "startup": {}, "cold_start_verdict": gates["cold_start"],
        "memory_verdict": gates["memory"], "failures": [f"{g}: failed" for g in failed], "reproduce": "ortbuild test",
        "explain": {}, "build_key": "", "artifact_sha256": "", "exit_code": 9 if failed else 0,
        "gates": gates, "failed_gates": list(failed)}
    if legacy:
        for k in ("gates", "failed_gates", "startup", "cold_start_verdict", "memory_verdict"):
            del r[k]
    r.update(extra)
    return r


def docs(*results: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"result": r, "environment": {"cpu": "test"}} for r in results]


def rows_of(page: str) -> list[list[str]]:
    """The summary table's rows: each cell's text (links followed by their text)."""
    table = page.split("<table id=summary>", 1)[1].split("</table>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", table) if "<td" in tr]


# ------------------------------------------------------------------------------------------- why

def test_each_row_names_its_failing_gates() -> None:
    results = [result("size", failed=("size",), status="FAIL"),
               result("two", failed=("accuracy", "cold_start"), status="FAIL"),
               result("old", failed=("latency",), status="FAIL", legacy=True),          # no `gates`: from fields
               result("built", status="FAIL", reason="build failed: step 'optimize': boom", exit_code=6,
                      failures=["build failed: step 'optimize': boom"]),
               result("required", status="FAIL", exit_code=4,
                      failures=["required, but cannot run here: runs in onnxruntime-gpu"]),
               result("broken", status="FAIL", exit_code=3, failures=["config error"]),
               result("tampered", status="FAIL", exit_code=7, reason="build failed: TAMPERED: model.onnx.enc differs",
                      failures=["build failed: TAMPERED: model.onnx.enc differs"]),
               result("slow", status="INCONCLUSIVE", latency_verdict="INCONCLUSIVE",
                          gates={**dict.fromkeys(GATES, "-"), "latency": "INCONCLUSIVE"}),
               result("ok")]
    cells = {r[0]: r[-1] for r in table_cells.rows(results)}
    assert cells == {"size": "FAIL (size)", "two": "FAIL (accuracy, cold_start)", "old": "FAIL (latency)",
                     "built": "FAIL (build)", "required": "FAIL (required)", "broken": "FAIL (config)",
                     "tampered": "FAIL (artifact)",
                     "slow": "INCONCLUSIVE (latency)", "ok": "PASS"}
    header, body = table_cells.text_table(results, None)
    assert header[-1] == "verdict" and [r[-1] for r in body] == list(cells.values())
    assert "startup" not in header and "vs previous" not in header        # nobody has one: left out of the text
    page = report.render_html({"created": "now", "counts": {}, "results": results})
    assert {r[0]: r[-1] for r in rows_of(page)} == cells


def test_startup_is_shown_compactly_and_in_the_section() -> None:
    startup = {"processes": 5, "cold_start_ms": {"p50": 812.4, "min": 790.0, "max": 850.2},
               "peak_rss_mb": {"p50": 95.3, "min": 94.0, "max": 97.0},
               "verdicts": [{"kind": "cold_start", "budget": 1000, "verdict": "PASS", "observed": 812.4},
                            {"kind": "memory", "budget": 64, "verdict": "FAIL", "observed": 95.3}]}
    r = result("cpu", status="FAIL", failed=("memory",), startup=startup, memory_verdict="FAIL",
               cold_start_verdict="PASS")
    cell = lambda doc: table_cells.startup_cell(TestResult.from_json(doc))  # noqa: E731
    assert cell(r) == "812 ms/1000, 95 MB/64"
    assert cell({"startup": {"cold_start_ms": {"p50": 3.25}}}) == "3.2 ms"   # no budget, no verdicts
    assert cell({"startup": {"processes": 3, "verdicts": "?"}}) == "-"        # defensive
    header, body = table_cells.text_table([r, result("other")], None)
    assert body[0][header.index("startup")] == "812 ms/1000, 95 MB/64" and body[1][header.index("startup")] == "-"
    page = report.render_html({"created": "now", "counts": {}, "results": [r]})
    assert "<h3>startup: PASS/FAIL</h3>" in page and "5 fresh processes: cold start p50 812.4 ms" in page
    assert "peak RSS 95.3 MB vs budget 64 MB: <b class=FAIL>FAIL</b>" in page


# ------------------------------------------------------------------------------------------- the HTML

def test_html_puts_failures_first_and_links_each_row_to_its_section(tmp_path: Path) -> None:
    results = [result("a", status="PASS"), result("b", status="SKIPPED"), result("c", status="INCONCLUSIVE"),
               result("d", status="FAIL", failed=("size",)), result("e", status="PASS")]
    _, hpath = report.write(tmp_path, docs(*results))
    page = hpath.read_text()
    assert [r[0] for r in rows_of(page)] == ["d", "c", "a", "e", "b"]
    links = re.findall(r'<td><a href="#([^"]+)">', page)
    sections = re.findall(r'<section id="([^"]+)">', page)
    assert links == sections == ["d/m", "c/m", "a/m", "e/m", "b/m"]
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert [r["target"] for r in doc["results"]] == ["a", "b", "c", "d", "e"]    # report.json: as collected


class _Svg(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.svg: dict[str, str] = {}
        self.texts: list[dict[str, str]] = []
        self.edges: list[dict[str, str]] = []
        self.lines: list[dict[str, str]] = []
        self._text: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg":
            self.svg = a
        elif tag == "text":
            self._text = a
        elif tag == "path" and a.get("class") == "budget-edge":
            self.edges.append(a)
        elif tag == "line" and a.get("class") == "budget":
            self.lines.append(a)

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self.texts.append({**self._text, "text": data})
            self._text = None


def _svg(lat: dict[str, Any]) -> _Svg:
    p = _Svg()
    p.feed(report_html.histogram(lat))
    return p


def _extent(t: dict[str, str]) -> tuple[float, float]:
    x, w = float(t["x"]), float(t["data-w"])
    assert w >= len(t["text"]) * 5.5, t          # a 10px label's width, not underestimated
    return (x, x + w) if t["text-anchor"] == "start" else (x - w, x)


def test_the_histogram_axis_fits_the_samples_and_budgets_beyond_them_sit_at_the_edges() -> None:
    samples = [10.0 + i * 0.02 for i in range(100)]                                   # 10.0 .. 11.98 ms
    lat = {"samples_ms": samples, "p50_ms": 11.0, "p90_ms": 11.8, "p99_ms": 11.96,
           "verdicts": [{"kind": "p90", "budget": 1000}, {"kind": "p99", "budget": 0.5},
                        {"kind": "p50", "budget": 11.5}]}
    svg = _svg(lat)
    lo, hi = float(svg.svg["data-lo"]), float(svg.svg["data-hi"])
    assert 9.8 < lo <= 10.0 and 11.98 <= hi < 12.2, (lo, hi)        # not 0 .. 1000: the samples, 5% margin
    edges = {e["data-budget"]: e for e in svg.edges}
    assert set(edges) == {"1000", "0.5"} and [x["data-budget"] for x in svg.lines] == ["11.5"]
    labels = [t["text"] for t in svg.texts]
    assert "\u25b6 p90 budget 1000 ms" in labels and "\u25c0 p99 budget 0.5 ms" in labels
    assert "p50 budget 11.5 ms" in labels
    right = next(t for t in svg.texts if "1000 ms" in t["text"])
    assert right["text-anchor"] == "end" and float(right["x"]) <= float(svg.svg["width"])


def test_histogram_labels_do_not_overlap() -> None:
    # the percentiles nearly coincide and three budgets crowd one spot: every label still has its own place
    lat = {"samples_ms": [5.0] * 50 + [5.001, 5.002, 9.0], "p50_ms": 5.0, "p90_ms": 5.001, "p99_ms": 5.002,
           "verdicts": [{"kind": "p50", "budget": 5.0005}, {"kind": "p90", "budget": 5.0015},
                        {"kind": "p99", "budget": 5.003}, {"kind": "max", "budget": 8.99}]}
    svg = _svg(lat)
    width = float(svg.svg["width"])
    assert len(svg.texts) == 3 + 4 + 2                                   # percentiles, budgets, the axis ends
    for i, a in enumerate(svg.texts):
        la, ra = _extent(a)
        assert la >= 0 and ra <= width, a
        for b in svg.texts[i + 1:]:
            if a["y"] == b["y"]:
                lb, rb = _extent(b)
                assert ra <= lb or rb <= la, (a, b)
    assert _svg({"samples_ms": []}).svg == {} and report_html.histogram({"samples_ms": [2.0] * 5}).count("bar") == 40


# ------------------------------------------------------------------------------------------- the change

def test_each_row_gets_its_change_against_the_previous_run(tmp_path: Path) -> None:
    first = [result("cpu", p50=1.0, p90=2.0, size=2048), result("int8", p50=1.0, p90=1.0, size=1024),
             result("gone")]
    report.write(tmp_path, docs(*first))
    assert not (tmp_path / report.REPORT_PREVIOUS).exists()
    before = (tmp_path / report.REPORT_JSON).read_bytes()
    assert json.loads(before)["comparison"] is None and json.loads(before)["results"][0]["delta"] is None
    second = [result("cpu", p50=1.1, p90=2.5, size=3072), result("int8", status="FAIL", failed=("size",),
                                                                  p50=0.9, p90=1.0, size=1024),
              result("new")]
    _, hpath = report.write(tmp_path, docs(*second))
    assert (tmp_path / report.REPORT_PREVIOUS).read_bytes() == before          # kept as the comparison
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert doc["comparison"]["kind"] == "previous" and doc["comparison"]["file"] == report.REPORT_PREVIOUS
    d = {report.key(r): r["delta"] for r in doc["results"]}
    cpu = d["cpu/m"]
    assert cpu["p50_ms"] == {"before": 1.0, "after": 1.1, "change": 0.1, "percent": 10.0}
    assert cpu["p90_ms"] == {"before": 2.0, "after": 2.5, "change": 0.5, "percent": 25.0}
    assert cpu["size_bytes"] == {"before": 2048, "after": 3072, "change": 1024, "percent": 50.0}
    assert cpu["verdict"] == {"before": "PASS", "after": "PASS", "changed": False}
    assert cpu["against"]["created"] == json.loads(before)["created"]
    assert d["int8/m"]["verdict"] == {"before": "PASS", "after": "FAIL", "changed": True}
    assert d["new/m"]["new"] is True
    cells = {r[0]: r[header.index("vs previous")] for header, body in [table_cells.text_table(doc["results"],
                                                                                         doc["comparison"])]
             for r in body}
    assert cells == {"cpu": "p90 +25%, size +50%", "int8": "PASS->FAIL, p90 +0.0%", "new": "new"}
    html_cells = {r[0]: r[-2] for r in rows_of(hpath.read_text())}
    assert html_cells["int8"] == "PASS -&gt; FAIL; p50 -0.100 ms (-10%); p90 +0.000 ms (+0.0%); size unchanged"
    assert html_cells["cpu"] == "p50 +0.100 ms (+10%); p90 +0.500 ms (+25%); size +1.0 KB (+50%)"
    assert "<th>vs previous</th>" in hpath.read_text() and "changes against the previous report" in hpath.read_text()


def test_a_row_not_measured_again_keeps_its_change(tmp_path: Path) -> None:
    """Under nox each target's session rewrites the report: the others' rows keep the change they had."""
    report.write(tmp_path, docs(result("cpu", p90=2.0), result("gpu", p90=1.0)))
    second = [result("cpu", p90=3.0), result("gpu", p90=1.5)]
    report.write(tmp_path, docs(*second))
    kept = json.loads((tmp_path / report.REPORT_JSON).read_text())["results"][1]["delta"]
    report.write(tmp_path, docs(second[0], result("gpu", p90=1.5, status="FAIL", failed=("latency",))))
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert doc["results"][0]["delta"] == {**json.loads((tmp_path / report.REPORT_PREVIOUS).read_text())
                                          ["results"][0]["delta"]}           # cpu: not measured again, kept
    assert doc["results"][0]["delta"]["p90_ms"]["percent"] == 50.0
    assert doc["results"][1]["delta"]["verdict"]["changed"] and kept["p90_ms"]["percent"] == 50.0
    cells = {r[0]: r[-2] for r in rows_of((tmp_path / report.REPORT_HTML).read_text())}
    assert cells["cpu"].endswith(f"(vs the previous report of {doc['results'][0]['delta']['against']['created']})")
    assert "(vs" not in cells["gpu"]                          # against the report's own comparison: said once above
    # this run's text table shows a change only for a row the report holds as this very result
    mine = report.this_run(doc, [second[0], result("cpu", p90=9.0, model="x")])
    assert mine[0]["delta"]["p90_ms"]["percent"] == 50.0 and mine[1]["delta"] is None


def test_a_baseline_is_compared_instead_of_the_previous_run(tmp_path: Path) -> None:
    base = tmp_path / "release-1.json"
    report.write(tmp_path / "old", docs(result("cpu", p90=4.0, size=2 << 20)))
    (tmp_path / "old" / report.REPORT_JSON).rename(base)
    report.write(tmp_path, docs(result("cpu", p90=1.0)))                   # a previous run that is not compared
    report.write(tmp_path, docs(result("cpu", p90=3.0, size=1 << 20)), report.read_baseline(str(base)))
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert doc["comparison"]["kind"] == "baseline" and doc["comparison"]["file"] == str(base)
    delta = doc["results"][0]["delta"]
    assert delta["p90_ms"]["percent"] == -25.0 and delta["size_bytes"]["change"] == -(1 << 20)
    header, body = table_cells.text_table(doc["results"], doc["comparison"])
    assert body[0][header.index("vs baseline")] == "p90 -25%, size -50%"
    page = (tmp_path / report.REPORT_HTML).read_text()
    assert "<th>vs baseline</th>" in page and f"changes against the baseline {base}" in page


@pytest.mark.parametrize(("content", "problem"), [
    (None, "does not exist"),
    ("", "is empty"),
    ("{oops", "not a test report: not JSON (Expecting property name"),
    ("[1, 2]", "not a test report: a JSON list, not an object"),
    ('{"results": {}}', "not a test report: it has no 'results' list"),
    ('{"result": {"target": "cpu"}}', "it is one artifact's test-report.json, not the dist/report.json"),
    ('{"results": [{"target": "cpu"}]}', "results[0] names no target and model"),
])
def test_a_bad_baseline_is_a_usage_error_naming_the_file(tmp_path: Path, content: str | None, problem: str) -> None:
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as err:
        report.read_baseline(str(path))
    assert err.value.render().startswith(f"ortbuild: usage error: --baseline {path}: ") and problem in err.value.message
    assert "dist/report.json" in (err.value.hint or "")


def test_a_directory_baseline_suggests_its_report(tmp_path: Path) -> None:
    report.write(tmp_path, docs(result("cpu")))
    with pytest.raises(UsageError, match="is a directory") as err:
        report.read_baseline(str(tmp_path))
    assert err.value.hint == f"did you mean {tmp_path / report.REPORT_JSON}?"


def test_ortbuild_test_refuses_a_bad_baseline_before_building(tmp_path: Path) -> None:
    proc = run_cli("test", "--baseline", "nope.json", "-c", "missing.toml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ortbuild: usage error: --baseline nope.json: does not exist\n  hint: ")
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------- units

def test_one_size_format_everywhere() -> None:
    assert [human_size(n) for n in (0, 1023, 1024, 69_016_269, 3 << 30, None)] == [
        "0 B", "1023 B", "1.0 KB", "65.8 MB", "3.0 GB", "-"]
    assert human_size(1024 * 1024 - 1) == "1.0 MB"                  # never "1024.0 KB"
    row = table_cells.rows([result("cpu", size=69_016_269)])[0]
    assert row[2] == "65.8 MB 1.00x/1.1"
    page = report.render_html({"created": "now", "counts": {}, "results": [result("cpu", size=69_016_269)]})
    assert "<p>size 65.8 MB = 1.00x the source (65.8 MB)" in page


def test_a_skipped_row_has_no_change_unless_its_verdict_changed(tmp_path: Path) -> None:
    """Nothing is measured on a target that cannot run here: its rows show no change, run after run (the first
    `nox -s test` has only rows that are new or have nothing to compare: the column is left out)."""
    skipped = result("gpu", status="SKIPPED")
    report.write(tmp_path, docs(result("cpu", p90=2.0)))
    report.write(tmp_path, docs(result("cpu", p90=2.0), skipped))
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert doc["results"][1]["delta"] is None                            # new, but SKIPPED: nothing to compare
    head, _ = table_cells.text_table(doc["results"], doc["comparison"])
    assert "vs previous" not in head                                     # the cpu row was not measured again
    for _ in range(2):                                                   # SKIPPED again, unchanged
        report.write(tmp_path, docs(result("cpu", p90=3.0), skipped))
        assert json.loads((tmp_path / report.REPORT_JSON).read_text())["results"][1]["delta"] is None
    report.write(tmp_path, docs(result("cpu", p90=3.0), result("gpu", p90=1.0)))  # runs here now
    doc = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert doc["results"][1]["delta"]["verdict"] == {"before": "SKIPPED", "after": "PASS", "changed": True}
    head, body = table_cells.text_table(doc["results"], doc["comparison"])
    assert body[1][head.index("vs previous")].startswith("SKIPPED->PASS")


# ------------------------------------------------------------------------------------------- a failed build

def reshape_project(folder: Path) -> Path:
    """A model that ONNX Runtime runs on 6 values only (x [1, n] reshaped to [2, 3]): with 6 golden values it
    passes; with 5 (`bad.npz` copied over `inputs.npz`) every check before ORT accepts them (n is symbolic) and
    the build fails in its reload step, at run time."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Add", ["r", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "shape"),
         numpy_helper.from_array(np.ones((2, 3), dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "m.onnx"))
    np.savez(folder / "good.npz", x=np.arange(6, dtype=np.float32).reshape(1, 6))
    np.savez(folder / "bad.npz", x=np.arange(5, dtype=np.float32).reshape(1, 5))
    (folder / "inputs.npz").write_bytes((folder / "good.npz").read_bytes())
    toml = folder / "targets.toml"
    toml.write_text(f'''[project]\nname = "t"\nversion = "1"\n\n[models.m]\npath = "m.onnx"\ninputs = "inputs.npz"\n
[targets.cpu]\nruntime = "{here_runtime()}"\nproviders = ["CPUExecutionProvider"]\n''')
    return toml


def inputs(folder: Path, which: str) -> None:
    (folder / "inputs.npz").write_bytes((folder / f"{which}.npz").read_bytes())


def report_of(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "dist" / report.REPORT_JSON).read_text())
    return doc


def test_a_failed_build_row_says_what_a_test_result_says() -> None:
    """The report's row of a failed build (from its build record) has a test result's fields, no more."""

    row = report.build_failure_row({"target": "t", "model": "m", "status": "failed", "reason": "boom",
                                    "precision": "fp32", "step": "reload"})
    assert set(row) == set(TestResult("t", "m", "fp32").as_json())
    assert row["failures"] == ["build failed: boom"] and row["exit_code"] == 6 and row["build"]["log"] is None
    assert table_cells.verdict_cell(TestResult.from_json(row)) == "FAIL (build)"


def test_a_test_result_as_json_holds_every_field_in_order_and_shares_nothing() -> None:
    """TestResult.as_json is written out (typed): it says what dataclasses.asdict would, then `gates` and
    `failed_gates`, in the fields' order (a field added to the result and left out of as_json fails here), and a
    later change to the result does not change the document."""
    import dataclasses

    from ortbuild.status import Verdict

    r = TestResult("t", "m", "int8-dynamic", accuracy=Verdict.FAIL, worst="y: cosine 0.5", size_verdict=Verdict.PASS,
                   golden={"made_by": "fp32 source", "warnings": ["constant"]}, size={"bytes": 10, "ratio": 0.5},
                   latency={"p50_ms": 1.0, "verdicts": []}, explain={"status": "found", "nodes": ["a"]},
                   platform={"emulator": "qemu"}, build={"step": "check"}, quick=True, exit_code=9)
    r.fail(["accuracy: t/m failed"])
    doc = r.as_json()
    fields = {k: v for k, v in dataclasses.asdict(r).items()  # sections: only when another gate ran; the kind:
              if k not in ("sections", "kind")}  # spelled "generative": true, only for a generative model
    assert doc == {**fields, "gates": r.gates(), "failed_gates": ["accuracy"]}
    assert list(doc) == [f.name for f in dataclasses.fields(r) if f.name not in ("sections", "kind")] + ["gates",
                                                                                               "failed_gates"]
    assert TestResult.from_json(doc) == r  # and read back as it was
    r.golden["warnings"].append("more")
    r.failures.append("more")
    assert doc["golden"]["warnings"] == ["constant"] and doc["failures"] == ["accuracy: t/m failed"]


def test_a_build_that_fails_inside_test_is_a_fail_row(tmp_path: Path) -> None:
    """No artifact was ever built: the build record is the row, counted, in report.json and every summary."""
    toml = reshape_project(tmp_path)
    inputs(tmp_path, "bad")
    proc = run_cli("test", "-c", str(toml), "--json", cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr                                     # a StepError's code, as before
    mine = json.loads(proc.stdout)["results"][0]
    doc = report_of(tmp_path)
    assert doc["counts"] == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 0, "SKIPPED": 0}
    [row] = doc["results"]
    assert row["status"] == "FAIL" and table_cells.verdict_cell(TestResult.from_json(row)) == "FAIL (build)"
    assert row["reason"].startswith("build failed: cpu/m: step 'reload': ") and "Reshape" in row["reason"]
    assert row["build"]["step"] == "reload" and (tmp_path / row["build"]["log"]).is_file()
    assert f"build log: {row['build']['log']}" in row["failures"]
    drop = ("delta", "reproduce")
    assert {k: v for k, v in row.items() if k not in drop} == {k: v for k, v in mine.items() if k not in drop}
    assert not (tmp_path / "dist" / "cpu" / "m").exists()                        # nothing to test, nothing faked
    for args in (("test", "-c", str(toml)), ("summary", "test", "-c", str(toml))):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == (6 if args[0] == "test" else 9), proc.stderr
        assert "FAIL (build)" in proc.stdout and "0 PASS, 1 FAIL, 0 INCONCLUSIVE, 0 SKIPPED" in proc.stdout


def test_a_failed_rebuild_is_no_longer_its_earlier_pass(tmp_path: Path) -> None:
    """The artifact passed; its rebuild fails (in `test`, or in `build`): the row is FAIL (build), the old PASS
    is counted nowhere, and release refuses the older artifact still in dist/."""
    toml = reshape_project(tmp_path)
    first = run_cli("test", "-c", str(toml), "--quick", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert report_of(tmp_path)["results"][0]["status"] == "PASS"
    inputs(tmp_path, "bad")
    proc = run_cli("test", "-c", str(toml), "--quick", cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr
    assert "PASS->FAIL" in proc.stdout and "0 PASS, 1 FAIL" in proc.stdout
    doc = report_of(tmp_path)
    assert doc["counts"]["PASS"] == 0 and doc["counts"]["FAIL"] == 1
    [row] = doc["results"]
    assert table_cells.verdict_cell(TestResult.from_json(row)) == "FAIL (build)"
    assert row["delta"]["verdict"]["before"] == "PASS"
    refused = run_cli("release", "-c", str(toml), "-t", "cpu", cwd=tmp_path)
    assert refused.returncode == 9 and "cpu/m: its last build failed (cpu/m: step 'reload'" in refused.stderr
    inputs(tmp_path, "good")                                 # fixed: the artifact is the same, tested again
    assert run_cli("test", "-c", str(toml), "--quick", cwd=tmp_path).returncode == 0
    assert [r["status"] for r in report_of(tmp_path)["results"]] == ["PASS"]
    inputs(tmp_path, "bad")                                  # a failing `ortbuild build`: report.json is older
    assert run_cli("build", "-c", str(toml), cwd=tmp_path).returncode == 6
    assert report_of(tmp_path)["counts"]["PASS"] == 1
    proc = run_cli("summary", "test", "-c", str(toml), cwd=tmp_path)
    assert proc.returncode == 9 and "FAIL (build)" in proc.stdout and "0 PASS, 1 FAIL" in proc.stdout
    refused = run_cli("release", "-c", str(toml), "-t", "cpu", cwd=tmp_path)
    assert refused.returncode == 9 and "its last build failed" in refused.stderr and "Traceback" not in refused.stderr
