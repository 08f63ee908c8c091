"""The eval gate (task accuracy on labelled data): its statistics against scipy, its metrics against scikit-learn,
the lazy reading of the evaluation set, the config errors, and end to end on PaddleOCR's text-orientation
classifier (rapidocr-onnxruntime's, sha256-pinned) with rendered text lines (tests/evaldata.py, never committed):
a well-calibrated int8 PASSes, one calibrated on constants FAILs with its interval, a small sample is INCONCLUSIVE.
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortbuild.artifact import keys
from ortbuild.errors import ConfigError
from ortbuild.gating import runner
from ortbuild.gating.measure import task_eval as task
from ortbuild.gating.measure import taskmetrics, taskstats
from ortbuild.gating.measure.labelled import EvalData
from ortbuild.gating.record import TestResult
from ortbuild.project import config, plan
from ortbuild.project.settings import EvalSet
from ortbuild.status import Verdict
from tests import evaldata
from tests.conftest import MODELS, REPO, here_runtime, run_cli
from tests.realmodels import installed

CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
CLS_SHA256 = "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
SAMPLES = 600


# ------------------------------------------------------------------------------------------- statistics

@pytest.mark.parametrize(("x", "n", "a"), [(0, 20, 0.025), (1, 1, 0.05), (3, 500, 0.025), (10, 500, 0.025),
                                           (250, 500, 0.005), (497, 500, 0.05), (500, 500, 0.025),
                                           (5000, 10000, 0.001), (7, 1_000_000, 0.025)])
def test_clopper_pearson_bounds_equal_scipys_beta_quantiles(x: int, n: int, a: float) -> None:
    from scipy import stats

    upper = 1.0 if x == n else stats.beta.ppf(1 - a, x + 1, n - x)
    lower = 0.0 if x == 0 else stats.beta.ppf(a, x, n - x + 1)
    assert taskstats.cp_upper(x, n, a) == pytest.approx(upper, abs=1e-10)
    assert taskstats.cp_lower(x, n, a) == pytest.approx(lower, abs=1e-10)
    for p in (0.001, 0.3, 0.5, 0.97):
        assert taskstats.binom_cdf(x, n, p) == pytest.approx(stats.binom.cdf(x, n, p), abs=1e-11)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 7), (3, 10), (10, 3), (5, 5), (40, 1), (193, 32)])
def test_mcnemar_exact_p_value_equals_scipys_binomial_test(b: int, c: int) -> None:
    from scipy import stats

    want = stats.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    assert taskstats.mcnemar_p(b, c) == pytest.approx(want, rel=1e-9)


def test_accuracy_bounds_cover_the_true_drop_at_their_confidence() -> None:
    """Simulated paired samples: the upper bound falls below the true drop in at most 5% of the runs at 95% (and
    the lower bound above it), and the bounds are not vacuous."""
    rng = np.random.default_rng(3)
    n, p_b, p_c = 300, 0.06, 0.02
    true = p_b - p_c
    kinds = rng.choice(3, size=(400, n), p=[p_b, p_c, 1 - p_b - p_c])  # 0: b, 1: c, 2: concordant
    found = [taskstats.accuracy_bounds(int((k == 0).sum()), int((k == 1).sum()), n, 0.95) for k in kinds]
    assert np.mean([f.hi < true for f in found]) <= 0.05
    assert np.mean([f.lo > true for f in found]) <= 0.05
    assert np.median([f.hi - f.lo for f in found]) < 0.1


def test_no_discordant_pair_in_20_samples_cannot_show_a_small_drop() -> None:
    bounds = taskstats.accuracy_bounds(0, 0, 20, 0.95)
    assert bounds.drop == 0 and bounds.hi == pytest.approx(1 - 0.025 ** (1 / 20))
    assert bounds.verdict(0.01) == Verdict.INCONCLUSIVE and bounds.verdict(0.2) == Verdict.PASS
    more = taskstats.needed(bounds, 20, 0.01, (0, 0))
    assert more is not None
    assert taskstats.accuracy_bounds(0, 0, more, 0.95).hi <= 0.01 < taskstats.accuracy_bounds(0, 0, more - 1, 0.95).hi


def test_needed_samples_scale_the_interval_and_would_decide() -> None:
    n, b, c = 400, 14, 6  # drop 0.02, INCONCLUSIVE at max_drop 0.04
    bounds = taskstats.accuracy_bounds(b, c, n, 0.95)
    assert bounds.verdict(0.04) == Verdict.INCONCLUSIVE
    more = taskstats.needed(bounds, n, 0.04, (b, c))
    assert more is not None and more > n
    scale = 1.5 * more / n  # with the observed rates, a bit more than the estimate decides it
    assert taskstats.accuracy_bounds(round(b * scale), round(c * scale), round(n * scale), 0.95).verdict(0.04) == \
        Verdict.PASS
    assert taskstats.needed(dataclasses.replace(bounds, drop=0.04), n, 0.04, (b, c)) is None


def test_the_bootstrap_is_paired_and_deterministic() -> None:
    rng = np.random.default_rng(0)
    err_src = rng.exponential(1.0, 500)
    metric = taskmetrics.Metric("mae", higher_is_better=False)
    labels = np.zeros(500)

    def bounds(art: np.ndarray, seed: int = taskstats.SEED) -> taskstats.Bounds:
        return taskstats.bootstrap_bounds(
            lambda i: -(metric.score(err_src[i], labels[i]) - metric.score(art[i], labels[i])), 500, 0.95, seed=seed)

    shifted = bounds(err_src + 0.1)  # every sample 0.1 worse: paired, the drop has no spread at all
    assert shifted.drop == pytest.approx(0.1) and shifted.lo == pytest.approx(0.1) and shifted.hi == pytest.approx(0.1)
    noisy = err_src + rng.normal(0.1, 0.2, 500)
    first, again, other = bounds(noisy), bounds(noisy), bounds(noisy, seed=1)
    assert first == again and first != other
    assert first.lo < first.drop < first.hi and first.hi - first.lo < 0.1


def test_judge_decides_each_way_and_says_how_many_samples_would_decide() -> None:
    metric = taskmetrics.Metric("accuracy", True)
    labels = np.zeros(1000, np.int64)
    src = labels.copy()
    art = labels.copy()
    art[:100] = 1  # 10 points worse
    verdict, section, lines = task.judge("t/m", metric, src, art, labels, 0.02, 0.95)
    assert verdict == Verdict.FAIL and section["discordant"] == {  # type: ignore[comparison-overlap]
        "source_right_artifact_wrong": 100, "artifact_right_source_wrong": 0, "mcnemar_p": pytest.approx(2 ** -99)}
    lo, hi = section["interval"]  # type: ignore[misc]
    assert lo > 0.02 and f"interval [{lo:.4g}, {hi:.4g}]" in lines[0] and "t/m accuracy dropped 0.1" in lines[0]
    verdict, section, lines = task.judge("t/m", metric, src, art, labels, 0.2, 0.95)
    assert verdict == Verdict.PASS and not lines
    few = np.zeros(50, np.int64)
    few[:5] = 1  # 5 of 50 wrong: [0.02, 0.24] holds 0.15
    verdict, section, lines = task.judge("t/m", metric, src[:50], few, labels[:50], 0.15, 0.95)
    assert verdict == Verdict.INCONCLUSIVE and not lines and "samples (of 50 now) would probably decide" in \
        str(section["note"])


def test_a_bootstrap_on_too_few_samples_is_inconclusive() -> None:
    metric = taskmetrics.Metric("f1", True)
    labels = np.arange(60) % 2
    verdict, section, _ = task.judge("t/m", metric, labels, labels, labels, 0.01, 0.95)
    assert verdict == Verdict.INCONCLUSIVE and "60 samples are too few" in str(section["note"])
    labels = np.arange(200) % 2
    verdict, section, _ = task.judge("t/m", metric, labels, labels, labels, 0.01, 0.95)
    assert verdict == Verdict.PASS and section["interval"] == [0.0, 0.0]


def test_an_artifact_whose_outputs_are_not_finite_fails_naming_the_samples() -> None:
    labels = np.zeros((200, 3))
    src = np.abs(np.random.default_rng(0).normal(size=(200, 3)))
    art = src.copy()
    art[[5, 17]] = np.nan
    mae = taskmetrics.Metric("mae", False)
    verdict, section, lines = task.judge("t/m", mae, mae.keep(src, labels, "y"), mae.keep(art, labels, "y"), labels,
                                         0.1, 0.95)
    assert verdict == Verdict.FAIL and section["non_finite"] == {"samples": 2, "first": [5, 17]}
    assert "t/m: the artifact's output is NaN or infinite on 2 of 200 samples (5, 17)" in lines[0]
    json.dumps(section, allow_nan=False, default=str)  # no NaN in the report
    custom = taskmetrics.Metric("pkg.mod:f", True, lambda p, lab: 1.0)
    assert task.judge("t/m", custom, src, art, labels, 0.1, 0.95)[0] == Verdict.FAIL
    bad_labels = labels.copy()
    bad_labels[3, 1] = np.inf
    for source, lab, key, said in [(art, labels, "inputs", "source's output 'y' is NaN or infinite on 2 of 200 "
                                    "samples (5, 17)"), (src, bad_labels, "labels", "on 1 of 200 samples (3)")]:
        with pytest.raises(ConfigError) as e:  # the evaluation set's fault, not the artifact's
            task.check_source(mae, mae.keep(source, lab, "y"), lab, "targets.toml", "models.m.eval", "y")
        assert e.value.where == f"models.m.eval.{key}" and said in e.value.detail, str(e.value)
    task.check_source(mae, mae.keep(src, labels, "y"), labels, "targets.toml", "models.m.eval", "y")


# ---------------------------------------------------------------------------------------------- metrics

def test_metrics_equal_scikit_learns() -> None:
    from sklearn.metrics import f1_score, mean_absolute_error

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 300)
    scores = rng.normal(size=(300, 4)) + 2 * np.eye(4)[labels]
    for name in ("accuracy", "f1"):
        m = taskmetrics.resolve(name, Path("."), "targets.toml", "models.m.eval")
        pred = m.keep(scores, labels, "logits")
        want = np.mean(pred == labels) if name == "accuracy" else f1_score(labels, pred, average="macro")
        assert m.score(pred, labels) == pytest.approx(want)
    binary = rng.integers(0, 2, 50)
    guess = rng.integers(0, 2, 50)
    assert taskmetrics.macro_f1(guess, binary) == pytest.approx(f1_score(binary, guess, average="macro"))
    assert taskmetrics.classes(np.array([3, 1, 2]), "label").tolist() == [3, 1, 2]  # a label output is the class
    target = rng.normal(size=(300, 3))
    out = target + rng.normal(size=(300, 3))
    mae = taskmetrics.resolve("mae", Path("."), "targets.toml", "models.m.eval")
    assert not mae.higher_is_better
    assert mae.score(mae.keep(out, target, "y"), target) == pytest.approx(mean_absolute_error(target, out))
    with pytest.raises(ValueError, match="labels of the output's shape"):
        mae.keep(out, target[:, :2], "y")


def test_a_custom_metric_is_imported_from_the_project_folder(tmp_path: Path) -> None:
    (tmp_path / "mymetrics").mkdir()
    (tmp_path / "mymetrics" / "__init__.py").write_text("")
    (tmp_path / "mymetrics" / "score.py").write_text(textwrap.dedent("""
        import numpy as np
        def top2(predictions, labels):
            top = np.argsort(predictions, axis=1)[:, -2:]
            return float(np.mean([label in row for row, label in zip(top, labels)]))
        def error(predictions, labels):
            return float(np.abs(predictions[:, 0] - labels).mean())
        error.higher_is_better = False
        not_a_function = 3
        def broken(predictions, labels):
            raise KeyError("oops")
    """))
    m = taskmetrics.resolve("mymetrics.score:top2", tmp_path, "targets.toml", "models.m.eval")
    scores = np.array([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05]])
    assert m.higher_is_better and m.score(m.keep(scores, np.array([2, 1]), "y"), np.array([2, 1])) == 0.5
    assert not taskmetrics.resolve("mymetrics.score:error", tmp_path, "targets.toml", "models.m.eval").higher_is_better
    for spec, said in [("mymetrics.nothere:f", "cannot import 'mymetrics.nothere': ModuleNotFoundError"),
                       ("mymetrics.score:missing", "has no 'missing'"),
                       ("mymetrics.score:not_a_function", "is a int, not a function")]:
        with pytest.raises(ConfigError, match=r"models\.m\.eval\.metric") as e:
            taskmetrics.resolve(spec, tmp_path, "targets.toml", "models.m.eval")
        assert said in str(e.value) and e.value.hint and "package.module:function" in e.value.hint
    labels = np.arange(200) % 3
    rows = np.eye(3)[labels]
    assert task.judge("t/m", m, rows, rows, labels, 0.0, 0.95)[0] == Verdict.PASS  # the same rows: no drop at all
    error = taskmetrics.resolve("mymetrics.score:error", tmp_path, "targets.toml", "models.m.eval")
    verdict, section, lines = task.judge("t/m", error, rows, rows + 0.5, np.zeros(200), 0.1, 0.95)
    assert verdict == Verdict.FAIL and section["drop"] == pytest.approx(0.5) and not section["higher_is_better"]
    assert "t/m mymetrics.score:error dropped 0.5" in lines[0]  # lower is better: its increase is the drop
    broken = taskmetrics.resolve("mymetrics.score:broken", tmp_path, "targets.toml", "models.m.eval")
    with pytest.raises(ConfigError, match="raised KeyError"):
        broken.score(scores, np.array([0, 1]))


# ---------------------------------------------------------------------------------------- lazy reading

def _evalset(inputs: Path, labels: Path, **kw: Any) -> EvalSet:
    return EvalSet(inputs=inputs, labels=labels, **kw)


def test_the_inputs_are_read_a_batch_at_a_time(tmp_path: Path) -> None:
    x = np.arange(4000 * 2000, dtype=np.float32).reshape(4000, 2000)  # 32 MB
    np.savez_compressed(tmp_path / "big.npz", x=x, y=np.arange(4000, dtype=np.int64))
    np.save(tmp_path / "labels.npy", np.arange(4000) % 3)
    data = EvalData(_evalset(tmp_path / "big.npz", tmp_path / "labels.npy"), "targets.toml", "models.m.eval")
    del x
    tracemalloc.start()
    seen = 0
    for b in data.batches(32):
        assert b.start == seen and np.array_equal(b.feed["y"], np.arange(seen, seen + b.count))
        assert b.feed["x"][0, 0] == seen * 2000
        seen += b.count
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seen == 4000 and peak < 4 << 20, f"reading 32 MB of inputs took {peak >> 20} MiB at once"


def test_a_directory_is_read_file_by_file_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for i, part in enumerate(np.array_split(np.arange(25, dtype=np.float32), 3)):
        np.savez(tmp_path / "d" / f"part{i}.npz", x=part[:, None])
    np.save(tmp_path / "labels.npy", np.arange(25))
    data = EvalData(_evalset(tmp_path / "d", tmp_path / "labels.npy", max_samples=20), "t.toml", "models.m.eval")
    got = list(data.batches(4, pad_to=4))
    assert [(b.start, b.count) for b in got] == [(0, 4), (4, 4), (8, 1), (9, 4), (13, 4), (17, 3)]
    assert got[2].feed["x"].ravel().tolist() == [8, 8, 8, 8]  # padded with its last sample to the fixed size
    assert np.concatenate([b.feed["x"][:b.count] for b in got]).ravel().tolist() == list(range(20))
    fortran = np.asfortranarray(np.arange(30, dtype=np.int64).reshape(10, 3))
    np.savez(tmp_path / "f.npz", x=fortran)
    np.savez(tmp_path / "labels.npz", whatever=np.arange(10))
    data = EvalData(_evalset(tmp_path / "f.npz", tmp_path / "labels.npz"), "t.toml", "models.m.eval")
    assert np.array_equal(np.concatenate([b.feed["x"] for b in data.batches(3)]), fortran)


def test_broken_evaluation_sets_are_config_errors_naming_the_key(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", x=np.zeros((5, 2), np.float32), y=np.zeros((4, 2), np.float32))
    np.savez(tmp_path / "ok.npz", x=np.zeros((5, 2), np.float32))
    np.save(tmp_path / "four.npy", np.arange(4))
    np.save(tmp_path / "five.npy", np.arange(5))
    np.savez(tmp_path / "two.npz", a=np.arange(5), b=np.arange(5))
    (tmp_path / "empty").mkdir()
    for inputs, labels, key, said in [
            ("x.npz", "five.npy", "inputs", "first axes differ"),
            ("ok.npz", "four.npy", "labels", "holds 4 labels, the inputs 5 samples"),
            ("ok.npz", "two.npz", "labels", "holds 2 arrays"),
            ("empty", "five.npy", "inputs", "holds no .npz files")]:
        with pytest.raises(ConfigError) as e:
            EvalData(_evalset(tmp_path / inputs, tmp_path / labels), "targets.toml", "models.m.eval")
        assert e.value.where == f"models.m.eval.{key}" and said in e.value.detail, str(e.value)
    with pytest.raises(ConfigError, match="non-integral values"):
        taskmetrics.class_labels(np.array([0.5, 1.0]), "targets.toml", "models.m.eval")


# ------------------------------------------------------------------------------------------ config load

def _project(tmp_path: Path, model_eval: str, target_eval: str = "eval = { max_drop = 0.01 }") -> Path:
    np.savez(tmp_path / "eval.npz", x=np.zeros((3, 1, 4, 4), np.float32))
    np.save(tmp_path / "labels.npy", np.arange(3))
    (tmp_path / "targets.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "t"
        version = "1"

        [models.tiny_cnn]
        path = "{MODELS / 'tiny_cnn.onnx'}"
        inputs = "{MODELS / 'tiny_cnn.inputs.npz'}"
        {model_eval}

        [targets.cpu]
        runtime = "{here_runtime()}"
        providers = ["CPUExecutionProvider"]
        {target_eval}
    """))
    return tmp_path / "targets.toml"


