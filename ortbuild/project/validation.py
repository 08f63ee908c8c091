"""Checks of a job's effective settings (after `extends` and overrides) that span several keys: calibration,
int4 sizes, formats, fusion, custom ops, and the budgets that name other targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ortbuild.project import options, precisions
from ortbuild.project.checker import Checker, did_you_mean, providers_of
from ortbuild.project.providers import MOBILE_PROVIDERS, CustomOps
from ortbuild.project.sections import Latency
from ortbuild.project.settings import Model, Target


def check_settings(chk: Checker, where: str, model: Model, eff: dict[str, Any]) -> None:
    if precisions.rule(eff["precision"]).needs_calibration and model.calibration is None:
        raise chk.fail(f"{where}.precision",
                       f"{eff['precision']} needs calibration data, and model '{model.name}' has none",
                       f"add `calibration = \"...npz\"` to [models.{model.name}], or use int8-dynamic "
                       "for this model (an [[overrides]] entry)")
    bs = eff["int4"].get("block_size", 32)
    if bs not in (16, 32, 64, 128, 256):
        raise chk.fail(f"{where}.int4.block_size", f"{bs} is not one of 16, 32, 64, 128, 256")
    if eff["int4"].get("accuracy_level", 0) > 4:
        raise chk.fail(f"{where}.int4.accuracy_level", "must be 0-4")
    fmt = precisions.format_rule(eff["format"])
    if eff["external_data"] and not fmt.external_data:
        raise chk.fail(f"{where}.external_data", f"format '{fmt.name}' cannot hold external data",
                       "use format = \"onnx\" with external_data = true")
    compiling = [p.name for p in providers_of(eff["providers"]) if p.name in options.COMPILING_PROVIDERS]
    # CoreML, a mobile package's EP, compiles the .ort's basic-level graph when the app loads it (as for "onnx")
    ahead = [p for p in compiling if p not in MOBILE_PROVIDERS]
    if ahead and not fmt.compiled_graphs:
        raise chk.fail(f"{where}.format", f"format '{fmt.name}' cannot hold graphs for {ahead[0]}",
                       "use format = \"onnx\" for compiling providers (format \"ort\" is for mobile packages: "
                       "CPUExecutionProvider, or CoreMLExecutionProvider with it)")
    check_fusion(chk, f"{where}.fusion", model, eff["fusion"], compiling)


def check_custom_ops(chk: Checker, where: str, model: str, eff: dict[str, Any], ops: tuple[CustomOps, ...]) -> None:
    """The quantizers open sessions of their own, which cannot register the model's custom ops."""
    rule = precisions.rule(eff["precision"])
    if ops and rule.needs_calibration:
        raise chk.fail(f"{where}.precision", f"{rule.name} cannot calibrate model '{model}': it needs custom "
                                             f"ops ({', '.join(c.name for c in ops)}), and ONNX Runtime's "
                       "calibrator opens its own sessions, which cannot register them",
                       f"use {precisions.INT8_DYNAMIC} (with quantization.preprocess = false), {precisions.FP16} or "
                       f"{precisions.INT4_WEIGHT}")
    if ops and rule.quantized and eff["quantization"].get("preprocess", True):
        raise chk.fail(f"{where}.quantization.preprocess", f"model '{model}' needs custom ops "
                                                           f"({', '.join(c.name for c in ops)}), and "
                       "quant_pre_process optimizes it in a session that cannot register them",
                       "set quantization = { preprocess = false } for this target or model")


