"""Session tuning (gating/tune.py, gating/tune_search.py, `ortbuild tune`): the decision on recorded numbers (only a
candidate whose interval lies below 1 is faster), the greedy search, and real builds: the lock entry `ortbuild tune`
writes is what the next build applies (up to date, the tuned options in the manifest and the loader). No test
asserts a speed-up measured here: the machine is shared and noisy."""

from __future__ import annotations

import itertools
import json
import random
import tomllib
from collections.abc import Callable
from pathlib import Path

from ortbuild.artifact import keys, loaders, manifest
from ortbuild.gating import runner
from ortbuild.gating.measure import sampling as latency
from ortbuild.gating.search import tune
from ortbuild.gating.search.base import Budget
from ortbuild.gating.search.tune_search import (
    ERROR,
    FAILS_ACCURACY,
    KEPT,
    NO_FASTER,
    NOT_BEST,
    NOT_TRIED,
    Comparison,
    Session,
    Tried,
    Tuning,
    candidates,
    changes,
    compare,
    patched,
    search,
)
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.progress import Progress
from ortbuild.project import config, lock_entry, lockfile, plan
from ortbuild.status import JobStatus
from tests.conftest import run_cli

DECLARED: Session = {"intra_op_num_threads": 0, "inter_op_num_threads": 0, "execution_mode": "sequential",
                     "enable_mem_pattern": True, "enable_cpu_mem_arena": True, "use_deterministic_compute": False,
                     "config": {"session.intra_op.allow_spinning": "1", "session.dynamic_block_base": "0"}}


# ------------------------------------------------------------------------------------------ on recorded numbers

