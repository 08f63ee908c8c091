"""The table that accepts a failed accuracy gate's difference (ortbuild.gating.gates.accept): rounded so it passes,
checked by loading targets.toml with it, and pasted by a user into targets.toml, where the gate then passes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from ortbuild.artifact import golden
from ortbuild.gating.gates import accept
from ortbuild.gating.measure import compare
from ortbuild.project import config, plan
from tests.conftest import MODELS, run_cli


@pytest.mark.parametrize("x, up", [(5.46521e-05, 5.5e-05), (0.000282011, 0.00029), (0.499981, 0.5), (0.5, 0.5),
                                   (2.62205, 2.7), (123.4, 130.0), (0.0, 0.0), (1e-30, 1e-30)])
def test_a_tolerance_is_rounded_up_to_two_significant_digits(x: float, up: float) -> None:
    assert accept.round_up(x) == up and accept.round_up(x) >= x


@pytest.mark.parametrize("x, down", [(0.9995321, 0.99953), (0.9875, 0.987), (0.75, 0.75), (1.0, 1.0),
                                     (0.123, 0.12)])
def test_a_least_similarity_is_rounded_down_keeping_two_digits_of_its_gap(x: float, down: float) -> None:
    assert accept.round_down_similarity(x) == down and accept.round_down_similarity(x) <= x


def _pasted(failures: list[str]) -> str:
    """The lines the failure report offers to paste, as a user copies them (indented as printed)."""
    start = next(i for i, line in enumerate(failures) if "to accept this difference, paste into targets.toml:" in line)
    return "\n".join(failures[start + 1:]) + "\n"


def _test(path: Path, *args: str) -> dict[str, Any]:
    proc = run_cli("test", "-c", str(path), "--json", *args, cwd=path.parent)
    assert proc.returncode in (0, 9), proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)["results"][0]
    return result


@pytest.mark.runtime
def test_a_failed_fp32_gate_prints_the_override_that_accepts_it_and_pasting_it_passes(
        make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.cpu]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        session = { intra_op_num_threads = 1 }
    """)
    feed = dict(np.load(MODELS / "tiny_cnn.inputs.npz"))
    bad = golden.compute(MODELS / "tiny_cnn.onnx", [feed])[0][0]
    bad["logits"][1, 4] += 0.5  # one golden value off by 0.5: the artifact differs from it there
    np.savez(path.parent / "bad.expected.npz", **bad)
    inputs = 'tiny_cnn.inputs.npz"'
    path.write_text(path.read_text().replace(inputs, inputs + '\nexpected = "bad.expected.npz"'))
    first = _test(path)
    assert first["status"] == "FAIL" and first["accuracy"] == "FAIL"
    snippet = _pasted(first["failures"])
    got = [line.strip() for line in snippet.splitlines()]
    assert got[1:4] == ["[[targets.cpu.overrides]]", 'models = ["tiny_cnn"]', "accuracy = { atol = 0.5 }"], snippet
    assert "# or instead: accuracy = { rtol = 2.7 }" in got  # the rtol that would pass (2.62205), rounded up
    assert "# or instead: accuracy = { mismatch_fraction = 0.025 }" in got  # 1 of 40 elements
    assert got[0].startswith("# cpu/tiny_cnn: a looser tolerance accepts this difference")
    assert "optimization" not in snippet  # level "all", but off by 0.5: not the level's doing

    tight = path.read_text()
    path.write_text(tight + "\n" + snippet.replace("atol = 0.5", "atol = 0.49"))  # less than it needs: fails
    assert _test(path)["accuracy"] == "FAIL"
    path.write_text(tight + "\n" + snippet)
    again = _test(path)
    assert again["status"] == "PASS" and again["accuracy"] == "PASS", again["failures"]


