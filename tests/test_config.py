from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild.errors import ConfigError
from ortbuild.project import config, options
from tests.conftest import REPO, run_cli

BAD = sorted((REPO / "tests" / "fixtures" / "bad").glob("*.toml"))


def test_committed_targets_file_resolves_layers() -> None:
    p = config.load(REPO / "targets.toml")
    assert list(p.targets) == ["cpu-fp32", "cpu-portable", "cpu-int8", "cpu-int4", "arm64-int8", "x86-v3-int8",
                              "mobile-int8",
                              "openvino-cpu", "cuda-fp16", "tensorrt-fp16", "llm-cpu-fp32", "llm-cpu-int8",
                              "llm-cpu-int4", "llm-cuda-int4"]
    # the generative model: only the targets that name it, and no wildcard (tiny_*) selects it
    assert [t for t in p.targets if "tiny_llama" in p.targets[t].models] == [t for t in p.targets if "llm" in t]
    llm = p.targets["llm-cuda-int4"]  # extends llm-cpu-int4: its int4 table, another runtime
    assert llm.kind == "generative"
    assert llm.settings["tiny_llama"].int4.accuracy_level == 4  # the builder's default, searched
    assert llm.session("test") == "test-generative(llm-cuda-int4)"
    mobile = p.targets["mobile-int8"].settings["tiny_cnn"]
    assert (mobile.format, mobile.optimization, mobile.precision) == ("ort", "basic", "int8-static")
    # phones are ARM: gated on ARM's int8 kernels (emulated), not on x86's u8s8 ones, which saturate without VNNI
    assert p.targets["mobile-int8"].platform == "linux-aarch64" and mobile.quantization.reduce_range is False
    v3 = p.targets["x86-v3-int8"]  # int8 gated on the AVX2 kernels: x86's 7-bit weights hold there
    assert (v3.platform, v3.settings["tiny_lstm"].quantization.reduce_range) == ("x86-64-v3", True)
    arm = p.targets["arm64-int8"]  # the platform's default runner; int8 without x86's reduce_range
    assert (arm.platform, arm.runner) == ("linux-aarch64", ("ubuntu-24.04-arm",))
    assert p.targets["cpu-int8"].platform == "native"
    assert arm.settings["tiny_lstm"].quantization.reduce_range is False
    assert arm.settings["tiny_lstm"].quantization.per_channel is True
    int8 = p.targets["cpu-int8"]
    # extends: runtime, providers and session come from cpu-fp32
    assert int8.runtime == "onnxruntime==1.31.1"
    assert int8.settings["tiny_lstm"].session.intra_op_num_threads == 2
    # overrides: static for the CNN, dynamic for the rest; the override's table merges key by key
    assert int8.settings["tiny_cnn"].precision == "int8-static"
    assert int8.settings["tiny_cnn"].quantization.op_types == ()
    assert int8.settings["tiny_cnn"].quantization.per_channel is True
    assert int8.settings["tiny_transformer"].precision == "int8-dynamic"
    assert "breast_cancer_gb" not in int8.models  # models = ["tiny_*"]
    # defaults fill what nobody set
    assert int8.settings["tiny_lstm"].quantization.weight_type == "int8"
    assert p.targets["tensorrt-fp16"].providers[0].options == {"trt_fp16_enable": True}
    assert p.targets["tensorrt-fp16"].settings["tiny_cnn"].precision == "fp16"
    assert p.targets["cpu-int8"].tags == ["cpu", "int8", "int8-dynamic", "int8-static"]