class FakeClock:
    """A clock the calls advance by recorded durations (ms), so latency.sample sees exactly those samples."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call(self, durations: list[float]) -> Callable[[], None]:
        it = itertools.cycle(durations)

        def run() -> None:
            self.now += next(it) / 1e3
        return run


def _compare(current: list[float], candidate: list[float]) -> Comparison:
    clock = FakeClock()
    calls = {"current": clock.call(current), "candidate": clock.call(candidate)}
    return compare(calls, latency.Plan(0.99, 0, 0.5, 0.0), cpus=2, clock=clock, read=lambda: 1.0,
                   wait=lambda s, c: {"quiet": True, "load": 1.0, "waited_s": 0.0})


def test_a_candidate_is_faster_only_when_its_interval_lies_below_one() -> None:
    rng = random.Random(7)
    base = [10 + rng.random() for _ in range(400)]  # recorded run times (ms) of the current setting
    faster = _compare(base, [0.8 * x + rng.random() * 0.2 for x in base])
    assert faster.faster and faster.high is not None and faster.high < 1.0 and 0.75 < faster.ratio < 0.85
    assert faster.speedup > 1 and faster.interval().startswith(f"{faster.speedup:.2f}x [")
    same = _compare(base, rng.sample(base, len(base)))  # the same distribution, shuffled: no faster
    assert not same.faster and same.low is not None and same.high is not None and same.low <= 1.0 <= same.high
    slower = _compare(base, [1.2 * x for x in base])
    assert not slower.faster and slower.low is not None and slower.low > 1.0
    # a recorded interval that touches 1.0 (or could not be computed) is not faster
    assert not Comparison(0.95, 0.9, 1.0, 0.99, 1.0, 1.05, 100).faster
    assert not Comparison(0.5, None, None, 0.99, 1.0, 2.0, 3).faster
    assert Comparison(0.95, 0.9, 0.999, 0.99, 1.0, 1.05, 100).faster


def test_a_faster_verdict_under_load_is_measured_again() -> None:
    clock = FakeClock()
    calls = {"current": clock.call([10.0, 10.5]), "candidate": clock.call([8.0, 8.2])}
    waits: list[float] = []
    c = compare(calls, latency.Plan(0.99, 0, 0.5, 3.0), cpus=2, clock=clock, read=lambda: 9.0,
                wait=lambda s, n: waits.append(s) or {"quiet": False, "load": 9.0, "waited_s": s})
    assert waits == [3.0] and c.faster and any("measured again" in n for n in c.notes)
    assert any("load 9.0 above the 2 CPUs" in n for n in c.notes)


def _c(ratio: float, low: float | None, high: float | None) -> Comparison:
    return Comparison(ratio, low, high, 0.99, 10 * ratio, 10.0, 100)


def test_the_greedy_search_keeps_the_fastest_faster_value_that_passes_accuracy() -> None:
    table = {
        json.dumps({"intra_op_num_threads": 1}): _c(0.80, 0.75, 0.85),        # faster, the most
        json.dumps({"intra_op_num_threads": 2}): _c(0.90, 0.85, 0.95),        # faster, less
        json.dumps({"config": {"session.intra_op.allow_spinning": "0"}}): _c(0.70, 0.6, 0.8),  # fails accuracy
        json.dumps({"config": {"session.dynamic_block_base": "4"}}): _c(0.98, 0.95, 1.01),  # touches 1: no faster
        json.dumps({"execution_mode": "parallel"}): _c(1.5, 1.4, 1.6),        # slower
        "default": _c(1.0, 0.99, 1.01),
    }
    measured: list[tuple[Session, Session]] = []

    def measure(current: Session, candidate: Session) -> Comparison:
        measured.append((current, candidate))
        if current == DECLARED and changes(current, candidate) == {"intra_op_num_threads": 1} and len(measured) > 5:
            return _c(0.82, 0.78, 0.86)  # the kept setting against the declared one, at the end
        return table[json.dumps(changes(current, candidate), sort_keys=True)]

    def accurate(session: Session) -> tuple[bool, str]:
        bad = session["config"].get("session.intra_op.allow_spinning") == "0"
        return (not bad, "cosine 0.95 < 0.99" if bad else "cosine 1.0000")

    t = search(DECLARED, 2, measure, accurate, seconds=60)
    verdicts = {x.label: x.verdict for x in t.tried}
    assert verdicts == {"intra_op_num_threads = 1": KEPT, "intra_op_num_threads = 2": NOT_BEST,
                        "session.intra_op.allow_spinning = \"0\"": FAILS_ACCURACY,
                        "session.dynamic_block_base = \"4\"": NO_FASTER, "execution_mode = \"parallel\"": NO_FASTER}
    # later knobs are measured against the kept setting, not the declared one
    assert all(cur["intra_op_num_threads"] == 1 for cur, _ in measured[2:5])
    assert next(x for x in t.tried if x.verdict == FAILS_ACCURACY).note == "cosine 0.95 < 0.99"
    assert t.applies == {"intra_op_num_threads": 1} and not t.rejected
    r = t.record()
    assert (r["speedup"], r["low"], r["high"], r["confidence"]) == (round(1 / 0.82, 3), round(1 / 0.86, 3),
                                                                     round(1 / 0.78, 3), 0.99)
    assert r["default_p50_ms"] == 10.0 and r["tuned_p50_ms"] == 8.2 and r["kept"] == "intra_op_num_threads = 1"
    assert len(r["tried"]) == 5 and "kept (1.25x [1.18, 1.33] vs declared)" in r["tried"][0]  # type: ignore[index]


def test_nothing_is_kept_when_the_kept_setting_is_no_faster_than_the_declared_one() -> None:
    recorded = iter([_c(0.90, 0.85, 0.95),   # intra_op_num_threads = 1 against declared: faster, kept
                     _c(1.00, 0.98, 1.02),   # = 2 against it
                     _c(1.00, 0.98, 1.02), _c(1.00, 0.98, 1.02), _c(1.00, 0.98, 1.02),  # the other knobs
                     _c(0.99, 0.95, 1.03)])  # the kept setting against the declared one: the interval holds 1
    seen: list[tuple[Session, Session]] = []

    def measure(current: Session, candidate: Session) -> Comparison:
        seen.append((current, candidate))
        return next(recorded)

    t = search(DECLARED, 2, measure, lambda s: (True, "cosine 1.0"), seconds=60)
    assert seen[-1] == (DECLARED, patched(DECLARED, {"intra_op_num_threads": 1}))
    assert t.rejected and t.tuned == DECLARED and t.applies == {}
    assert "no faster, nothing kept" in t.notes[0]
    r = t.record()
    assert r["speedup"] == 1.0 and str(r["kept"]).startswith("nothing") and "low" not in r


def test_the_search_stops_at_its_time_and_reports_errors() -> None:
    now = [0.0]

    def measure(current: Session, candidate: Session) -> Comparison:
        now[0] += 40
        if candidate["intra_op_num_threads"] == 2:
            from ortbuild.errors import ArtifactError
            raise ArtifactError("session creation failed: no")
        return _c(1.0, 0.98, 1.02)

    t = search(DECLARED, 2, measure, lambda s: (True, ""), seconds=60, clock=lambda: now[0])
    assert [x.verdict for x in t.tried] == [NO_FASTER, ERROR, NOT_TRIED, NOT_TRIED, NOT_TRIED]
    assert t.final is None and t.applies == {}


def test_the_stated_bound_holds_the_final_confirmation_included() -> None:
    """The candidates stop at SEARCH_SHARE of the seconds, the confirmation of what was kept starts only within
    them (it once could start at 1.5x, past the bound it stated), and a measurement stops at its deadline. Counted
    in measurements and samples, on fake clocks."""
    now = [0.0]
    calls: list[Session] = []

    def measure(current: Session, candidate: Session) -> Comparison:
        calls.append(candidate)
        now[0] += 25
        return _c(0.8, 0.75, 0.85)  # faster

    t = search(DECLARED, 2, measure, lambda s: (True, ""), seconds=60, clock=lambda: now[0])
    # 0, 25: measured; at 50 (past 48, 0.8 x 60) the rest is not tried; the confirmation starts at 50 < 60
    assert [x.verdict for x in t.tried][:3] == [KEPT, NOT_BEST, NOT_TRIED] and len(calls) == 3
    assert t.final is not None and t.seconds == 75
    now[0], calls[:] = 0.0, []

    def slow(current: Session, candidate: Session) -> Comparison:
        calls.append(candidate)
        now[0] += 65
        return _c(0.8, 0.75, 0.85)

    t = search(DECLARED, 2, slow, lambda s: (True, ""), seconds=60, clock=lambda: now[0])
    assert len(calls) == 1 and t.final is None  # 65 s in: 1.5x (90 s) would have confirmed
    assert "out of time before the kept setting was measured" in t.notes[0]
    # a comparison of a 3 s model stops at its deadline (10 s): a look at what there is, never 20 rounds
    clock = [0.0]

    def run() -> None:
        clock[0] += 3.0

    plan = latency.Plan(0.99, 0, 0.5, 0.0, max_seconds=10.0)
    c = compare({"current": run, "candidate": run}, plan, clock=lambda: clock[0], read=lambda: 0.0)
    assert c.samples == 2 and not c.faster  # 2 rounds of 2 runs: 12 s


def test_candidates_and_changes() -> None:
    knobs = dict(candidates(DECLARED, 8))
    assert [c.label for c in knobs["intra_op_num_threads"]] == [f"intra_op_num_threads = {n}" for n in (1, 4, 8)]
    assert [c.patch for c in knobs["spinning"]] == [{"config": {"session.intra_op.allow_spinning": "0"}}]
    assert [c.patch for c in knobs["execution_mode"]] == [{"execution_mode": "parallel"}]
    one = patched(DECLARED, {"intra_op_num_threads": 1})
    assert [c.label for c in dict(candidates(one, 2))["intra_op_num_threads"]] == ["intra_op_num_threads = 2"]
    tuned = patched(DECLARED, {"intra_op_num_threads": 1, "config": {"session.dynamic_block_base": "4"}})
    assert tuned["config"]["session.intra_op.allow_spinning"] == "1"  # config key by key
    assert changes(DECLARED, tuned) == {"intra_op_num_threads": 1, "config": {"session.dynamic_block_base": "4"}}
    assert Tuning(DECLARED, tuned).kept() == "intra_op_num_threads = 1; config.\"session.dynamic_block_base\" = \"4\""
    assert Tuning(DECLARED, DECLARED).kept().startswith("nothing")


# ------------------------------------------------------------------------------------------ real builds

TARGETS = """
    [targets.cpu]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    session = { config = { "session.intra_op.spin_backoff_max" = "4" } }

    [targets.cpu-int8]
    extends = "cpu"
    precision = "int8-dynamic"
    tune = true
