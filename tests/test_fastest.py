"""Build to the fastest artifact that passes (ortbuild/gating/search/fastest.py, `candidates` on a target): the rule
on measured ratios, and real builds of a small model whose int8 fails its accuracy rule until one MatMul stays in
float (tests/test_explain.py's `emb_model`)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from ortbuild.errors import ConfigError, GateFailed
from ortbuild.gating.search.fastest import FP32, TIE, Option, Tried, choose
from ortbuild.gating.search.tune_search import Comparison
from ortbuild.project import speedup
from tests.conftest import run_cli
from tests.test_explain import _emb_project


def _tried(label: str, precision: str, ratio: float | None, low: float | None = None, high: float | None = None,
           *, size: int = 100, passed: bool = True, shippable: bool = True) -> Tried:
    c = None if ratio is None else Comparison(ratio, low, high, 0.99, ratio, 1.0, 200)
    return Tried(Option(label, {} if label.endswith("(declared)") else {"precision": precision}, precision,
                        shippable), passed=passed, worst="cosine 0.999" if passed else "cosine 0.9", size=size,
                 comparison=c)


def test_a_reduced_precision_measured_slower_falls_back_to_fp32_where_fp32_is_a_candidate() -> None:
    int8 = _tried("int8-dynamic (declared)", "int8-dynamic", 3.3, 3.1, 3.5, size=25)
    fp32 = _tried(FP32, FP32, None, size=100)
    pick, why = choose([int8, fp32])
    assert pick is fp32
    assert "measured slower than fp32: int8-dynamic (declared) (3.30x fp32's time [3.10, 3.50]" in why


def test_a_reduced_precision_measured_slower_never_ships_when_fp32_is_no_candidate() -> None:
    int8 = _tried("int8-dynamic (declared)", "int8-dynamic", 1.6, 1.5, 1.7, size=25)
    ref = _tried("fp32 (the reference, not a candidate)", FP32, None, shippable=False)
    pick, why = choose([int8, ref])
    assert pick is None
    assert why.startswith("measured slower than fp32 on this CPU: int8-dynamic (declared) takes 1.60x")
    assert why.endswith("and fp32 is not a candidate")


def test_as_fast_as_fp32_within_the_noise_ships_the_smallest_artifact() -> None:
    # 1.02x with an interval across 1: no measured cost, and a quarter of the bytes
    int8 = _tried("int8-dynamic (declared)", "int8-dynamic", 1.02, 0.97, 1.08, size=25)
    fp32 = _tried(FP32, FP32, None, size=100)
    pick, why = choose([int8, fp32])
    assert pick is int8
    assert f"the smallest of those within {TIE:.0%} of the fastest (fp32" in why
    # measured slower beyond the tie (interval above 1): fp32, though bigger
    pick, _ = choose([_tried("int8-dynamic (declared)", "int8-dynamic", 1.08, 1.06, 1.10, size=25), fp32])
    assert pick is fp32


def test_the_fastest_passing_candidate_wins_and_a_failing_one_never_ships() -> None:
    dyn = _tried("int8-dynamic (declared)", "int8-dynamic", 0.70, 0.65, 0.75, size=30)
    static = _tried("int8-static", "int8-static", 0.30, 0.28, 0.33, size=30, passed=False)
    per_tensor = _tried("int8-dynamic quantization { per_channel = false }", "int8-dynamic", 0.50, 0.45, 0.55,
                        size=31)
    ref = _tried("fp32 (the reference, not a candidate)", FP32, None, shippable=False)
    pick, why = choose([dyn, static, per_tensor, ref])
    assert pick is per_tensor and why.endswith("the fastest that passes")
    pick, why = choose([_tried("int8-dynamic (declared)", "int8-dynamic", 0.5, passed=False), ref])
    assert pick is None and why.startswith("no candidate passes its accuracy gate: int8-dynamic (declared): cosine")


def _project(tmp_path: Path, extra: str) -> Path:
    path = _emb_project(tmp_path)
    path.write_text(path.read_text() + extra)
    return path


def _build(path: Path, *args: str) -> tuple[int, dict[str, dict[str, object]], str]:
    proc = run_cli("build", "-c", str(path), "--json", *args)
    jobs = {f"{j['target']}/{j['model']}": j for j in json.loads(proc.stdout)["jobs"]} if proc.stdout else {}
    return proc.returncode, jobs, proc.stderr


@pytest.mark.runtime
def test_int8_that_fails_its_gate_ships_fp32_and_the_lock_says_why_where_and_is_checked(tmp_path: Path) -> None:
    path = _project(tmp_path, 'candidates = ["fp32"]\n')
    code, jobs, err = _build(path)
    assert code == 0, err[-3000:]
    assert jobs["int8/emb"]["precision"] == "fp32"
    entry = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]["int8/emb"]
    assert entry["applies"] == {"precision": "fp32"}
    choice = entry["choice"]
    assert choice["chosen"] == "fp32" and choice["cpu"] == speedup.level() and choice["all_measured"] is True
    assert choice["measured"][0].startswith("int8-dynamic (declared): not shippable: y: cosine 0.99")
    assert choice["measured"][1].startswith("fp32: accuracy PASS (y: ")
    manifest = json.loads((tmp_path / "dist" / "int8" / "emb" / "manifest.json").read_text())
    assert manifest["locked"]["applies"] == {"precision": "fp32"}
    # the lock settles it: --locked builds nothing new
    code, jobs, err = _build(path, "--locked")
    assert code == 0 and jobs["int8/emb"]["status"] == "up-to-date", err
    # measured on another CPU: said, not refused
    lock = tmp_path / "targets.lock"
    lock.write_text(lock.read_text().replace(f'cpu = "{speedup.level()}"', 'cpu = "x86-64-v3"'))
    code, _, err = _build(path, "--locked")
    assert code == 0
    assert "the choice of int8/emb (fp32) was measured on an x86-64-v3 CPU" in err
    assert "delete the entry to measure the candidates here" in err
    # a lock may only choose among the target's candidates: no other precision, no other option
    for bad in ('applies = { precision = "fp16" }', 'applies = { precision = "fp32", quantization = { '
                                                    'per_channel = true } }'):
        lock.write_text(lock.read_text().replace('applies = { precision = "fp32" }', bad))
        code, _, err = _build(path)
        assert code == ConfigError.exit_code
        assert 'targets.lock: [jobs."int8/emb".applies] chooses' in err and "not one of the target's candidates" in err
        lock.write_text(lock.read_text().replace(bad, 'applies = { precision = "fp32" }'))


@pytest.mark.runtime
def test_with_precision_search_a_failing_candidate_is_repaired_then_timed_against_fp32(tmp_path: Path) -> None:
    path = _project(tmp_path, 'precision_search = "auto"\ncandidates = ["fp32"]\n')
    code, jobs, err = _build(path)
    assert code == 0, err[-3000:]
    entry = tomllib.loads((tmp_path / "targets.lock").read_text())["jobs"]["int8/emb"]
    int8, fp32 = entry["choice"]["measured"]
    assert int8.startswith("int8-dynamic (declared): accuracy PASS (y: cosine 0.99")
    assert 'kept { quantization = { exclude_nodes = ["fc"] } } in float' in int8
    assert "x fp32's time [" in int8  # timed, with its interval
    assert fp32.startswith("fp32: accuracy PASS")
    # what shipped is what the rule chose from those measurements, and the lock lays exactly that over the job
    chosen = entry["choice"]["chosen"]
    assert chosen in ("fp32", "int8-dynamic (declared)")
    assert entry["applies"] == ({"precision": "fp32"} if chosen == "fp32" else
                                {"quantization": {"exclude_nodes": ["fc"]}})
    assert entry["search"]["result"].startswith(("repaired as the candidate", "passes as the candidate"))
    assert jobs["int8/emb"]["precision"] == ("fp32" if chosen == "fp32" else "int8-dynamic")
    assert _build(path, "--locked")[0] == 0


@pytest.mark.runtime
def test_no_shippable_candidate_fails_the_build_with_the_table(tmp_path: Path) -> None:
    path = _project(tmp_path, 'candidates = [{ precision = "int8-dynamic", quantization = { per_channel = true } }]\n')
    path.write_text(path.read_text().replace("cosine = 0.999 }", "cosine = 0.999999 }"))  # no int8 passes
    code, jobs, err = _build(path)
    assert code == GateFailed.exit_code
    assert jobs["int8/emb"]["status"] == "failed"
    error = jobs["int8/emb"]["error"]
    assert isinstance(error, dict)
    assert error["message"].startswith("int8/emb: no candidate may ship (no candidate passes its accuracy gate")
    assert "int8-dynamic quantization { per_channel = true }: not shippable: y: cosine" in error["message"]
    assert 'add "fp32" to the target\'s candidates' in error["hint"]
    assert not err  # --json: it is all in the document
    assert not (tmp_path / "targets.lock").exists()


@pytest.mark.parametrize(("candidates", "where", "says"), [
    ('["fp64"]', "targets.int8.candidates[0].precision", "'fp64' is not one of fp32"),
    ('["int8-static"]', "targets.int8.candidates[0].precision", "int8-static needs calibration data"),
    ('["fp32", "fp32"]', "targets.int8.candidates[1]", '{"precision": "fp32"} is listed twice'),
    ('[{ precision = "fp16", quantization = { per_channel = 3 } }]',
     "targets.int8.candidates[0].quantization.per_channel", "must be true or false"),
])
def test_bad_candidates_are_config_errors_naming_the_entry(tmp_path: Path, candidates: str, where: str,
                                                           says: str) -> None:
    path = _project(tmp_path, f"candidates = {candidates}\n")
    proc = run_cli("plan", "-c", str(path))
    assert proc.returncode == ConfigError.exit_code
    assert f"[{where}]" in proc.stderr and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_candidates_of_a_target_this_machine_emulates_are_refused_not_timed_under_emulation(tmp_path: Path) -> None:
    from ortbuild import emulation

    if emulation.host() == "linux-aarch64":
        pytest.skip("this machine is an aarch64 one: a linux-aarch64 target's candidates are timed here")
    path = _project(tmp_path, 'platform = "linux-aarch64"\noptimization = "extended"\ncandidates = ["fp32"]\n')
    code, jobs, _ = _build(path)
    assert code != 0 and jobs["int8/emb"]["status"] == "failed"
    error = jobs["int8/emb"]["error"]
    assert isinstance(error, dict)
    assert error["message"].startswith("[targets.int8] candidates: a linux-aarch64 target's candidates are timed on "
                                       "the machine it runs on, and this one emulates it")
    assert "set `candidates = []` on it" in error["hint"]
    assert not (tmp_path / "targets.lock").exists()
