"""The layers of a target's settings through `extends` and `[[overrides]]` (ortbuild/project/layering.py): a
child's overrides come after the ones it inherits, so per model the inherited keys apply and a key the child
sets wins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.errors import ConfigError
from ortbuild.project import config

MODELS = ("tiny_cnn", "tiny_lstm")

BASE = """
    [targets.base]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    latency = { p50_ms = 1500 }

    [[targets.base.overrides]]
    models = ["tiny_cnn"]
    latency = { p50_ms = 150, p90_ms = 300 }
"""


def _settings(path: Path, target: str, model: str = "tiny_cnn") -> config.Settings:
    return config.load(path).targets[target].settings[model]


def _gates(path: Path, target: str, model: str = "tiny_cnn") -> config.Gates:
    gates = _settings(path, target, model).gates
    assert gates is not None
    return gates


def test_a_childs_accuracy_override_keeps_the_inherited_latency_budget(make_project: Callable[..., Path]) -> None:
    # the reported case: the printed accuracy override pasted into a child target
    path = make_project(BASE + """
        [targets.child]
        extends = "base"

        [[targets.child.overrides]]
        models = ["tiny_cnn"]
        accuracy = { atol = 0.5 }
    """, models=MODELS)
    child = _gates(path, "child")
    assert (child.latency.p50_ms, child.latency.p90_ms) == (150, 300)  # not the target-level 1500
    assert child.accuracy["atol"] == 0.5
    assert _gates(path, "child", "tiny_lstm").latency.p50_ms == 1500
    assert _gates(path, "base").accuracy.get("atol") is None  # the parent is untouched


def test_a_key_the_child_sets_wins_and_tables_merge_key_by_key(make_project: Callable[..., Path]) -> None:
    path = make_project(BASE + """
        [[targets.base.overrides]]
        models = ["tiny_cnn"]
        precision = "fp16"
        optimization = "basic"
        fp16 = { op_block_list = ["Resize"], keep_io_types = false }
        session = { intra_op_num_threads = 1, inter_op_num_threads = 1 }

        [targets.child]
        extends = "base"

        [[targets.child.overrides]]
        models = ["tiny_cnn"]
        latency = { p90_ms = 200 }
        optimization = "extended"
        fp16 = { op_block_list = ["TopK"] }
        session = { intra_op_num_threads = 3 }
    """, models=MODELS)
    s = _settings(path, "child")
    assert (s.precision, s.optimization) == ("fp16", "extended")
    assert s.fp16 == config.Fp16(op_block_list=("TopK",), keep_io_types=False, node_block_list=())  # lists replace
    assert (s.session.intra_op_num_threads, s.session.inter_op_num_threads) == (3, 1)
    assert s.gates is not None and (s.gates.latency.p50_ms, s.gates.latency.p90_ms) == (150, 200)
    assert _settings(path, "child", "tiny_lstm").precision == "fp32"


def test_an_inherited_override_beats_the_childs_target_level_key(make_project: Callable[..., Path]) -> None:
    # an override is more specific than a target-level key, whichever target declares either
    path = make_project(BASE + """
        [targets.child]
        extends = "base"
        latency = { p50_ms = 100 }

        [[targets.child.overrides]]
        models = ["tiny_lstm"]
        latency = { p50_ms = 90 }
    """, models=MODELS)
    assert _gates(path, "child").latency.p50_ms == 150
    assert _gates(path, "child", "tiny_lstm").latency.p50_ms == 90
    own = make_project(BASE + """
        [targets.child]
        extends = "base"
        latency = { p50_ms = 100 }

        [[targets.child.overrides]]
        models = ["tiny_cnn"]
        latency = { p50_ms = 100 }
    """, models=MODELS)
    assert _gates(own, "child").latency.p50_ms == 100  # the child's own override for the model does change it


def test_inherited_overrides_may_name_models_the_child_does_not_build(make_project: Callable[..., Path]) -> None:
    child = """
        [targets.child]
        extends = "base"
        models = ["tiny_lstm"]

        [[targets.child.overrides]]
        models = MODELS
        latency = { p50_ms = 50 }
    """
    path = make_project(BASE + child.replace("MODELS", '["tiny_lstm"]'), models=MODELS)
    assert list(config.load(path).targets["child"].settings) == ["tiny_lstm"]
    assert _gates(path, "child", "tiny_lstm").latency.p50_ms == 50
    # the child's own overrides are still checked, numbered in its own list (the inherited ones come first)
    with pytest.raises(ConfigError) as err:
        config.load(make_project(BASE + child.replace("MODELS", '["tiny_cnn"]'), models=MODELS))
    assert err.value.where == "targets.child.overrides[0].models" and "tiny_cnn" in err.value.message
    with pytest.raises(ConfigError) as err:
        config.load(make_project(BASE + child.replace("models = MODELS", ""), models=MODELS))
    assert err.value.where == "targets.child.overrides[0]" and "'models'" in err.value.message


def test_a_relative_budget_in_an_inherited_override_is_still_not_inherited(
        make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.fast]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        optimization = "basic"

        [targets.base]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]

        [[targets.base.overrides]]
        models = ["tiny_cnn"]
        latency = { p50_ms = 150, faster_than = { target = "fast", ratio = 1.2 } }

        [targets.child]
        extends = "base"

        [[targets.child.overrides]]
        models = ["tiny_cnn"]
        size = { max_mb = 4 }
    """)
    child = _gates(path, "child")
    assert (child.latency.p50_ms, child.latency.faster_than, child.size.max_mb) == (150, None, 4)
    assert _gates(path, "base").latency.faster_than is not None


