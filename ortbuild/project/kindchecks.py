"""The load-time checks that differ by kind of model (ortbuild.project.kinds): a `[models.X]` table's keys, and
what a target may ask of one of its models (a generative model's: what onnxruntime-genai's model builder makes).
A table per check, keyed by `Kind`: ortbuild.project.config asks `MODEL_CHECKS[model.kind]`, never a flag.
Stdlib + packaging only (the noxfile imports it through ortbuild.project.config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ortbuild.project import generation
from ortbuild.project.checker import Checker, short_repr
from ortbuild.project.kinds import Kind, kind_rule

# (checker, "models.X", its table, its resolved paths by key, whether its files are checked)
ModelCheck = Callable[[Checker, str, Mapping[str, Any], Mapping[str, Path | None], bool], None]
# (checker, "targets.T", the model's name, the job's effective settings table)
SettingsCheck = Callable[[Checker, str, str, Mapping[str, Any]], None]


def _onnx_model(chk: Checker, where: str, table: Mapping[str, Any], found: Mapping[str, Path | None],
                check_files: bool) -> None:
    """An ONNX model's keys: a generative model's own keys are refused."""
    for k in kind_rule("generative").model_keys:
        if found.get(k) is not None:
            raise chk.fail(f"{where}.{k}", "is a generative model's key, and this model is an ONNX file",
                           "remove it (a generative model's `path` is a Hugging Face-format directory)")


def _generative_model(chk: Checker, where: str, table: Mapping[str, Any], found: Mapping[str, Path | None],
                      check_files: bool) -> None:
    """A generative model's keys: the ONNX-graph ones have no meaning for it; its prompts are a text file."""
    for k in kind_rule("onnx").model_keys:
        if table.get(k):
            raise chk.fail(f"{where}.{k}", "has no meaning for a generative model (its `path` is a Hugging "
                                           "Face-format directory, built by onnxruntime-genai's model builder)",
                           "remove it; a generative model is judged by `[targets.X.tokens]` (docs/generative.md)")
    inputs = found["inputs"]
    if check_files and inputs is not None and not inputs.is_file():
        raise chk.fail(f"{where}.inputs", f"{short_repr(table['inputs'])} is not a file: a generative model's golden "
                                          "inputs are a UTF-8 text file of prompts, one per line",
                       "e.g. inputs = \"models/tiny_llama/prompts.txt\"")


def _onnx_settings(chk: Checker, where: str, model: str, eff: Mapping[str, Any]) -> None:
    """An ONNX model's target: its keys are checked by ortbuild.project.validation, as every model's are."""


def _generative_settings(chk: Checker, where: str, model: str, eff: Mapping[str, Any]) -> None:
    """A generative model's target: what onnxruntime-genai's model builder can make."""
    if eff["precision"] not in generation.BUILDER_PRECISION:
        raise chk.fail(f"{where}.precision", f"'{eff['precision']}' cannot be built for generative model '{model}': "
                                             "onnxruntime-genai's model builder makes "
                                             f"{', '.join(generation.BUILDER_PRECISION)}",
                       "int4-weight (with [targets.X.int4] block_size and accuracy_level) is the usual LLM precision")
    first = eff["providers"][0]
    name = first if isinstance(first, str) else first.get("name", "")
    if name not in generation.BUILDER_PROVIDER:
        raise chk.fail(f"{where}.providers", f"'{name}' is not a provider onnxruntime-genai's model builder builds "
                                             f"for (generative model '{model}')",
                       f"use one of {', '.join(generation.BUILDER_PROVIDER)}")
    for k, default in (("format", "onnx"), ("fusion", None)):
        if k == "fusion" and eff.get("fusion", {}).get("model_type", "off") != "off":
            raise chk.fail(f"{where}.fusion", f"generative model '{model}': the model builder writes fused "
                                              "attention itself", "remove the fusion table for this model")
        if k == "format" and eff.get("format", default) != default:
            raise chk.fail(f"{where}.format", f"generative model '{model}' is built as onnx only (onnxruntime-genai "
                                              "opens ONNX files)", 'use format = "onnx" for this target')


# Each kind's checks, run after the checks every model (every job) gets.
MODEL_CHECKS: dict[Kind, ModelCheck] = {"onnx": _onnx_model, "generative": _generative_model}
SETTINGS_CHECKS: dict[Kind, SettingsCheck] = {"onnx": _onnx_settings, "generative": _generative_settings}