"""


def parts(path: Path) -> tuple[config.Project, Builder, runner.Tester]:
    project = config.load(path)
    dist = path.parent / "dist"
    quiet = Progress(quiet=True)
    secrets = keys.read_secrets()
    return project, Builder(project, dist, secrets=secrets, progress=quiet), \
        runner.Tester(project, dist, secrets.secret, str(path), quiet, secrets.signing)




def test_tune_writes_a_lock_entry_the_next_build_applies(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS)
    proc = run_cli("tune", "-c", str(path), "-t", "cpu", "--tune-seconds", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (job,) = out["jobs"]
    assert job["status"] == "TUNED" and job["tried"] and all(
        t["verdict"] in (KEPT, NO_FASTER, NOT_BEST, FAILS_ACCURACY, NOT_TRIED) for t in job["tried"])
    lock_file = path.parent / "targets.lock"
    if not job["applies"]:  # the declared options won: nothing to apply, no entry (this target has no tune = true)
        assert not lock_file.exists() or "cpu/tiny_cnn" not in tomllib.loads(lock_file.read_text())["jobs"]
        return
    entry = tomllib.loads(lock_file.read_text())["jobs"]["cpu/tiny_cnn"]
    assert entry["applies"] == job["applies"]
    assert set(entry["tune"]) >= {"kept", "tried", "seconds"} and entry["tune"]["kept"] == job["kept"]
    if "default_p50_ms" in entry["tune"]:
        assert {"tuned_p50_ms", "speedup", "confidence"} <= set(entry["tune"])
    assert any("entries change only jobs that ask for tuning: add `tune = true` to [targets.cpu]" in n
               for n in job["notes"])
    # [targets.cpu] asks for no tuning: a build leaves the entry alone (the declared options are built again) ...
    again = run_cli("build", "-c", str(path), "-t", "cpu", "--json")
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in json.loads(again.stdout)["jobs"]] == [JobStatus.BUILT]
    assert "the entry of cpu/tiny_cnn is not applied: its target asks for no search or tuning" in again.stderr
    m, _ = manifest.read(path.parent / "dist" / "cpu" / "tiny_cnn")
    declared = config.load(path).targets["cpu"].settings["tiny_cnn"].session.as_json()
    assert m.session == declared and m.session["config"] == {"session.intra_op.spin_backoff_max": "4"}
    # ... and once it asks (tune = true), the next build ships what was kept without tuning again
    path.write_text(path.read_text().replace('"4" } }\n', '"4" } }\ntune = true\n', 1))
    again = run_cli("build", "-c", str(path), "-t", "cpu", "--json")
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in json.loads(again.stdout)["jobs"]] == [JobStatus.BUILT]
    assert "tune: kept" not in again.stderr + again.stdout
    m, _ = manifest.read(path.parent / "dist" / "cpu" / "tiny_cnn")
    for k, v in job["applies"].get("session", {}).items():  # what was kept ships (what the machine measured)
        assert (m.session[k] == v) if k != "config" else all(m.session["config"][c] == x for c, x in v.items())
    assert m.session["config"]["session.intra_op.spin_backoff_max"] == "4"  # the declared config entry stays


def test_a_recorded_tuning_ships_in_the_manifest_and_the_loader(make_project: Callable[..., Path]) -> None:
    """record() on a given tuning (no measured numbers): the entry, the rebuild, the manifest and the loader's
    SESSION carry the tuned options; the next build is a no-op; an up-to-date entry's search part stays."""
    path = make_project(TARGETS.replace('"4" } }\n', '"4" } }\n    tune = true\n', 1))  # builds apply the entry
    project, builder, tester = parts(path)
    (job,) = plan.jobs(project, ["cpu"])
    assert builder.run_job(job).status == JobStatus.BUILT
    source, settings = builder.fingerprint(job)
    lock = lockfile.Lock(lockfile.path_of(project)).with_entry(
        lock_entry.Entry(job.name, source, settings, {}, {"result": "passes as declared"}, {}))
    declared = tune.declared_session(job)
    tuning = Tuning(declared, patched(declared, {"intra_op_num_threads": 1,
                                                 "config": {"session.intra_op.allow_spinning": "0"}}))
    lock, locked, result = tune.record(builder, tester, lock, job, tuning)
    assert result.status == JobStatus.BUILT and locked.locked is not None
    entry = lockfile.read(project).entries[job.name]
    assert entry.applies == {"session": {"intra_op_num_threads": 1,
                                         "config": {"session.intra_op.allow_spinning": "0"}}}
    assert entry.search == {"result": "passes as declared"} and entry.tune["kept"] == tuning.kept()
    folder = path.parent / "dist" / "cpu" / "tiny_cnn"
    m, _ = manifest.read(folder)
    assert m.session["intra_op_num_threads"] == 1
    assert m.session["config"] == {"session.intra_op.allow_spinning": "0", "session.intra_op.spin_backoff_max": "4"}
    mod = loaders.import_python_loader(loaders.python_path(folder, "tiny_cnn"))
    opened = mod.load().session.get_session_options()
    assert opened.intra_op_num_threads == 1
    assert opened.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    again = run_cli("build", "-c", str(path), "-t", "cpu", "--json")
    assert [r["status"] for r in json.loads(again.stdout)["jobs"]] == [JobStatus.UP_TO_DATE], again.stderr
    # tuned again to nothing: the session part goes, the search part stays, the artifact is the declared one again
    lock, _, result = tune.record(builder, tester, lock, job, Tuning(declared, declared))
    assert result.status == JobStatus.BUILT and lockfile.read(project).entries[job.name].applies == {}
    assert manifest.read(folder)[0].session["intra_op_num_threads"] == 0