def _two_outputs(path: Path) -> None:
    """y.prob = Sigmoid(x) and other = Neg(x): an output name with a dot, as PaddleOCR's sigmoid_0.tmp_0."""
    g = h.make_graph([h.make_node("Sigmoid", ["x"], ["y.prob"]), h.make_node("Neg", ["x"], ["other"])], "g",
                     [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                     [h.make_tensor_value_info("y.prob", TensorProto.FLOAT, [2, 8]),
                      h.make_tensor_value_info("other", TensorProto.FLOAT, [2, 8])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize("level", ["basic", "all"])
@pytest.mark.runtime
def test_only_the_failing_output_is_loosened_by_its_own_table(tmp_path: Path, level: str) -> None:
    from tests.conftest import here_runtime

    _two_outputs(tmp_path / "two.onnx")
    x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    np.savez(tmp_path / "two.inputs.npz", x=x)
    expected = {"y.prob": 1 / (1 + np.exp(-x)), "other": -x}
    expected["y.prob"][0, :3] += 3e-4  # three elements off by about 3e-4
    np.savez(tmp_path / "two.expected.npz", **expected)
    path = tmp_path / "targets.toml"
    path.write_text(f"""
[project]
name = "t"
version = "1"

[models.two]
path = "two.onnx"
inputs = "two.inputs.npz"
expected = "two.expected.npz"

[targets.portable]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
optimization = "{level}"
""")
    first = _test(path)
    assert first["accuracy"] == "FAIL"
    snippet = _pasted(first["failures"])
    need = max(o["stats"]["passing_tolerance"]["atol"] for o in first["outputs"] if not o["passed"])
    atol = accept.round_up(need)
    assert 2e-4 < need <= atol < need * 1.1  # ~3e-4 less the rtol's share, two significant digits
    accuracy = [line.strip() for line in snippet.splitlines() if line.strip().startswith("accuracy = ")]
    assert accuracy == [f'accuracy = {{ outputs."y.prob" = {{ atol = {atol!r} }} }}'], snippet  # "other" keeps its rule
    # off by ~3e-4: at level "all", the level's own ~1e-4 could be part of it; at basic there is nothing to lower
    assert ('optimization = "extended" keeps closer to the reference' in snippet) == (level == "all"), snippet
    path.write_text(path.read_text() + "\n" + snippet)
    again = _test(path)
    assert again["accuracy"] == "PASS", again["failures"]
    rules = {o["output"]: o["rule"] for o in again["outputs"]}
    assert rules["other"]["atol"] == 1e-05 and rules["y.prob"]["atol"] == atol


TARGETS = """
    [targets.cpu]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    accuracy = { outputs.logits = { top1 = 1.0 } }

    [targets.cpu-int8]
    extends = "cpu"
    precision = "int8-dynamic"
"""


def _job(make_project: Callable[..., Path], target: str) -> tuple[config.Project, plan.Job]:
    project = config.load(make_project(TARGETS))
    return project, plan.jobs(project, [target], ["tiny_cnn"])[0]


def _logits() -> tuple[np.ndarray, np.ndarray]:
    """Expected logits of 4 rows, and actual ones whose last row's arg-max moved (and differ by 1e-3 elsewhere)."""
    e = np.random.default_rng(1).normal(size=(4, 10)).astype(np.float32)
    a = e + 1e-3
    a[3, int(np.argmin(e[3]))] = 10.0
    return e, a


def test_a_similarity_is_lowered_where_its_output_sets_it_and_the_result_passes(
        make_project: Callable[..., Path]) -> None:
    project, job = _job(make_project, "cpu")
    e, a = _logits()
    assert job.settings.gates is not None
    res = compare.compare("logits", "test_data_set_0", e, a, job.settings.gates.accuracy_rule("fp32", "logits"))
    assert {c.metric for c in res.failed_checks} == {"elementwise", "top1"}
    table = accept.pasteable(project, job, ["logits"], [(res, e, a)])
    assert table is not None
    line = next(x for x in table.text.splitlines() if x.startswith("accuracy = "))
    # top1 is the output's own rule: its table; atol the model's (its only output failed)
    assert line.startswith("accuracy = { atol = ") and line.endswith("outputs.logits = { top1 = 0.75 } }"), line
    assert accept.passes(project, job, table.text, [(res, e, a)])
    assert not accept.passes(project, job, table.text.replace("top1 = 0.75", "top1 = 0.76"), [(res, e, a)])


def test_no_table_where_no_tolerance_accepts_it_or_the_precision_search_answers(
        make_project: Callable[..., Path]) -> None:
    project, job = _job(make_project, "cpu")
    e = np.zeros((4, 10), np.float32)
    shape = compare.compare("logits", "d", e, np.zeros((4, 11), np.float32), {"rtol": 1e-4, "atol": 1e-5})
    assert accept.pasteable(project, job, ["logits"], [(shape, e, np.zeros((4, 11), np.float32))]) is None
    nan = e.copy()
    nan[0, 0] = np.nan
    broken = compare.compare("logits", "d", e, nan, {"rtol": 1e-4, "atol": 1e-5})
    assert accept.pasteable(project, job, ["logits"], [(broken, e, nan)]) is None  # NaN: no tolerance accepts it
    _, int8 = _job(make_project, "cpu-int8")
    ea, aa = _logits()
    assert int8.settings.gates is not None
    res = compare.compare("logits", "d", ea, aa, int8.settings.gates.accuracy_rule("int8-dynamic", "logits"))
    assert not res.passed
    assert accept.pasteable(project, int8, ["logits"], [(res, ea, aa)]) is None  # --explain prints its override


def test_the_table_pasted_into_a_child_target_keeps_what_it_inherits(make_project: Callable[..., Path]) -> None:
    # a child's override merges with the overrides it inherits (docs/targets.md): the parent's latency budget for
    # the model stays, the pasted accuracy applies
    project = config.load(make_project("""
        [targets.cpu]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        latency = { p50_ms = 1500 }
        accuracy = { outputs.logits = { top1 = 1.0 } }

        [[targets.cpu.overrides]]
        models = ["tiny_cnn"]
        latency = { p50_ms = 150 }

        [targets.child]
        extends = "cpu"
    """))
    job = plan.jobs(project, ["child"], ["tiny_cnn"])[0]
    e, a = _logits()
    assert job.settings.gates is not None and job.settings.gates.latency.p50_ms == 150
    res = compare.compare("logits", "test_data_set_0", e, a, job.settings.gates.accuracy_rule("fp32", "logits"))
    table = accept.pasteable(project, job, ["logits"], [(res, e, a)])
    assert table is not None and "[[targets.child.overrides]]" in table.text
    pasted_file = project.file.with_name("pasted.toml")  # targets.toml with the printed table pasted at its end
    pasted_file.write_text(project.file.read_text() + "\n" + table.text)
    pasted = config.load(pasted_file, check_files=False).targets["child"].settings["tiny_cnn"].gates
    assert pasted is not None and pasted.latency.p50_ms == 150
    assert pasted.accuracy_rule("fp32", "logits")["top1"] == 0.75
    # a table that would change a budget is not offered
    assert not accept.passes(project, job, table.text + "latency = { p50_ms = 1500 }\n", [(res, e, a)])