def test_platform_keys(make_project: Callable[..., Path]) -> None:
    base = """
        [targets.arm]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        platform = "linux-aarch64"
    """
    with pytest.raises(ConfigError) as err:  # the default level bakes the build CPU's NCHWc layout in
        config.load(make_project(base))
    assert err.value.where == "targets.arm.optimization" and "NCHWc" in err.value.message
    assert 'optimization = "extended"' in err.value.render()
    arm = config.load(make_project(base + 'optimization = "extended"\nrunner = ["self-hosted", "arm64"]\n'))
    assert arm.targets["arm"].runner == ("self-hosted", "arm64")  # the target's own labels win
    # labels set for an x86 parent are not inherited by an aarch64 child; an aarch64 parent's are
    family = make_project("""
        [targets.x86]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        runner = ["self-hosted", "x64"]
        optimization = "extended"

        [targets.arm]
        extends = "x86"
        platform = "linux-aarch64"

        [targets.arm-big]
        extends = "arm"
        runner = ["self-hosted", "arm64", "big"]

        [targets.arm-big-int8]
        extends = "arm-big"
        precision = "int8-dynamic"
    """)
    runners = {n: t.runner for n, t in config.load(family).targets.items()}
    assert runners == {"x86": ("self-hosted", "x64"), "arm": ("ubuntu-24.04-arm",),
                       "arm-big": ("self-hosted", "arm64", "big"), "arm-big-int8": ("self-hosted", "arm64", "big")}
    with pytest.raises(ConfigError) as err:  # a relative budget across platforms, timed on one machine
        config.load(make_project(base + 'optimization = "extended"\n'
                                 'latency = { faster_than = { target = "x86", ratio = 1.2 } }\n'
                                 '[targets.x86]\nruntime = "RUNTIME"\nproviders = ["CPUExecutionProvider"]\n'))
    assert err.value.where == "targets.arm.latency.faster_than.target" and "platform" in err.value.message
    with pytest.raises(ConfigError) as err:
        config.load(make_project(base.replace("linux-aarch64", "linux-arm64")))
    assert err.value.where == "targets.arm.platform" and "did you mean 'linux-aarch64'" in err.value.message