def test_tune_for_build_tunes_a_tune_true_target(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS)
    project, builder, tester = parts(path)
    (job,) = plan.jobs(project, ["cpu-int8"])
    assert tune.wants_tune(job) and builder.run_job(job).status == JobStatus.BUILT
    lock, locked, result = tune.tune_for_build(builder, tester, lockfile.read(project), job, lambda j, m: None,
                                               Budget(None, 3))
    assert result.status in (JobStatus.BUILT, JobStatus.UP_TO_DATE)
    assert locked.locked is not None and locked.locked.tune and not tune.wants_tune(locked)
    assert lock.entries[job.name].tune == lockfile.read(project).entries[job.name].tune
    assert any(n.startswith("tune: kept") for n in result.notes)
    # the fp32 target of the same model is not built here: no speed note against it
    assert not any("fp32" in n for n in lock.entries[job.name].tune.get("notes", []))  # type: ignore[union-attr]


def test_the_build_tunes_a_tune_true_target_and_locked_needs_its_tuning(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS)
    refused = run_cli("build", "-c", str(path), "-t", "cpu-int8", "--locked")
    assert refused.returncode == 3 and "cpu-int8/tiny_cnn (tune = true): no entry" in refused.stderr
    proc = run_cli("build", "-c", str(path), "-t", "cpu-int8", "--tune-seconds", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (job,) = json.loads(proc.stdout)["jobs"]
    assert any(n.startswith("tune: kept") for n in job["notes"]), job["notes"]
    entry = tomllib.loads((path.parent / "targets.lock").read_text())["jobs"]["cpu-int8/tiny_cnn"]
    assert entry["tune"]["kept"] and entry["tune"]["tried"]
    again = run_cli("build", "-c", str(path), "-t", "cpu-int8", "--locked", "--json")
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in json.loads(again.stdout)["jobs"]] == [JobStatus.UP_TO_DATE]


