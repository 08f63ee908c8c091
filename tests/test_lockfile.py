"""targets.lock (ortbuild/project/lockfile.py): written, read back, applied as an override, refused when malformed."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from ortbuild.errors import ConfigError
from ortbuild.project import config, lock_entry, lockfile, plan
from tests.conftest import here_runtime

TOML = f"""[project]
name = "p"
version = "1"

[models.m]
path = "m.onnx"
inputs = "m.npz"

[targets.int8]
runtime = "{here_runtime()}"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
quantization = {{ exclude_nodes = ["a"] }}
precision_search = "auto"
"""


@pytest.fixture
def project(tmp_path: Path) -> config.Project:
    (tmp_path / "targets.toml").write_text(TOML)
    return config.load(tmp_path / "targets.toml", check_files=False)


def _entry(**applies: object) -> lock_entry.Entry:
    return lock_entry.Entry("int8/m", "sha256:s", "sha256:t", applies, {"kept": 'node "b"', "rebuilds": 2},
                          {"speedup": 1.25})


def test_an_entry_round_trips_through_the_file(project: config.Project) -> None:
    entry = _entry(quantization={"exclude_nodes": ["a", 'b "quoted" ü']},
                   session={"intra_op_num_threads": 1, "config": {"session.intra_op.allow_spinning": "0"}})
    other = lock_entry.Entry("int8/other", "sha256:a", "sha256:b")
    lockfile.record(project, other)
    lockfile.record(project, entry)  # read again and added to: the other entry stays
    text = lockfile.path_of(project).read_text()
    assert text.startswith("# targets.lock") and tomllib.loads(text)["version"] == 1
    assert lockfile.read(project).entries == {"int8/m": entry, "int8/other": other}


def test_apply_lays_the_entry_over_the_declared_settings(project: config.Project) -> None:
    job = plan.jobs(project)[0]
    (locked,) = lockfile.apply(project, [(job, _entry(quantization={"exclude_nodes": ["a", "b"]},
                                                      session={"intra_op_num_threads": 1}))])
    assert locked.settings.quantization.exclude_nodes == ("a", "b")
    assert locked.settings.session.intra_op_num_threads == 1
    assert locked.settings.quantization.per_channel == job.settings.quantization.per_channel
    assert locked.settings.gates == job.settings.gates and locked.locked is not None
    assert lockfile.settings_digest(job) != lockfile.settings_digest(locked)


def test_an_entry_is_stale_when_its_source_or_settings_digest_differs() -> None:
    e = _entry()
    assert e.stale("sha256:s", "sha256:t") == ""
    assert e.stale("sha256:x", "sha256:t") == "the model or its data changed since it was written"
    assert e.stale("sha256:x", "sha256:y") == "the model or its data and the settings changed since it was written"


@pytest.mark.parametrize(("text", "where"), [
    ("version = [", "not valid TOML"),
    ("version = 2", "[version] version 2, this ortbuild reads 1"),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"', '[jobs."int8/m"] needs `source` and `settings` digests'),
    ('version = 1\n[jobs.int8]\nsource = "x"\nsettings = "y"', '[jobs."int8"] an entry is a table named'),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\napplies = { quantization = 1 }',
     '[jobs."int8/m".applies.quantization] a lock entry lays only'),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\napplies = { precision = 32 }',
     '[jobs."int8/m".applies.precision] a lock entry lays only'),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\nextra = 1', "unknown key(s) extra"),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\napplies = { quantization = { exclude_nodez = [] } }',
     "[jobs.\"int8/m\".applies.quantization] exclude_nodez: a lock entry lays only"),
    # the lock never loosens what is judged
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\napplies = { accuracy = { cosine = 0.5 } }',
     "[jobs.\"int8/m\".applies.accuracy] a lock entry lays only"),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\n[jobs."int8/m".search]\nwhen = 2024-01-01',
     "[jobs.\"int8/m\".search.when] holds date"),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\n[jobs."int8/m".tune]\nspeedup = nan',
     "[jobs.\"int8/m\".tune.speedup] holds float nan"),
    ('version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\n[jobs."int8/m".search]\nk = ' + "[" * 3000
     + "]" * 3000, "nested too deeply to read"),  # a RecursionError, not a traceback
])
def test_a_malformed_lock_is_a_config_error_naming_it(project: config.Project, text: str, where: str) -> None:
    lockfile.path_of(project).write_text(text)
    with pytest.raises(ConfigError) as e:
        lockfile.read(project)
    assert str(lockfile.path_of(project)) in e.value.message and where in e.value.message
    assert e.value.hint is not None and "delete the" in e.value.hint


def test_an_entry_that_does_not_fit_targets_toml_names_the_entry(project: config.Project) -> None:
    job = plan.jobs(project)[0]
    with pytest.raises(ConfigError) as e:
        lockfile.apply(project, [(job, _entry(quantization={"exclude_nodes": [1]}))])
    assert e.value.message.startswith(f"{lockfile.path_of(project)}: [jobs.\"int8/m\".applies] does not apply "
                                      "to targets.toml: [quantization.exclude_nodes]"), e.value.message


def test_the_docs_example_is_a_lock_ortbuild_reads(project: config.Project) -> None:
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "build-to-the-gates.md").read_text()
    search, choice = re.findall(r"^```toml targets.lock\n(.*?)^```", text, flags=re.S | re.M)
    lockfile.path_of(project).write_text(search)
    (entry,) = lockfile.read(project).entries.values()
    assert entry.target == "cpu-int8" and entry.applies["quantization"]["exclude_nodes"]
    lockfile.path_of(project).write_text(choice)
    (entry,) = lockfile.read(project).entries.values()
    assert entry.applies == {"precision": "fp32"} and entry.choice["chosen"] == "fp32" and entry.choice["cpu"]


def test_an_entry_chooses_only_among_the_targets_candidates(project: config.Project) -> None:
    """`applies.precision` (and a precision's options beyond the searches' lists) passes the read, and is refused
    where it lays them over a job whose target does not list them as a candidate: the lock cannot ship a
    precision targets.toml does not name."""
    job = plan.jobs(project)[0]
    for applies in ({"precision": "fp32"}, {"quantization": {"per_channel": True}}):
        with pytest.raises(ConfigError) as e:
            lockfile.apply(project, [(job, _entry(**applies))])
        assert '[jobs."int8/m".applies] chooses' in e.value.message and "(it lists none)" in e.value.message
    listed = dataclasses.replace(job, settings=dataclasses.replace(job.settings, candidates=({"precision": "fp32"},)))
    (locked,) = lockfile.apply(project, [(listed, _entry(precision="fp32"))])
    assert locked.settings.precision == "fp32"


# ------------------------------------------------------------------------- what an entry may do (trust, third pass)

VICTIM_KEYS = ("session.collect_node_memory_stats_to_file", "session.node_partition_config_file",
               "ep.context_file_path", "session.debug_layout_transformation", "session.log_id")


@pytest.mark.parametrize("key", VICTIM_KEYS)
def test_an_entry_may_set_only_the_four_tuned_session_settings(project: config.Project, key: str) -> None:
    """A lock entry's digests do not cover `applies`: anyone with the repository can write one that is "up to date".
    So `applies.session` holds tuning's four settings by name and nothing else; the file is refused on read,
    naming the entry and the key."""
    lockfile.path_of(project).write_text(
        f'version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\n'
        f'applies = {{ session = {{ config = {{ "{key}" = "/tmp/victim" }} }} }}\n')
    with pytest.raises(ConfigError) as e:
        lockfile.read(project)
    assert f'[jobs."int8/m".applies.session] config."{key}": a lock entry lays only' in e.value.message
    for other in ("enable_profiling = true", "enable_mem_pattern = false", "use_deterministic_compute = true"):
        lockfile.path_of(project).write_text(f'version = 1\n[jobs."int8/m"]\nsource = "x"\nsettings = "y"\n'
                                             f'applies = {{ session = {{ {other} }} }}\n')
        with pytest.raises(ConfigError, match="a lock entry lays only"):
            lockfile.read(project)


def test_the_tuned_settings_are_what_tuning_sets() -> None:
    from ortbuild.gating.search import tune_search

    cands = [c for _, cs in tune_search.candidates({"intra_op_num_threads": 0, "execution_mode": "sequential",
                                                    "config": {}}, 4) for c in cs]
    tables = {k for c in cands for k in c.patch if k != "config"} | {"config"}
    assert tables == lockfile.ALLOWED["session"]
    assert {k for c in cands for k in c.patch.get("config", {})} == lockfile.TUNED_CONFIG


def test_an_entry_lays_only_the_parts_the_job_asks_for() -> None:
    e = _entry(quantization={"exclude_nodes": ["b"]}, session={"intra_op_num_threads": 1})
    assert e.only(["search"]).applies == {"quantization": {"exclude_nodes": ["b"]}} and not e.only(["search"]).tune
    assert e.only(["tune"]).applies == {"session": {"intra_op_num_threads": 1}} and not e.only(["tune"]).search
    assert e.only(["search", "tune"]) == e and e.only([]).applies == {}
