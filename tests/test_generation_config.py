"""The keys of generative models (ortbuild.project.generation, through ortbuild.project.config): a Hugging
Face-format directory as a model's `path`, what a generative model's targets may declare, which models a target
selects, and what a generative target's environment, nox tags and sessions are. No torch: these run in the default
test session (the builds themselves are tests/test_genai.py's, marked `generative`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ortbuild.artifact import keys
from ortbuild.errors import ConfigError
from ortbuild.pipeline.build import Builder
from ortbuild.project import config, generation, plan
from tests.conftest import MODELS, REPO, run_cli

STUB = REPO / "tests" / "fixtures" / "hf_stub"
CPU = 'runtime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\n'


def _project(tmp_path: Path, targets: str, *, llm: Path | str = STUB, llm_extra: str = "", onnx: bool = False,
             onnx_extra: str = "") -> Path:
    """targets.toml with the generative model `llm` (a directory: the stub by default), and the ONNX model
    `cnn` where `onnx`, then `targets` (TOML text)."""
    prompts = f"{llm}/prompts.txt"
    text = ('[project]\nname = "p"\nversion = "1"\n'
            f'[models.llm]\npath = "{llm}"\ninputs = "{prompts}"\n{llm_extra}')
    if onnx:
        text += (f'[models.cnn]\npath = "{MODELS / "tiny_cnn.onnx"}"\ninputs = "{MODELS / "tiny_cnn.inputs.npz"}"\n'
                 + onnx_extra)
    path = tmp_path / "targets.toml"
    path.write_text(text + targets)
    return path


def _error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        config.load(path)
    e = err.value
    assert e.file == str(path) and e.message.startswith(f"{path}: [{e.where}] "), e.message  # names file and key
    assert e.hint, f"no hint: {e.render()}"
    return e


def test_a_hugging_face_directory_makes_a_generative_model_and_target(tmp_path: Path) -> None:
    p = config.load(_project(tmp_path, '[targets.llm-cpu]\n' + CPU + 'models = ["llm"]\n', onnx=True))
    assert p.models["llm"].kind == "generative" and p.models["cnn"].kind == "onnx"
    assert p.models["llm"].path == STUB and p.models["llm"].inputs == STUB / "prompts.txt"
    t = p.targets["llm-cpu"]
    assert t.kind == "generative" and t.models == ("llm",)
    assert t.settings["llm"].precision == "fp32"


@pytest.mark.parametrize(("remove", "said"), [
    ("config.json", "has no config.json"),
    ("model.safetensors", "has no weights (model.safetensors, "),
    ("tokenizer.json", "has no tokenizer.json"),
])
def test_a_directory_the_builder_cannot_read_is_refused_naming_what_it_lacks(tmp_path: Path, remove: str,
                                                                             said: str) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(STUB, hf)
    config.load(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n', llm=hf))  # whole: it loads
    (hf / remove).unlink()
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n', llm=hf))
    assert e.where == "models.llm.path" and said in e.detail, e.message
    assert e.hint is not None and "Hugging Face-format directory" in e.hint


def test_any_weights_file_the_builder_reads_will_do(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(STUB, hf)
    (hf / "model.safetensors").rename(hf / "pytorch_model.bin")
    path = _project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n', llm=hf)
    assert config.load(path).models["llm"].kind == "generative"
    assert generation.directory_problem(hf) is None
    assert generation.directory_problem(hf / "config.json") == "is not a directory"


@pytest.mark.parametrize(("body", "where", "said"), [
    (CPU + 'precision = "int8-static"\n', "targets.t.precision",
     "'int8-static' cannot be built for generative model 'llm': onnxruntime-genai's model builder makes fp32, fp16, "
     "int8-dynamic, int4-weight"),
    ('runtime = "onnxruntime-openvino==1.24.1"\nproviders = ["OpenVINOExecutionProvider"]\n', "targets.t.providers",
     "'OpenVINOExecutionProvider' is not a provider onnxruntime-genai's model builder builds for"),
    (CPU + 'format = "ort"\n', "targets.t.format", "is built as onnx only"),
    (CPU + 'fusion = { model_type = "gpt2" }\n', "targets.t.fusion", "writes fused attention itself"),
])
def test_what_the_model_builder_cannot_make_is_refused(tmp_path: Path, body: str, where: str, said: str) -> None:
    e = _error(_project(tmp_path, "[targets.t]\n" + body + 'models = ["llm"]\n'))
    assert e.where == where and said in e.detail, e.message


def test_the_same_keys_on_an_onnx_model_are_accepted(tmp_path: Path) -> None:
    """The refusals above are the generative model's: an ONNX model's target takes int8-static and ort."""
    p = config.load(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["cnn"]\nprecision = "int8-static"\n'
                             'format = "ort"\n', onnx=True,
                             onnx_extra=f'calibration = "{MODELS / "tiny_cnn.calib.npz"}"\n'))
    assert p.targets["t"].settings["cnn"].format == "ort" and p.targets["t"].kind == "onnx"


@pytest.mark.parametrize(("key", "value"), [
    ("calibration", f'"{MODELS / "tiny_cnn.calib.npz"}"'),
    ("eval", f'{{ inputs = "{MODELS / "tiny_cnn.inputs.npz"}", labels = "{MODELS / "tiny_cnn.calib.npz"}" }}'),
    ("custom_ops", '["onnxruntime-extensions==0.15.2"]'),
])
def test_onnx_graph_keys_on_a_generative_model_are_refused(tmp_path: Path, key: str, value: str) -> None:
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n', llm_extra=f"{key} = {value}\n"))
    assert e.where == f"models.llm.{key}" and "has no meaning for a generative model" in e.detail, e.message
    assert e.hint is not None and "[targets.X.tokens]" in e.hint


def test_heldout_is_a_generative_models_key(tmp_path: Path) -> None:
    heldout = f'heldout = "{REPO / "README.md"}"\n'
    p = config.load(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n', llm_extra=heldout))
    assert p.models["llm"].heldout == REPO / "README.md"
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["cnn"]\n', onnx=True, onnx_extra=heldout))
    assert e.where == "models.cnn.heldout" and "this model is an ONNX file" in e.detail, e.message


def test_a_generative_models_prompts_must_be_a_file(tmp_path: Path) -> None:
    text = _project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm"]\n').read_text()
    (tmp_path / "targets.toml").write_text(text.replace(f'inputs = "{STUB}/prompts.txt"', f'inputs = "{STUB}"'))
    e = _error(tmp_path / "targets.toml")
    assert e.where == "models.llm.inputs" and "prompts, one per line" in e.detail, e.message


def test_a_target_builds_one_kind_of_model(tmp_path: Path) -> None:
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["llm", "cnn"]\n', onnx=True))
    assert e.where == "targets.t.models" and "a target builds one kind" in e.detail, e.message
    assert "generative model(s) (llm)" in e.detail and "ONNX models (cnn)" in e.detail
    assert e.hint is not None and "a target of their own" in e.hint


def test_a_wildcard_never_selects_a_generative_model(tmp_path: Path) -> None:
    p = config.load(_project(tmp_path, "[targets.all]\n" + CPU + 'models = ["*"]\n'
                             "[targets.named]\n" + CPU + 'models = ["l*", "llm"]\n', onnx=True))
    assert p.targets["all"].models == ("cnn",) and p.targets["all"].kind == "onnx"
    assert p.targets["named"].models == ("llm",) and p.targets["named"].kind == "generative"  # named: selected
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU + 'models = ["l*"]\n', onnx=True))
    assert e.where == "targets.t.models" and "selects only generative models through wildcards (l*)" in e.detail
    assert e.hint is not None and "name a generative model" in e.hint
    # the target-level default (models = ["*"]) of a project whose only model is generative selects nothing either
    e = _error(_project(tmp_path, "[targets.t]\n" + CPU))
    assert e.where == "targets.t.models" and "through wildcards (*)" in e.detail, e.message


def test_a_generative_target_installs_the_builder_and_has_its_own_tag_and_sessions(tmp_path: Path) -> None:
    p = config.load(_project(tmp_path, "[targets.llm-int4]\n" + CPU + 'models = ["llm"]\nprecision = "int4-weight"\n'
                             "[targets.cnn]\n" + CPU + 'models = ["cnn"]\n', onnx=True))
    llm, cnn = p.targets["llm-int4"], p.targets["cnn"]
    assert llm.requirements == ("onnxruntime==1.31.1", *generation.BUILDER_REQUIREMENTS)
    names = [r.split("==")[0] for r in llm.requirements]
    assert {"onnxruntime-genai", "torch", "transformers"} <= set(names)
    assert all("==" in r for r in llm.requirements)  # pinned: the builder's output is part of the build key
    assert cnn.requirements == ("onnxruntime==1.31.1",)
    assert "generative" in llm.tags and "int4" in llm.tags and "generative" not in cnn.tags
    assert llm.session("test") == "test-generative(llm-int4)" and llm.session("build") == "build-generative(llm-int4)"
    assert cnn.session("test") == "test(cnn)"
    assert llm.runtime_text.startswith("onnxruntime==1.31.1 onnxruntime-genai==")


def test_tokens_and_generation_keys_are_checked(tmp_path: Path) -> None:
    body = "[targets.t]\n" + CPU + 'models = ["llm"]\n'
    p = config.load(_project(tmp_path, body + "tokens = { max_tokens = 16, match_tokens = 8, min_cosine = 0.9 }\n"
                                              "generation = { ttft_p90_ms = 50, max_memory_mb = 300 }\n"))
    g = p.targets["t"].settings["llm"].gates
    assert g is not None
    assert (g.tokens.max_tokens, g.tokens.match_tokens, g.tokens.min_cosine) == (16, 8, 0.9)
    assert g.generation.ttft_p90_ms == 50 and g.generation.max_memory_mb == 300 and g.generation.declared
    unset = config.load(_project(tmp_path, body)).targets["t"].settings["llm"].gates
    assert unset is not None and not unset.generation.declared
    e = _error(_project(tmp_path, body + "tokens = { max_token = 16 }\n"))
    assert "max_token" in e.message and "did you mean 'max_tokens'" in e.message, e.message
    e = _error(_project(tmp_path, body + "generation = { ttft_p90 = 50 }\n"))
    assert "ttft_p90" in e.message and "did you mean 'ttft_p90_ms'" in e.message, e.message
    with pytest.raises(ConfigError) as err:
        config.load(_project(tmp_path, body + "tokens = { min_agreement = 1.5 }\n"))
    assert err.value.where == "targets.t.tokens.min_agreement" and "from 0 to 1" in err.value.detail


def _build_key(root: Path, targets: str, llm: Path) -> tuple[str, dict[str, str]]:
    """The real build key of job t/llm (Builder.prepare: every digest, no build) and its parts."""
    project = config.load(_project(root, targets, llm=llm))
    job = plan.jobs(project, ["t"], ["llm"])[0]
    prepared = Builder(project, root / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None).prepare(job)
    return prepared.key, {k: str(v) for k, v in prepared.key_parts.items()}


def test_token_and_generation_budgets_never_change_the_build_key_and_the_source_files_do(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(STUB, hf)
    body = "[targets.t]\n" + CPU + 'models = ["llm"]\n'
    base, parts = _build_key(tmp_path, body, hf)
    budgets, _ = _build_key(tmp_path, body + "tokens = { max_tokens = 8, min_cosine = 0.5 }\n"
                                             "generation = { ttft_p50_ms = 1, new_tokens = 4 }\n", hf)
    assert budgets == base
    int4, _ = _build_key(tmp_path, body + 'precision = "int4-weight"\n', hf)
    assert int4 != base  # what the builder makes does change it
    # config.json stands for the graph (`source`), every other file of the directory is named
    assert {"source", "source:model.safetensors", "source:tokenizer.json", "source:prompts.txt"} <= set(parts), parts
    (hf / "tokenizer.json").write_text("{} ")
    changed, changed_parts = _build_key(tmp_path, body, hf)
    assert changed != base
    assert [k for k in parts if parts[k] != changed_parts.get(k)] == ["source:tokenizer.json"]


def test_a_generative_model_not_made_yet_loads_and_its_build_says_how_to_make_it(tmp_path: Path) -> None:
    path = _project(tmp_path, "[targets.llm]\n" + CPU + 'models = ["llm"]\n', llm="models/tiny_llama")
    p = config.load(path)  # made on first use: other commands keep working
    assert p.models["llm"].kind == "generative" and p.targets["llm"].kind == "generative"
    job = plan.jobs(p, ["llm"], ["llm"])[0]
    with pytest.raises(ConfigError) as err:
        Builder(p, tmp_path / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None).prepare(job)
    assert err.value.where == "models.llm.path" and "is not made yet" in err.value.detail
    assert err.value.hint is not None and "nox -s example-llm" in err.value.hint
    # a file path (with a suffix) that does not exist is an ONNX model that is missing, not a generative one
    text = path.read_text().replace('path = "models/tiny_llama"', 'path = "models/tiny_llama.onnx"')
    path.write_text(text)
    e = _error(path)
    assert e.where == "models.llm.path" and "does not exist" in e.detail


def test_building_a_generative_target_where_its_builder_is_missing_names_its_own_nox_session(tmp_path: Path) -> None:
    if all(__import__("importlib").util.find_spec(m) for m in ("onnxruntime_genai", "torch", "transformers")):
        pytest.skip("this environment holds the model builder (tests/test_genai.py builds here)")
    path = _project(tmp_path, "[targets.llm]\n" + CPU + 'models = ["llm"]\n')
    proc = run_cli("build", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert "onnxruntime-genai==" in proc.stderr and "build-generative(llm)" in proc.stderr, proc.stderr


def test_plan_lists_a_generative_target(tmp_path: Path) -> None:
    """plan checks each ONNX model's golden inputs against its graph; a generative model's directory is no graph
    (its build's check step reads it)."""
    path = _project(tmp_path, "[targets.llm]\n" + CPU + 'models = ["llm"]\n' + "[targets.cnn]\n" + CPU
                    + 'models = ["cnn"]\n', onnx=True)
    proc = run_cli("plan", "-c", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["target"]: r for r in json.loads(proc.stdout)}
    assert rows["llm"]["model"] == "llm" and "onnxruntime-genai==" in rows["llm"]["runtime"]
    assert rows["cnn"]["model"] == "cnn"