def test_tune_user_errors(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS)
    nope = run_cli("tune", "-c", str(path), "-t", "nope")
    assert nope.returncode == 3 and "no target matches 'nope'" in nope.stderr and "Traceback" not in nope.stderr
    zero = run_cli("tune", "-c", str(path), "--tune-seconds", "0")
    assert zero.returncode == 2 and "--tune-seconds 0: give a positive number" in zero.stderr
    old = run_cli("tune", "-c", str(path), "--seconds", "0")  # the budget's earlier name, a hidden alias
    assert old.returncode == 2 and "--tune-seconds 0: give a positive number" in old.stderr
    assert not (path.parent / "targets.lock").exists()
    # a job whose build fails (here: its published artifact was modified) fails the command with its own code
    assert run_cli("build", "-c", str(path), "-t", "cpu").returncode == 0
    artifact = path.parent / "dist" / "cpu" / "tiny_cnn" / "model.onnx.enc"
    sealed = artifact.read_bytes()
    artifact.write_bytes(sealed[:-1] + bytes([sealed[-1] ^ 1]))  # a flipped bit (a byte set to 0 may be 0 already)
    tampered = run_cli("tune", "-c", str(path), "-t", "cpu", "--tune-seconds", "1")
    assert tampered.returncode == 7 and "TAMPERED" in tampered.stderr, tampered.stderr[-2000:]