PRECISIONS = """
    [targets.base]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]

    [[targets.base.overrides]]
    models = ["tiny_cnn"]
    accuracy = { atol = 1e-3 }
    latency = { p50_ms = 150 }

    [targets.int8]
    extends = "base"
    precision = "int8-dynamic"

    [[targets.int8.overrides]]
    models = ["tiny_cnn"]
    accuracy = { outputs.logits = { top1 = 0.9 } }

    [targets.half]
    extends = "base"

    [[targets.half.overrides]]
    models = ["tiny_cnn"]
    precision = "fp16"
"""


def test_a_precision_change_in_the_child_drops_the_inherited_accuracy_rules(
        make_project: Callable[..., Path]) -> None:
    path = make_project(PRECISIONS)
    # the child's precision: the inherited override's fp32 rule is dropped, its latency kept, the child's rule applies
    int8 = _gates(path, "int8")
    rule = int8.accuracy_rule("int8-dynamic", "logits")
    assert (rule.get("atol"), rule["cosine"], rule["top1"]) == (None, 0.99, 0.9)
    assert int8.latency.p50_ms == 150
    assert int8.not_inherited == ("the fp32 rule of base.overrides[0]",)
    # the child's override changes the model's precision: the same, named where the dropped rule is declared
    half = _gates(path, "half")
    assert _settings(path, "half").precision == "fp16" and half.accuracy.get("atol") is None
    assert half.latency.p50_ms == 150
    assert half.not_inherited == ("the fp32 rule of base.overrides[0]",)


def test_a_three_level_chain_merges_every_levels_overrides_in_order(make_project: Callable[..., Path]) -> None:
    path = make_project(BASE + """
        [targets.mid]
        extends = "base"

        [[targets.mid.overrides]]
        models = ["tiny_cnn"]
        accuracy = { atol = 1e-3 }
        size = { max_mb = 4 }

        [[targets.mid.overrides]]
        models = ["tiny_*"]
        memory = { peak_mb = 900 }

        [targets.leaf]
        extends = "mid"

        [[targets.leaf.overrides]]
        models = ["tiny_cnn"]
        size = { max_mb = 2 }
        latency = { p90_ms = 250 }

        [targets.leaf-int8]
        extends = "leaf"
        precision = "int8-dynamic"

        [[targets.leaf-int8.overrides]]
        models = ["tiny_cnn"]
        precision = "fp32"
    """, models=MODELS)
    leaf = _gates(path, "leaf")
    assert (leaf.latency.p50_ms, leaf.latency.p90_ms) == (150, 250)  # base's, then leaf's key
    assert (leaf.accuracy["atol"], leaf.size.max_mb, leaf.memory.peak_mb) == (1e-3, 2, 900)
    lstm = _gates(path, "leaf", "tiny_lstm")
    assert (lstm.latency.p50_ms, lstm.size.max_mb, lstm.memory.peak_mb) == (1500, None, 900)
    assert _gates(path, "mid").size.max_mb == 4  # each level keeps its own result
    # dropped rules are named where they are declared, not by their place in the merged list
    back = _gates(path, "leaf-int8")
    assert _settings(path, "leaf-int8").precision == "fp32"
    assert back.accuracy.get("atol") is None and back.latency.p50_ms == 150
    assert back.not_inherited == ("the fp32 rule of mid.overrides[0]",)