def test_extends_chain_and_list_replacement(make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.a]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        fp16 = { op_block_list = ["Resize"], keep_io_types = false }

        [targets.b]
        extends = "a"
        precision = "fp16"

        [targets.c]
        extends = "b"
        fp16 = { op_block_list = ["TopK"] }
    """)
    c = config.load(path).targets["c"].settings["tiny_cnn"]
    assert c.precision == "fp16"
    assert c.fp16 == config.Fp16(op_block_list=("TopK",), keep_io_types=False, node_block_list=())


def test_later_overrides_win(make_project: Callable[..., Path]) -> None:
    path = make_project("""
        [targets.a]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        [[targets.a.overrides]]
        models = ["*"]
        optimization = "basic"
        [[targets.a.overrides]]
        models = ["tiny_c*"]
        optimization = "extended"
    """, models=("tiny_cnn", "tiny_lstm"))
    t = config.load(path).targets["a"]
    assert t.settings["tiny_cnn"].optimization == "extended"
    assert t.settings["tiny_lstm"].optimization == "basic"


@pytest.mark.parametrize("fixture", BAD, ids=[b.stem for b in BAD])
def test_bad_fixture_gives_one_clear_error(fixture: Path) -> None:
    expect = fixture.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(ConfigError) as err:
        config.load(fixture)
    assert expect in err.value.message
    assert str(fixture) in err.value.message  # names the file


def test_there_are_at_least_twenty_bad_fixtures() -> None:
    assert len(BAD) >= 20


def test_bad_fixtures_through_the_cli_exit_3_without_traceback() -> None:
    for fixture in BAD:
        proc = run_cli("plan", "-c", str(fixture))
        assert proc.returncode == 3, (fixture, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("config error") == 1, proc.stderr
        assert proc.stdout == ""


def test_missing_file_has_a_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as err:
        config.load(tmp_path / "targets.toml")
    assert err.value.hint and "-c PATH" in err.value.hint


def test_check_files_false_skips_existence(tmp_path: Path) -> None:
    bad = REPO / "tests" / "fixtures" / "bad" / "model_missing.toml"
    p = config.load(bad, check_files=False)
    assert "lstm" in p.models


ONE_MODEL = f"""
[project]
name = "p"
version = "1"
[models.cnn]
path = "{REPO / 'models' / 'tiny_cnn.onnx'}"
inputs = "{REPO / 'models' / 'tiny_cnn.inputs.npz'}"
"""


def _models(names: tuple[str, ...]) -> str:
    cnn = REPO / "models" / "tiny_cnn"
    return '[project]\nname = "p"\nversion = "1"\n' + "".join(
        f'[models."{n}"]\npath = "{cnn}.onnx"\ninputs = "{cnn}.inputs.npz"\n' for n in names) + \
        '[targets.cpu]\nruntime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\n'


def test_models_whose_python_loaders_would_share_a_module_name_are_refused(tmp_path: Path) -> None:
    """Each model's Python loader is the module ortbuild_<name, '-' and '.' as '_'>: two models that would share
    it are a config error naming both (an app could not import both); names that differ elsewhere are fine."""
    path = tmp_path / "targets.toml"
    path.write_text(_models(("resnet-50", "3d.unet", "resnet_50_v2", "Resnet-50")))
    assert sorted(config.load(path).models) == ["3d.unet", "Resnet-50", "resnet-50", "resnet_50_v2"]
    path.write_text(_models(("vgg", "resnet_50", "resnet-50")))
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert "[models.resnet-50] models 'resnet_50' and 'resnet-50' would both have the Python loader module " \
           "'ortbuild_resnet_50'" in err.value.message, err.value.message
    assert err.value.hint and "rename one of them" in err.value.hint


def test_a_long_extends_chain_resolves_without_recursion(tmp_path: Path) -> None:
    n = 3000
    text = ONE_MODEL
    text += "\n".join(f'[targets.t{i}]\nextends = "t{i + 1}"' for i in range(n - 1))
    text += f'\n[targets.t{n - 1}]\nruntime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\n'
    (tmp_path / "targets.toml").write_text(text)
    project = config.load(tmp_path / "targets.toml")
    assert project.targets["t0"].runtime == "onnxruntime==1.31.1" and len(project.targets) == n


def test_a_long_extends_cycle_is_one_short_error(tmp_path: Path) -> None:
    n = 3000
    text = ONE_MODEL
    text += "\n".join(f'[targets.t{i}]\nextends = "t{(i + 1) % n}"' for i in range(n))
    (tmp_path / "targets.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path / "targets.toml")
    assert err.value.message.endswith(
        "[targets.t2999.extends] cycle in extends: t0 -> t1 -> t2 -> ... (2995 more) -> t2998 -> t2999 -> t0")


def _providers(tmp_path: Path, body: str) -> list[tuple[str, dict[str, object]]]:
    (tmp_path / "targets.toml").write_text(ONE_MODEL + "[targets.t]\n" + body)
    t = config.load(tmp_path / "targets.toml").targets["t"]
    return [(p.name, dict(p.options)) for p in t.providers]


PLUGIN_RUNTIME = 'runtime = ["onnxruntime==1.31.1", "onnxruntime-ep-openvino==1.8.1"]\n'


def test_runtime_lists_the_flavor_then_its_plugin_eps(tmp_path: Path) -> None:
    (tmp_path / "targets.toml").write_text(ONE_MODEL + "[targets.t]\n" + PLUGIN_RUNTIME
                                           + 'providers = ["OpenVINOExecutionProvider", "CPUExecutionProvider"]\n')
    t = config.load(tmp_path / "targets.toml").targets["t"]
    assert t.runtime == "onnxruntime==1.31.1" and t.plugins == ("onnxruntime-ep-openvino==1.8.1",)
    assert t.requirements == (t.runtime, *t.plugins)
    assert t.runtime_text == "onnxruntime==1.31.1 onnxruntime-ep-openvino==1.8.1"
    plugin = t.plugin_for("OpenVINOExecutionProvider")
    assert plugin is not None and plugin.module == "onnxruntime_ep_openvino"
    assert t.plugin_for("CPUExecutionProvider") is None


def test_openvino_fp32_pins_the_f32_hint_and_a_stated_hint_wins(tmp_path: Path) -> None:
    pinned = _providers(tmp_path, PLUGIN_RUNTIME + 'providers = ["OpenVINOExecutionProvider"]\n')
    assert pinned == [("OpenVINOExecutionProvider", {
        "device_type": "CPU", "load_config": '{"CPU":{"INFERENCE_PRECISION_HINT":"f32"}}'})]
    stated = _providers(tmp_path, PLUGIN_RUNTIME + 'providers = [{ name = "OpenVINOExecutionProvider", options = '
                        '{ load_config = \'{"CPU": {"INFERENCE_PRECISION_HINT": "bf16", "NUM_STREAMS": "1"}}\' } }]\n')
    assert stated[0][1]["load_config"] == '{"CPU":{"INFERENCE_PRECISION_HINT":"bf16","NUM_STREAMS":"1"}}'
    fp16 = _providers(tmp_path, PLUGIN_RUNTIME + 'providers = ["OpenVINOExecutionProvider"]\nprecision = "fp16"\n')
    assert "load_config" not in fp16[0][1]  # an fp16 graph: the device's own execution precision
    flavor = _providers(tmp_path, 'runtime = "onnxruntime-openvino==1.24.1"\n'
                        'providers = [{ name = "OpenVINOExecutionProvider", options = { device_type = "CPU" } }]\n')
    assert flavor[0][1]["load_config"] == '{"CPU":{"INFERENCE_PRECISION_HINT":"f32"}}'  # the same pitfall


def test_cuda_gets_safe_defaults_unless_the_target_states_them(tmp_path: Path) -> None:
    defaults = _providers(tmp_path, 'runtime = "onnxruntime-gpu==1.31.1"\nproviders = ["CUDAExecutionProvider"]\n')
    assert defaults == [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": False})]
    stated = _providers(tmp_path, 'runtime = "onnxruntime-gpu==1.31.1"\nproviders = [{ name = "CUDAExecutionProvider",'
                        ' options = { use_tf32 = true, cudnn_conv_algo_search = "HEURISTIC" } }]\n')
    assert stated[0][1] == {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": True}


def test_every_unsupported_provider_is_refused_with_its_reason(tmp_path: Path) -> None:
    from ortbuild.project import capabilities, options

    refused = [p for p in options.PROVIDERS if capabilities.unsupported(p)]
    assert {"NnapiExecutionProvider", "XnnpackExecutionProvider", "WebGpuExecutionProvider"} <= set(refused)
    assert set(capabilities.supported()) | set(refused) == set(options.PROVIDERS)  # every name has an answer
    for name in refused:
        with pytest.raises(ConfigError) as err:
            _providers(tmp_path, f'runtime = "onnxruntime==1.31.1"\nproviders = ["{name}"]\n')
        assert capabilities.unsupported(name) in err.value.message and "docs/targets.md" in (err.value.hint or "")


@pytest.mark.parametrize("requirement, says", [
    ("onnxruntime; python_version<'3'", "has an environment marker"),
    ("onnxruntime==1.31.1; sys_platform == 'linux'", "has an environment marker"),
    ("onnxruntime @ file:///etc/passwd", "is a direct reference (@ file:///etc/passwd)"),
    ("onnxruntime @ https://example.com/onnxruntime-1.31.1-cp311-none-any.whl", "is a direct reference"),
    ("onnxruntime", "names no version"),
    ("onnxruntime>=1.20", "does not pin one exact version with =="),
    ("onnxruntime==1.31.*", "does not pin one exact version with =="),
    ("onnxruntime~=1.31.1", "does not pin one exact version with =="),
    ("onnxruntime===1.31.1", "does not pin one exact version with =="),
    ("onnxruntime==1.31.1,!=1.31.0", "does not pin one exact version with =="),
])
def test_a_runtime_that_is_not_a_plain_pin_is_refused_at_config_time(tmp_path: Path, requirement: str,
                                                                      says: str) -> None:
    escaped = requirement.replace('"', '\\"')
    for runtime in (f'"{escaped}"', f'["{escaped}", "onnxruntime-ep-openvino==1.8.1"]',
                    f'["onnxruntime==1.31.1", "{escaped.replace("onnxruntime", "onnxruntime-ep-openvino", 1)}"]'):
        (tmp_path / "targets.toml").write_text(ONE_MODEL + f'[targets.t]\nruntime = {runtime}\n'
                                               'providers = ["CPUExecutionProvider"]\n')
        with pytest.raises(ConfigError) as err:
            config.load(tmp_path / "targets.toml")
        assert err.value.message.startswith(f"{tmp_path / 'targets.toml'}: [targets.t.runtime] '"), err.value.message
        assert says in err.value.message and "a runtime is a plain pin of one release" in err.value.message
        assert err.value.hint and "==" in err.value.hint
        proc = run_cli("matrix", "-c", str(tmp_path / "targets.toml"))  # before anything is installed or run
        assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("runtime", ['"onnxruntime==1.31.1"', '"onnxruntime-gpu == 1.31.1"',
                                     '"onnxruntime[symbolic]==1.31.1"', '"onnxruntime==1.31.1+local"', PLUGIN_RUNTIME
                                     .removeprefix("runtime = ").strip()])
def test_plain_pins_stay_accepted(tmp_path: Path, runtime: str) -> None:
    providers = "CUDAExecutionProvider" if "gpu" in runtime else "CPUExecutionProvider"
    (tmp_path / "targets.toml").write_text(ONE_MODEL + f'[targets.t]\nruntime = {runtime}\n'
                                           f'providers = ["{providers}"]\n')
    t = config.load(tmp_path / "targets.toml").targets["t"]
    assert "==" in t.runtime


def _installed_onnxruntime() -> tuple[str, frozenset[str]]:
    import importlib.metadata as md

    from packaging.utils import canonicalize_name

    return md.version("onnxruntime"), frozenset(canonicalize_name(e) for e in
                                                md.metadata("onnxruntime").get_all("Provides-Extra") or [])


@pytest.mark.parametrize("requirement, says", [
    ("onnxruntime[extra]=={here}", "names the extra 'extra', which onnxruntime does not declare (its extras: "
                                   "{declared}; from the metadata of onnxruntime {here} installed here)"),
    ("onnxruntime-gpu[cuda,foo]==1.31.1", "names the extra 'foo', which onnxruntime-gpu does not declare (its "
                                          "extras: cuda, cudnn, quantization, symbolic; from onnxruntime-gpu "
                                          "1.31.1's metadata on PyPI)"),
    ("onnxruntime-openvino[gpu]==1.24.1", "names the extra 'gpu', which onnxruntime-openvino does not declare (its "
                                          "extras: none;"),
    ("onnxruntime-rocm[x]==1.22.0", "names extras ['x'], and ortbuild cannot tell which extras onnxruntime-rocm "
                                    "1.22.0 declares"),
])
def test_a_runtime_extra_its_distribution_does_not_declare_is_a_config_error(tmp_path: Path, requirement: str,
                                                                            says: str) -> None:
    here, declared = _installed_onnxruntime()
    requirement = requirement.format(here=here)
    providers = {"gpu": "CUDAExecutionProvider", "openvino": "OpenVINOExecutionProvider",
                 "rocm": "ROCMExecutionProvider"}
    provider = next((p for k, p in providers.items() if k in requirement), "CPUExecutionProvider")
    (tmp_path / "targets.toml").write_text(ONE_MODEL + f'[targets.t]\nruntime = "{requirement}"\n'
                                           f'providers = ["{provider}"]\n')
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path / "targets.toml")
    assert err.value.message.startswith(f"{tmp_path / 'targets.toml'}: [targets.t.runtime] '{requirement}' ")
    assert says.format(here=here, declared=", ".join(sorted(declared))) in err.value.message, err.value.message
    assert err.value.hint
    proc = run_cli("matrix", "-c", str(tmp_path / "targets.toml"))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "[targets.t.runtime]" in proc.stderr


def test_declared_runtime_extras_are_accepted_in_any_spelling(tmp_path: Path) -> None:
    here, declared = _installed_onnxruntime()
    for requirement, provider in [(f"onnxruntime[{','.join(sorted(declared)).upper()}]=={here}",
                                   "CPUExecutionProvider"),
                                  ("onnxruntime-gpu[cuda,CUDNN]==1.31.1", "CUDAExecutionProvider"),
                                  ("onnxruntime[Symbolic]==1.30.0", "CPUExecutionProvider")]:
        (tmp_path / "targets.toml").write_text(ONE_MODEL + f'[targets.t]\nruntime = "{requirement}"\n'
                                               f'providers = ["{provider}"]\n')
        assert config.load(tmp_path / "targets.toml").targets["t"].runtime == requirement


def test_runtime_extras_come_from_the_installed_metadata_at_the_pinned_version_else_the_table() -> None:
    from ortbuild.project import runtimes

    here, declared = _installed_onnxruntime()
    assert runtimes.declared_extras("onnxruntime", here) == (declared, f"the metadata of onnxruntime {here} "
                                                                       "installed here")
    other = "0.0.1" if here != "0.0.1" else "0.0.2"
    extras, source = runtimes.declared_extras("onnxruntime", other) or (frozenset(), "")
    assert extras == runtimes.KNOWN_EXTRAS["onnxruntime"][1] and "metadata on PyPI" in source and other in source
    assert runtimes.declared_extras("onnxruntime-rocm", "1.22.0") is None
    assert set(runtimes.KNOWN_EXTRAS) >= set(options.RUNTIMES) - {"onnxruntime-rocm"} | set(options.PLUGINS)


@pytest.mark.parametrize("key", ["path", "inputs", "calibration", "expected"])
@pytest.mark.parametrize("check_files", [True, False])
def test_a_nul_byte_in_a_model_path_is_a_config_error_naming_the_key(tmp_path: Path, key: str,
                                                                     check_files: bool) -> None:
    table = {"path": f"{REPO / 'models' / 'tiny_cnn.onnx'}", "inputs": f"{REPO / 'models' / 'tiny_cnn.inputs.npz'}"}
    table[key] = "models/a\\u0000b.onnx"
    text = ('[project]\nname = "p"\nversion = "1"\n[models.cnn]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in table.items())
            + '[targets.t]\nruntime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\n')
    (tmp_path / "targets.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path / "targets.toml", check_files=check_files)
    assert err.value.message.startswith(f"{tmp_path / 'targets.toml'}: [models.cnn.{key}] 'models/a\\x00b.onnx' "
                                        "holds a NUL byte"), err.value.message
    if key == "path" and check_files:
        proc = run_cli("plan", "-c", str(tmp_path / "targets.toml"))
        assert proc.returncode == 3 and "[models.cnn.path]" in proc.stderr and "Traceback" not in proc.stderr



ACCURACY_CHAIN = """
    [targets.cpu-fp32]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    accuracy = { atol = 1e-4, outputs.logits = { rtol = 1e-3 }, outputs.seed = { ignore = true } }

    [[targets.cpu-fp32.overrides]]
    models = ["tiny_cnn"]
    accuracy = { mismatch_fraction = 0.01 }

    [[targets.cpu-fp32.overrides]]
    models = ["tiny_transformer"]
    precision = "fp16"
    accuracy = { cosine = 0.9995 }

    [targets.fp32-child]
    extends = "cpu-fp32"
    accuracy = { rtol = 1e-3 }

    [targets.int8]
    extends = "cpu-fp32"
    precision = "int8-dynamic"

    [targets.int8-own]
    extends = "cpu-fp32"
    precision = "int8-dynamic"
    accuracy = { cosine = 0.995, outputs.logits = { top1 = 0.99 } }

    [targets.int8-grandchild]
    extends = "int8"

    [targets.static]
    extends = "int8-own"
    precision = "int8-static"
