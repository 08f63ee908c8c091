"""The kinds of model (ortbuild.project.kinds): each rule's fields for both kinds, `kind_of` on real files, and the
JSON spelling every document keeps (`"generative": <flag>`). No torch, no onnxruntime."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from ortbuild.project import declare, generation, kinds, settings
from ortbuild.project.kinds import RULES, Kind, KindRule, kind_of, kind_rule
from tests.conftest import MODELS

ONNX, GENERATIVE = kind_rule("onnx"), kind_rule("generative")


def test_the_rules_name_the_kinds_in_order() -> None:
    assert tuple(RULES) == get_args(Kind) == kinds.KINDS == ("onnx", "generative")
    assert all(r.name == k for k, r in RULES.items())
    assert kind_rule(GENERATIVE) is GENERATIVE  # a rule is its own rule
    with pytest.raises(dataclasses.FrozenInstanceError):
        ONNX.directory = True  # type: ignore[misc]


def test_an_onnx_model_is_a_file_built_by_ortbuilds_pipeline() -> None:
    expected = KindRule(
        name="onnx", directory=False, made_on_first_use=False, wildcards=True,
        model_keys=("calibration", "eval", "custom_ops"), requirements=(), venv="runtime", session_suffix="",
        tag=None, builder_in_key=False, not_covered=None, js_refusal=None, golden_tokens=False, token_gate=False,
        records_expected=True, flag=False, path_hint="name an ONNX model file",
        data_hint="name an .npz file or a directory of test_data_set_N/ (docs/targets-reference.md)")
    assert expected == ONNX
    assert ONNX.session("test", "cpu-fp32") == "test(cpu-fp32)"
    assert ONNX.session("build", "cpu-fp32") == "build(cpu-fp32)"


def test_a_generative_model_is_a_directory_built_by_the_model_builder() -> None:
    g = GENERATIVE
    assert g.directory and g.made_on_first_use and not g.wildcards
    assert g.model_keys == ("heldout",)
    assert g.requirements == generation.BUILDER_REQUIREMENTS
    assert g.requirements[0].startswith("onnxruntime-genai==") and any(r.startswith("torch==") for r in g.requirements)
    assert g.venv == "generative" and g.tag == "generative" and g.session_suffix == "-generative"
    assert g.session("test", "llm-int4") == "test-generative(llm-int4)"
    assert g.session("release", "llm-int4") == "release-generative(llm-int4)"
    assert g.builder_in_key and g.golden_tokens and g.token_gate and g.flag
    assert not g.records_expected
    assert g.not_covered == generation.NOT_PROFILED and "do not cover it" in g.not_covered
    assert g.js_refusal is not None and "onnxruntime-genai has no Node.js or browser package" in g.js_refusal
    assert g.js_refusal.endswith("open it with the Python loader")
    assert g.path_hint.endswith("or a Hugging Face-format directory of a generative model (docs/generative.md)")
    assert g.data_hint.startswith("a UTF-8 text file (docs/generative.md): one golden prompt per line")


def test_each_kind_refuses_the_others_model_keys() -> None:
    assert not set(ONNX.model_keys) & set(GENERATIVE.model_keys)


def test_kind_of_a_real_onnx_file_and_a_real_directory(tmp_path: Path) -> None:
    assert kind_of(MODELS / "tiny_cnn.onnx") == "onnx"
    assert kind_of(MODELS / "breast_cancer_gb.onnx") == "onnx"
    assert kind_of(MODELS / "tiny_cnn.inputs.npz") == "onnx"  # a file, whatever its suffix
    (tmp_path / "llm").mkdir()
    assert kind_of(tmp_path / "llm") == "generative"
    assert kind_of(MODELS) == "generative"  # any directory
    assert kind_of(tmp_path / "not_made_yet") == "generative"  # no suffix, not there: made on first use
    assert kind_of(tmp_path / "missing.onnx") == "onnx"
    assert kind_of(tmp_path / "missing.ort") == "onnx"
    assert kind_of(tmp_path / ("x" * 300)) == "onnx"  # a name no file can have: its own check says why


def test_json_documents_spell_a_kind_as_before() -> None:
    """Gate digests (plain(gates)) and model documents keep `"generative": <bool>`; no `kind` key appears."""
    for k in kinds.KINDS:
        assert kinds.spelled(k) == ("generative", kind_rule(k).flag)
    gates = settings.Gates(kind="generative")
    doc = declare.plain(gates)
    assert isinstance(doc, dict) and doc["generative"] is True and "kind" not in doc
    plain_onnx = declare.plain(settings.Gates())
    assert isinstance(plain_onnx, dict) and plain_onnx["generative"] is False
    assert list(doc) == list(plain_onnx)  # the key where the field is, in field order
    assert "kind" not in {k.name for k in declare.keys_of(settings.Gates)}  # derived: not a targets.toml key
    assert "generative" not in {k.name for k in declare.keys_of(settings.Model)}