def test_tune_text_table_and_the_fp32_note(make_project: Callable[..., Path]) -> None:
    path = make_project(TARGETS)
    proc = run_cli("tune", "-c", str(path), "-t", "cpu-int8", "--tune-seconds", "3")
    assert proc.returncode == 0, proc.stderr
    assert "cpu-int8/tiny_cnn: kept" in proc.stdout and "speed-up [interval]" in proc.stdout
    assert "intra_op_num_threads = 1" in proc.stdout and "1 TUNED, 0 SKIPPED, 0 FAILED  ->  targets.lock" in proc.stdout
    # the fp32 target of the model was built beside it: the note on int8's speed against it
    assert "int8-dynamic is " in proc.stdout and "x cpu/tiny_cnn's (fp32) speed" in proc.stdout


def test_a_tuning_that_keeps_nothing_writes_no_lock_entry_unless_tune_true_needs_one(
        make_project: Callable[..., Path]) -> None:
    """The declared options won (a search whose every candidate was no faster): `ortbuild tune` leaves targets.lock
    alone; a `tune = true` target records it, or every build would tune again. No timing: the search is given."""
    path = make_project(TARGETS)
    project, builder, tester = parts(path)
    lost = Tuning(DECLARED, DECLARED, [Tried("intra_op_num_threads = 1", "declared", None, NO_FASTER)])
    (job,) = plan.jobs(project, ["cpu"])
    lock, _, result = tune.record(builder, tester, lockfile.read(project), job, lost)
    assert result.status in (JobStatus.BUILT, JobStatus.UP_TO_DATE) and job.name not in lock.entries
    assert not (path.parent / "targets.lock").exists()
    assert any("targets.lock not written (nothing to apply)" in n for n in result.notes), result.notes
    (job,) = plan.jobs(project, ["cpu-int8"])  # tune = true: the record is what stops the next build tuning
    lock, locked, _ = tune.record(builder, tester, lockfile.read(project), job, lost)
    assert lock.entries[job.name].tune and not tune.wants_tune(locked)
    assert lockfile.read(project).entries[job.name].applies == {}