@pytest.mark.parametrize(("model_eval", "target_eval", "key", "said"), [
    ('eval = { inputs = "nothere.npz", labels = "labels.npy" }', "", "models.tiny_cnn.eval.inputs",
     "'nothere.npz' does not exist"),
    ('eval = { inputs = "eval.npz", labels = "eval.txt" }', "", "models.tiny_cnn.eval.labels", "does not exist"),
    ('eval = { inputs = "eval.npz", labels = "targets.toml" }', "", "models.tiny_cnn.eval.labels",
     "is not .npy or .npz"),
    ('eval = { inputs = "eval.npz" }', "", "models.tiny_cnn.eval", "missing required key 'labels'"),
    ('eval = { inputs = "eval.npz", labels = "labels.npy", metric = "acuracy" }', "", "models.tiny_cnn.eval.metric",
     "did you mean 'accuracy'?"),
    ('eval = { inputs = "eval.npz", labels = "labels.npy", metric = "not a path" }', "",
     "models.tiny_cnn.eval.metric", "nor a custom metric"),
    ("", "eval = { max_drop = 0.01 }", "targets.cpu.eval.max_drop", "model 'tiny_cnn' has no labelled evaluation set"),
    ('eval = { inputs = "eval.npz", labels = "labels.npy" }', "eval = { max_drop = 0.01, confidence = 0.3 }",
     "targets.cpu.eval.confidence", "must be in [0.5, 1)"),
    ('eval = { inputs = "eval.npz", labels = "labels.npy" }', "eval = { max_drop = -1 }", "targets.cpu.eval.max_drop",
     "must be a number from 0"),
])
def test_config_errors_name_the_key_and_what_to_do(tmp_path: Path, model_eval: str, target_eval: str, key: str,
                                                   said: str) -> None:
    with pytest.raises(ConfigError) as e:
        config.load(_project(tmp_path, model_eval, target_eval))
    assert e.value.where == key and said in e.value.detail, str(e.value)