def test_a_data_sets_load_scenarios_layer_over_the_targets_key_by_key(make_project: Callable[..., Path]) -> None:
    """[targets.X.latency.data_sets.NAME.server] (and .offline, .multi_stream) over the target's scenario table:
    through `extends` and `[[overrides]]` too, read by Latency.scenario; a scenario only a data set declares
    runs on that data set alone and must be complete there."""
    from ortbuild.project.sections import MultiStream, Offline, Server

    path = make_project("""
        [targets.base]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        [targets.base.latency]
        p99_ms = 100
        [targets.base.latency.server]
        qps = 50
        p99_ms = 40
        [targets.base.latency.data_sets.test_data_set_1]
        p90_ms = 70
        server = { p99_ms = 400 }
        offline = { batch = 4, min_samples_per_second = 10 }

        [targets.child]
        extends = "base"
        latency = { data_sets = { test_data_set_1 = { server = { qps = 5 } } } }

        [[targets.child.overrides]]
        models = ["tiny_cnn"]
        latency = { data_sets = { test_data_set_2 = { multi_stream = { streams = 2, p99_ms = 9 } } } }
    """, models=MODELS)
    lat = _gates(path, "base").latency
    assert lat.scenario("server") == lat.scenario("server", "test_data_set_0") == Server(qps=50, p99_ms=40)
    assert lat.scenario("server", "test_data_set_1") == Server(qps=50, p99_ms=400)  # its own p99 over the target's
    assert lat.scenario("offline", "test_data_set_0") is None and lat.scenario("offline") is None
    assert lat.scenario("offline", "test_data_set_1") == Offline(batch=4, min_samples_per_second=10)
    assert lat.budgets("test_data_set_1") == {0.9: 70.0, 0.99: 100.0}  # the flat budget keys still read
    assert lat.declares("offline") and lat.declares("server") and not lat.declares("multi_stream")
    child = _gates(path, "child").latency  # extends merges the data set's table key by key
    assert child.scenario("server", "test_data_set_1") == Server(qps=5, p99_ms=400)
    assert child.scenario("offline", "test_data_set_1") == Offline(batch=4, min_samples_per_second=10)
    assert child.scenario("multi_stream", "test_data_set_2") == MultiStream(streams=2, p99_ms=9)  # the override's
    assert child.scenario("multi_stream", "test_data_set_1") is None and child.declares("multi_stream")
    lstm = _gates(path, "child", "tiny_lstm").latency  # the override is tiny_cnn's alone
    assert not lstm.declares("multi_stream") and lstm.scenario("server", "test_data_set_1") == Server(qps=5, p99_ms=400)

    # a scenario only a data set declares must be complete there: the key, and where else it may be set
    path.write_text(path.read_text().replace("streams = 2, ", ""))
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert err.value.where == "targets.child.latency.data_sets.test_data_set_2.multi_stream.streams"
    assert "must be set" in str(err.value) and "[targets.child.latency.multi_stream]" in str(err.value.hint)
    path.write_text(path.read_text().replace("p99_ms = 9", "p99_ms = 9, stream = 2"))
    with pytest.raises(ConfigError) as err:  # a data set's scenario table has the target's keys, checked as such
        config.load(path)
    assert "unknown key 'stream' (did you mean 'streams'?)" in str(err.value)
