"""The searches' common part (ortbuild/gating/search/base.py): one Budget, its Clock (seconds and rebuilds, never
negative), and the `Search` protocol that precision bisection (explain.Explainer), build to the gates
(autobuild.AutoSearch and each kind's search) and session tuning (tune.Tuner) implement, each reporting `cut_short`
when its budget ends it, on the real examples the searches' own tests use."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.gating import runner
from ortbuild.gating.record import TestResult
from ortbuild.gating.records import ExplainDoc
from ortbuild.gating.search import autobuild, explain, gensearch, tune
from ortbuild.gating.search.base import Budget, Found, Locking, Search
from ortbuild.gating.search.tune_search import NOT_TRIED, Tuning
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.job import JobResult
from ortbuild.project import plan
from ortbuild.status import JobStatus, Verdict
from tests.test_tune import parts


class Ticks:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_clock_is_exhausted_by_its_seconds() -> None:
    t = Ticks()
    clock = Budget(rebuilds=None, seconds=10.0).start(t)
    assert clock.spent() == 0.0 and clock.left() == 10.0 and not clock.exhausted() and clock.deadline == 110.0
    t.now += 4
    assert clock.spent() == 4.0 and clock.left() == 6.0 and clock.within(0.5) and not clock.within(0.4)
    t.now += 6
    assert clock.out_of_time() and clock.exhausted() and not clock.out_of_rebuilds() and clock.left() == 0.0
    assert clock.rebuilds_left() is None  # no bound on rebuilds: only the seconds end it


def test_a_clock_is_exhausted_by_its_rebuilds() -> None:
    clock = Budget(rebuilds=2, seconds=60.0).start(Ticks())
    assert clock.rebuilds_left() == 2 and not clock.exhausted()
    clock.rebuilt()
    assert clock.rebuilds_left() == 1 and not clock.exhausted()
    clock.rebuilt()
    assert clock.out_of_rebuilds() and clock.exhausted() and not clock.out_of_time()
    clock.rebuilt(3)  # a search that went past its bound (the rebuild into dist/ after it): still never negative
    assert clock.rebuilds == 5 and clock.rebuilds_left() == 0
    assert Budget(rebuilds=0, seconds=60.0).start().exhausted()


def test_a_clock_is_never_negative() -> None:
    t = Ticks()
    clock = Budget(rebuilds=1, seconds=5.0).start(t)
    t.now -= 50  # a clock that went back
    assert clock.spent() == 0.0 and clock.left() == 5.0
    t.now += 1000
    assert clock.left() == 0.0 and clock.spent() == 950.0
    found = clock.found("answer", found=False, cut_short=True)
    assert found == Found("answer", found=False, cut_short=True, rebuilds=0, seconds=950.0)


def test_a_budget_is_a_value() -> None:
    b = Budget(rebuilds=16, seconds=300.0)
    assert b == Budget(16, 300.0) and hash(b) == hash(Budget(16, 300.0))
    with pytest.raises(AttributeError):
        b.seconds = 1.0  # type: ignore[misc]
    first, second = b.start(), b.start()
    first.rebuilt()
    assert second.rebuilds == 0  # each start is its own count


# ------------------------------------------------------------------------------------------ the searches


def _quiet(job: str, message: object) -> None:
    pass


def test_every_search_is_a_search(tmp_path: Path) -> None:
    from tests.test_explain import _emb_project

    _, builder, tester = parts(_emb_project(tmp_path))
    budget = Budget(rebuilds=1, seconds=1.0)
    locking = Locking(builder, _quiet)
    # mypy checks each against the protocol, isinstance at run time
    bisection: Search[TestResult, ExplainDoc] = explain.Explainer(builder, tester, budget, progress=_quiet)
    to_the_gates: Search[JobResult, JobResult] = autobuild.AutoSearch(builder, tester, budget, progress=_quiet)
    onnx: Search[JobResult, JobResult] = autobuild.PrecisionSearch(locking, tester, budget, _quiet)
    generative: Search[JobResult, JobResult] = gensearch.GenerativeSearch(locking, tester, budget, _quiet)
    tuning: Search[plan.Job | None, Tuning] = tune.Tuner(tester, budget)
    searches: list[object] = [bisection, to_the_gates, onnx, generative, tuning]
    assert all(isinstance(s, Search) and s.budget is budget for s in searches)
    assert not isinstance(object(), Search)
    assert set(autobuild.SEARCHES) == {"onnx", "generative"}  # one search per kind of model


def _failing_emb(tmp_path: Path) -> tuple[plan.Job, Builder, runner.Tester, JobResult, TestResult]:
    """tests/test_explain.py's embedding model under an accuracy rule no set kept in float meets, built and judged."""
    from tests.test_explain import _emb_project

    path = _emb_project(tmp_path)
    path.write_text(path.read_text().replace("cosine = 0.999 }", "cosine = 0.9999999 }"))
    project, builder, tester = parts(path)
    (job,) = plan.jobs(project)
    built = builder.run_job(job)
    assert built.status == JobStatus.BUILT, built.reason
    res = TestResult(job.target.name, job.model.name, job.settings.precision)
    tester.accuracy_gate(job, res)
    assert res.accuracy == Verdict.FAIL, res.worst
    return job, builder, tester, built, res