def test_a_loaded_evaluation_set_and_budget(tmp_path: Path) -> None:
    project = config.load(_project(tmp_path, 'eval = { inputs = "eval.npz", labels = "labels.npy", metric = "f1", '
                                             'max_samples = 2 }'))
    ev = project.models["tiny_cnn"].eval
    assert ev == EvalSet(inputs=tmp_path / "eval.npz", labels=tmp_path / "labels.npy", metric="f1", max_samples=2)
    gates = project.targets["cpu"].settings["tiny_cnn"].gates
    assert gates is not None and gates.eval.max_drop == 0.01 and gates.eval.confidence == 0.95
    assert "eval" not in project.targets["cpu"].settings["tiny_cnn"].as_json()  # a budget: not in the build key


# --------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def ocr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/testing.md's example: three int8-static builds of the orientation classifier, calibrated on rendered
    text lines (good), on constants (bad), and the good one judged on 20 samples of a directory of files (small)."""
    root = tmp_path_factory.mktemp("eval")
    evaldata.write(root, SAMPLES, seed=1)
    (root / "small").mkdir()
    evaldata.write(root / "small", 60, seed=2, files=3)
    calibration, _ = evaldata.lines(24, seed=99)
    np.savez(root / "calib.npz", x=calibration)
    np.savez(root / "const.npz", x=np.zeros_like(calibration))
    np.savez(root / "golden.npz", x=calibration[:2])
    model = installed("rapidocr-onnxruntime", CLS, CLS_SHA256)
    (root / "targets.toml").write_text('[project]\nname = "ocr"\nversion = "1"\n\n' + _documented_project()
                                       .replace(f"models/{CLS}", str(model))
                                       .replace('"onnxruntime==1.31.1"', f'"{here_runtime()}"'))
    proc = run_cli("build", "-c", str(root / "targets.toml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


def _documented_project() -> str:
    """docs/testing.md's example of the eval gate: this project."""
    text = (REPO / "docs" / "testing.md").read_text()
    (block,) = [b for b in re.findall(r"^```toml\n(.*?)^```", text, flags=re.S | re.M) if "[models.cls_const]" in b]
    return block