"""
MODELS = ("tiny_cnn", "tiny_transformer")


def _rule(p: config.Project, target: str, output: str, model: str = "tiny_cnn") -> dict[str, object]:
    s = p.targets[target].settings[model]
    assert s.gates is not None
    return {k: v for k, v in s.gates.accuracy_rule(s.precision, output).items() if v}


def _dropped(p: config.Project, target: str, model: str = "tiny_cnn") -> tuple[str, ...]:
    gates = p.targets[target].settings[model].gates
    assert gates is not None
    return gates.not_inherited


def test_accuracy_rules_follow_precision_through_extends(make_project: Callable[..., Path]) -> None:
    p = config.load(make_project(ACCURACY_CHAIN, models=MODELS, calibration=True))
    assert _rule(p, "cpu-fp32", "logits") == {"rtol": 1e-3, "atol": 1e-4, "mismatch_fraction": 0.01}
    # same precision: inherited (its overrides too), the child's key over the parent's
    assert _rule(p, "fp32-child", "y") == {"rtol": 1e-3, "atol": 1e-4, "mismatch_fraction": 0.01}
    assert _dropped(p, "fp32-child") == ()
    # another precision: the int8 default, not the parent's elementwise rule on top of it; per-output rules too,
    # except `ignore` (what an output is, not how close it must be)
    assert _rule(p, "int8", "logits") == {"cosine": 0.99}
    assert _rule(p, "int8", "seed") == {"cosine": 0.99, "ignore": True}
    assert _dropped(p, "int8") == ("the fp32 rule of cpu-fp32", "the fp32 rule of cpu-fp32.overrides[0]")
    # an inherited override with its own precision keeps its rule (written for that precision)
    assert _rule(p, "int8", "y", "tiny_transformer") == {"cosine": 0.9995}
    assert _dropped(p, "int8", "tiny_transformer") == ("the fp32 rule of cpu-fp32",)
    # the child's own table over its precision's default
    assert _rule(p, "int8-own", "logits") == {"cosine": 0.995, "top1": 0.99}
    assert _rule(p, "int8-own", "y") == {"cosine": 0.995}
    # what was dropped stays dropped down the chain; int8-dynamic and int8-static share their rules
    assert _rule(p, "int8-grandchild", "logits") == {"cosine": 0.99}
    assert _dropped(p, "int8-grandchild") == _dropped(p, "int8")
    assert _rule(p, "static", "logits") == {"cosine": 0.995, "top1": 0.99}


def test_an_override_with_another_precision_starts_from_its_default(make_project: Callable[..., Path]) -> None:
    p = config.load(make_project(ACCURACY_CHAIN, models=MODELS, calibration=True))
    # the fp32 target's own override switches the transformer to fp16: its cosine, not fp32's atol and rtol
    assert _rule(p, "cpu-fp32", "logits", "tiny_transformer") == {"cosine": 0.9995}
    assert _dropped(p, "cpu-fp32", "tiny_transformer") == ("the fp32 rule of cpu-fp32",)
    p = config.load(make_project("""
        [targets.int8]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        precision = "int8-dynamic"
        accuracy = { cosine = 0.98, outputs.logits = { top1 = 0.9 } }

        [[targets.int8.overrides]]
        models = ["tiny_cnn"]
        precision = "int8-static"

        [[targets.int8.overrides]]
        models = ["tiny_transformer"]
        precision = "fp32"
        accuracy = { atol = 1e-3 }
    """, models=MODELS, calibration=True))
    assert _rule(p, "int8", "logits") == {"cosine": 0.98, "top1": 0.9}  # int8-static: the same rules
    assert _rule(p, "int8", "logits", "tiny_transformer") == {"rtol": 1e-4, "atol": 1e-3}
    assert _dropped(p, "int8", "tiny_transformer") == ("the int8-dynamic rule of int8",)


def test_plan_says_which_rule_applies_and_what_was_not_inherited(make_project: Callable[..., Path]) -> None:
    path = make_project(ACCURACY_CHAIN, models=MODELS, calibration=True)
    proc = run_cli("plan", "-c", str(path), "-t", "int8", "-t", "int8-own", "-t", "fp32-child")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert ("  int8/tiny_cnn: cosine >= 0.99; outputs.seed: ignored (int8-dynamic default; the fp32 rule of "
            "cpu-fp32 and the fp32 rule of cpu-fp32.overrides[0] are not inherited across precisions)") in lines, \
        proc.stdout
    assert ("  int8/tiny_transformer: cosine >= 0.9995; outputs.seed: ignored (targets.toml over the fp16 default; "
            "the fp32 rule of cpu-fp32 is not inherited across precisions)") in lines, proc.stdout
    assert ("  int8-own/tiny_cnn: cosine >= 0.995; outputs.seed: ignored; outputs.logits: top1 >= 0.99 (targets.toml "
            "over the int8-dynamic default; the fp32 rule of cpu-fp32 and the fp32 rule of cpu-fp32.overrides[0] are "
            "not inherited across precisions)") in lines, proc.stdout
    assert ("  fp32-child/tiny_cnn: rtol 0.001, atol 0.0001, mismatch_fraction 0.01; outputs.logits: rtol 0.001; "
            "outputs.seed: ignored (targets.toml over the fp32 default)") in lines, proc.stdout


def test_a_table_written_inline_and_extended_by_a_header_gets_a_hint(tmp_path: Path) -> None:
    """TOML forbids `latency = { ... }` followed by `[targets.X.latency.server]` (docs show both forms): the error
    says what to write instead."""
    path = tmp_path / "targets.toml"
    path.write_text('[project]\nname = "a"\nversion = "1"\n[targets.x]\nlatency = { p90_ms = 50 }\n'
                    "[targets.x.latency.server]\nqps = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML: Cannot declare") as e:
        config.load(path)
    assert e.value.hint is not None and "[targets.X.latency.server]" in e.value.hint