@pytest.mark.runtime
def test_precision_bisection_and_build_to_the_gates_are_cut_short_by_one_rebuild(tmp_path: Path) -> None:
    job, builder, tester, built, res = _failing_emb(tmp_path)
    tiny = Budget(rebuilds=1, seconds=300.0)
    found = explain.Explainer(builder, tester, tiny, progress=_quiet, final_gate=False).search(job, res)
    assert found.cut_short and not found.found and found.rebuilds == 1 and found.seconds > 0
    assert found.answer["status"] == "not found" and "stopped after 1 rebuilds" in found.answer["reason"]
    auto = autobuild.AutoSearch(builder, tester, tiny, progress=_quiet)
    found_auto = auto.search(job, built)
    assert found_auto.cut_short and not found_auto.found and found_auto.rebuilds == 1
    assert found_auto.answer.status == JobStatus.FAILED and not auto.locked
    assert not (tmp_path / "targets.lock").exists()


def test_the_generative_search_is_cut_short_before_its_first_rebuild(tmp_path: Path) -> None:
    """tests/test_gensearch.py's stub model: no rebuild allowed, no setting tried (nothing is built)."""
    from tests.test_gensearch import _job

    job = _job(tmp_path, "int4-weight", "int4 = { block_size = 64, accuracy_level = 4 }")
    _, builder, tester = parts(tmp_path / "targets.toml")
    failed = JobResult(job.target.name, job.model.name, JobStatus.FAILED, precision=job.settings.precision)
    search = gensearch.GenerativeSearch(Locking(builder, _quiet), tester, Budget(rebuilds=0, seconds=60.0), _quiet)
    found = search.repair(job, failed, "tokens gate FAIL (a test)")
    assert found.cut_short and not found.found and found.rebuilds == 0
    assert found.answer.status == JobStatus.FAILED and found.answer.error is not None
    assert "(stopped before trying a setting: --explain-rebuilds 0)" in found.answer.error.message


@pytest.mark.runtime
def test_tuning_is_cut_short_by_a_tiny_budget(make_project: Callable[..., Path]) -> None:
    from tests.test_tune import TARGETS

    project, builder, tester = parts(make_project(TARGETS))
    (job,) = plan.jobs(project, ["cpu-int8"])
    assert builder.run_job(job).status == JobStatus.BUILT
    found = tune.Tuner(tester, Budget(rebuilds=None, seconds=1e-3)).search(job, None)
    assert found.cut_short and found.rebuilds == 0
    assert found.answer.final is None or any(t.verdict == NOT_TRIED for t in found.answer.tried)