def check_fusion(chk: Checker, where: str, model: Model, fusion: dict[str, Any], compiling: list[str]) -> None:
    """[targets.X.fusion] (after overrides): the sizes the model type needs, and providers that can run the result."""
    kind = fusion.get("model_type", options.FUSION_OFF)
    if kind == options.FUSION_OFF:
        return
    heads, hidden = fusion.get("num_heads", 0), fusion.get("hidden_size", 0)
    example = f'fusion = {{ model_type = "{kind}", num_heads = 12, hidden_size = 768 }}'
    if bool(heads) != bool(hidden):
        raise chk.fail(where, f"gives {'num_heads' if heads else 'hidden_size'} alone (model '{model.name}')",
                       f"give both num_heads and hidden_size (the model's), or neither (0: inferred), e.g. {example}")
    if not heads and kind not in options.FUSION_INFERS_SIZES:
        raise chk.fail(f"{where}.model_type", f"'{kind}' needs num_heads and hidden_size (model '{model.name}'): "
                                              "ONNX Runtime's optimizer infers them for "
                       f"{', '.join(sorted(options.FUSION_INFERS_SIZES))} only",
                       f"give the model's attention heads and hidden size, e.g. {example}")
    if heads and hidden % heads:
        raise chk.fail(f"{where}.hidden_size", f"{hidden} is not a multiple of num_heads = {heads}",
                       "give the model's hidden size and its number of attention heads")
    if compiling:
        raise chk.fail(f"{where}.model_type", f"fusion '{kind}' cannot be used with {compiling[0]} (model "
                                              f"'{model.name}'): the fused graph holds com.microsoft ops (Attention, "
                       "SkipLayerNormalization, ...) that ONNX Runtime's CPU, CUDA and ROCm providers run, while a "
                       "compiling provider gets the portable basic-level graph and fuses it itself",
                       'set fusion = { model_type = "off" } for this target (or this model, in an '
                       "[[overrides]] entry); fusion is for CPU and CUDA targets")


def check_custom_op_versions(chk: Checker, where: str, ops: tuple[CustomOps, ...]) -> None:
    """One virtualenv per target: one version of each custom-op package across its models."""
    seen: dict[str, str] = {}
    for c in ops:
        if c.package and seen.setdefault(c.package, c.version) != c.version:
            raise chk.fail(f"{where}.custom_ops", f"the models of this target need {c.package} "
                                                  f"{seen[c.package]} and {c.version}: one virtualenv holds one",
                           "pin the same version in every model's custom_ops, or build them in two targets")



def check_relative_budgets(chk: Checker, name: str, target: Target, targets: Mapping[str, Target]) -> None:
    for m, s in target.settings.items():
        assert s.gates is not None
        lat = s.gates.latency
        where = f"targets.{name}.latency"
        if not 0.5 <= lat.confidence < 1:
            raise chk.fail(f"{where}.confidence", f"must be in [0.5, 1), got {lat.confidence}")
        check_scenarios(chk, where, lat)
        ft = lat.faster_than
        if ft is None:
            continue
        if ft.target == name:
            raise chk.fail(f"{where}.faster_than.target", "names this target itself",
                           "compare with another target, e.g. the fp32 one")
        if ft.target not in targets:
            raise chk.fail(f"{where}.faster_than.target",
                           f"unknown target '{ft.target}'{did_you_mean(ft.target, list(targets))}")
        if m not in targets[ft.target].models:
            raise chk.fail(f"{where}.faster_than.target", f"target '{ft.target}' does not build model '{m}'",
                           f"limit the budget to shared models with [[targets.{name}.overrides]]")
        if ft.ratio <= 0:
            raise chk.fail(f"{where}.faster_than.ratio", "must be above 0")
        if targets[ft.target].platform_rule is not target.platform_rule:
            raise chk.fail(f"{where}.faster_than.target",
                           f"target '{ft.target}' is for platform {targets[ft.target].platform}, this one for "
                           f"{target.platform}: a ratio between two platforms' artifacts, timed on one machine, "
                           "means nothing", "compare with a target of the same platform")


def check_scenarios(chk: Checker, where: str, lat: Latency) -> None:
    """The load scenarios' required keys, in the target's tables and in each data set's (its own over the
    target's): a data set that declares a scenario the target does not must complete it."""
    for data_set in (None, *lat.data_sets):
        at = where if data_set is None else f"{where}.data_sets.{data_set}"
        srv, ms, off = (lat.scenario("server", data_set), lat.scenario("multi_stream", data_set),
                        lat.scenario("offline", data_set))
        for key, unset in (("server.qps", srv is not None and srv.qps <= 0),
                           ("multi_stream.streams", ms is not None and ms.streams < 1),
                           ("offline.batch", off is not None and off.batch < 1),
                           ("offline.window_seconds", off is not None and off.window_seconds <= 0)):
            if unset:
                hint = "see docs/testing.md, Load scenarios"
                if data_set is not None:
                    hint = f"set it there or in [{where}.{key.split('.')[0]}]; {hint}"
                raise chk.fail(f"{at}.{key}", "must be set, above 0", hint)