def _gate(root: Path, target: str, change: Callable[[EvalSet], EvalSet] = lambda ev: ev) -> task.Result:
    """The gate in this process, as the registry calls it (`change`: the model's evaluation set, changed)."""
    project = config.load(root / "targets.toml")
    job = plan.jobs(project, [target], None)[0]
    assert job.model.eval is not None
    job = dataclasses.replace(job, model=dataclasses.replace(job.model, eval=change(job.model.eval)))
    tester = runner.Tester(project, root / "dist", keys.read_secrets().secret, "targets.toml", lambda j, s: None)
    return task.gate(tester.open(job, TestResult(target, job.model.name, job.settings.precision), {}))


@pytest.mark.e2e
def test_the_int8_artifacts_are_judged_on_their_task_metric_through_ortbuild_test(ocr: Path) -> None:
    proc = run_cli("test", "-c", str(ocr / "targets.toml"), "--json")
    assert proc.returncode == 9, proc.stderr[-3000:]  # the constant-calibrated artifact fails
    results = {r["target"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["good"]["status"] == "PASS", results["good"]
    bad = results["bad"]
    assert bad["status"] == "FAIL" and bad["accuracy"] == "PASS"  # the golden check (cosine >= 0) lets it through
    line = next(f for f in bad["failures"] if f.startswith("eval: bad/cls_const accuracy dropped"))
    assert "with 95% confidence (interval [" in line and "> max_drop 0.03" in line
    small = results["small"]
    print(small["reason"], bad["failures"], sep="\n")
    assert small["status"] == "INCONCLUSIVE" and "samples (of 20 now) would probably decide it" in small["reason"]
    # the record keeps each section under the gate's name: what the reports and the release index read
    assert [results[t]["sections"]["eval"]["verdict"] for t in ("good", "bad", "small")] == [
        "PASS", "FAIL", "INCONCLUSIVE"]
    assert bad["failed_gates"] == ["eval"] and bad["sections"]["eval"]["budget"]["max_drop"] == 0.03


@pytest.mark.e2e
def test_the_report_sections_hold_the_scores_interval_and_counts(ocr: Path) -> None:
    import onnxruntime as ort
    from scipy import stats

    labels = np.load(ocr / "labels.npy")
    source = ort.InferenceSession(str(installed("rapidocr-onnxruntime", CLS, CLS_SHA256)))
    x = np.load(ocr / "eval.npz")["x"]
    fp32 = np.mean(np.concatenate([source.run(None, {"x": x[i:i + 64]})[0].argmax(1)
                                   for i in range(0, SAMPLES, 64)]) == labels)
    print(f"fp32 accuracy of the orientation classifier on {SAMPLES} rendered lines: {fp32:.3f}")
    assert fp32 > 0.9  # the rendered data is what the classifier knows: far above chance (0.5)
    for target, want in (("good", Verdict.PASS), ("bad", Verdict.FAIL)):
        verdict, section, lines = _gate(ocr, target)
        print(target, json.dumps(section))
        assert verdict == want and section["verdict"] == want and bool(lines) == (want == Verdict.FAIL)
        assert section["samples"] == SAMPLES and section["source"] == pytest.approx(fp32)
        counts: Any = section["discordant"]
        b, c = counts["source_right_artifact_wrong"], counts["artifact_right_source_wrong"]
        assert section["drop"] == pytest.approx(section["source"] - section["artifact"])  # type: ignore[operator]
        assert section["drop"] == pytest.approx((b - c) / SAMPLES)
        a = 0.025
        hi = stats.beta.ppf(1 - a, b + 1, SAMPLES - b) - (stats.beta.ppf(a, c, SAMPLES - c + 1) if c else 0)
        assert section["interval"][1] == pytest.approx(hi, abs=1e-9)  # type: ignore[index]
    verdict, section, _ = _gate(ocr, "bad")
    assert section["artifact"] < 0.85 and section["interval"][0] > 0.03  # type: ignore[index,operator]


@pytest.mark.e2e
def test_f1_is_bootstrapped_on_the_same_samples(ocr: Path) -> None:
    verdict, section, _ = _gate(ocr, "bad", lambda ev: dataclasses.replace(ev, metric="f1", batch=50))
    assert verdict == Verdict.FAIL and section["metric"] == "f1" and section["batch"] == 50
    assert "paired percentile bootstrap" in str(section["method"]) and "discordant" not in section
    lo, hi = section["interval"]  # type: ignore[misc]
    assert 0.03 < lo < section["drop"] < hi  # type: ignore[operator]
