"""The rule objects of ortbuild.project.precisions: formats and platforms carry what code decides for them, rules
are built and read by name, and no module outside precisions.py compares a format or platform name."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ortbuild import emulation
from ortbuild.errors import ConfigError
from ortbuild.project import config, options, precisions
from ortbuild.project.precisions import Serialization
from tests.conftest import REPO


def test_format_rules() -> None:
    onnx, ort = precisions.format_rule("onnx"), precisions.format_rule("ort")
    assert (onnx.file, ort.file) == ("model.onnx", "model.ort")
    assert (onnx.serialization, ort.serialization) == (Serialization.PROTOBUF, Serialization.FLATBUFFER)
    assert onnx.external_data and not ort.external_data  # the flatbuffer is one file under 2 GiB
    assert onnx.compiled_graphs and not ort.compiled_graphs  # no EPContext graphs in a .ort
    assert ort.operators and not onnx.operators  # required_operators.config ships with .ort artifacts only
    assert precisions.format_rule(ort) is ort and precisions.find_format("ort") is ort
    assert precisions.find_format("tflite") is None and precisions.find_format(None) is None
    with pytest.raises(KeyError):
        precisions.format_rule("tflite")  # a validated name only
    assert tuple(precisions.FORMAT_RULES) == precisions.FORMATS == ("onnx", "ort")
    assert options.keys("target")["format"].choices == precisions.FORMATS


def test_platform_rules() -> None:
    native, x86, arm = (precisions.platform_rule(p) for p in ("native", "linux-x86_64", "linux-aarch64"))
    assert native.native and not x86.native and not arm.native
    assert (native.machine, x86.machine, arm.machine) == (None, "x86_64", "aarch64")
    assert (native.nchwc, x86.nchwc, arm.nchwc) == (True, False, False)  # NCHWc only where built is where run
    assert (native.runner, x86.runner, arm.runner) == (None, None, ("ubuntu-24.04-arm",))
    assert native.emulator is None and x86.emulator is None  # ortbuild emulates only aarch64
    assert arm.emulator is not None and arm.emulator.qemu == "qemu-aarch64-static"
    assert arm.emulator.pip_platform == "manylinux_2_28_aarch64" and arm.emulator.debian_arch == "arm64"
    # whether a platform's artifacts run emulated depends on the machine running them
    assert not native.emulated_on("linux-x86_64") and not native.emulated_on("linux-aarch64")
    assert arm.emulated_on("linux-x86_64") and not arm.emulated_on("linux-aarch64")
    assert x86.emulated_on("linux-aarch64") and not x86.emulated_on("linux-x86_64")
    assert emulation.emulated("native") is False and emulation.emulated(emulation.host()) is False
    assert options.PLATFORMS == precisions.PLATFORMS == tuple(precisions.PLATFORM_RULES)
    assert options.keys("target")["platform"].choices == precisions.PLATFORMS
    assert arm.emulator.cpu == "neoverse-n1" and "asimddp" in arm.emulator.cpu_features.split()  # int8 dot products


def test_platform_rules_drive_the_config(make_project: Callable[..., Path]) -> None:
    """Through targets.toml: the NCHWc levels need a platform that takes them, default runner labels come from the
    platform's rule, and a platform without its own labels keeps the key's default."""
    table = """
        [targets.t]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        platform = "PLATFORM"
        optimization = "LEVEL"
    """
    for platform in ("linux-x86_64", "linux-aarch64", "x86-64-v3"):
        for level in ("layout", "all"):
            with pytest.raises(ConfigError) as err:
                config.load(make_project(table.replace("PLATFORM", platform).replace("LEVEL", level)))
            assert err.value.where == "targets.t.optimization" and platform in err.value.message
    got = {}
    for platform in precisions.PLATFORMS:
        level = "all" if precisions.platform_rule(platform).nchwc else "extended"
        t = config.load(make_project(table.replace("PLATFORM", platform).replace("LEVEL", level))).targets["t"]
        got[platform] = t.runner
    levels = ("x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4-vnni")  # the key's default: name a runner of the level
    assert got == {"native": ("ubuntu-latest",), "linux-x86_64": ("ubuntu-latest",),
                   "linux-aarch64": ("ubuntu-24.04-arm",), **{lv: ("ubuntu-latest",) for lv in levels}}


def test_format_rules_drive_the_config(make_project: Callable[..., Path]) -> None:
    table = """
        [targets.t]
        runtime = "RUNTIME"
        providers = ["CPUExecutionProvider"]
        format = "FORMAT"
        external_data = true
    """
    assert config.load(make_project(table.replace("FORMAT", "onnx"))).targets["t"].settings["tiny_cnn"].external_data
    with pytest.raises(ConfigError) as err:
        config.load(make_project(table.replace("FORMAT", "ort")))
    assert err.value.where == "targets.t.external_data"
    assert err.value.message.endswith("] format 'ort' cannot hold external data")


def test_rules_are_built_and_read_by_name() -> None:
    for cls in (precisions.PrecisionRule, precisions.LevelRule, precisions.SearchKnob, precisions.FormatRule,
                precisions.PlatformRule, precisions.Emulator):
        assert all(f.kw_only for f in dataclasses.fields(cls)), f"{cls.__name__} is built by keyword"
    with pytest.raises(TypeError):
        precisions.LevelRule("basic", "ORT_ENABLE_BASIC", True, False)  # type: ignore[call-arg]
    fp32 = precisions.rule(precisions.FP32)
    assert dict(fp32.accuracy) == {"rtol": 1e-4, "atol": 1e-5} and fp32.accuracy["atol"] == 1e-5
    with pytest.raises(TypeError):
        fp32.accuracy["atol"] = 1.0  # type: ignore[index]  # a rule's default is read-only
    assert {r.name: dict(r.accuracy) for r in precisions.RULES}["fp16"] == {"cosine": 0.999}
    assert len({r.name: r for r in precisions.RULES}) == len(precisions.RULES)  # rules stay hashable
    assert precisions.rule("int8-dynamic").rule_family == precisions.rule("int8-static").rule_family
    assert precisions.rule("int8-dynamic").rule_family != precisions.rule("int4-weight").rule_family


# the names compared nowhere but in precisions.py: the formats and the platforms
NAMES: frozenset[str] = frozenset(precisions.FORMATS) | frozenset(precisions.PLATFORMS)
# comparisons allowed for now (none): a test fails once one of them is gone, so the list cannot go stale
PENDING: set[tuple[str, str]] = set()


def _strings(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _strings(e)


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of each comparison (==, !=, in, is; a match case) of a format or platform name in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        found += [(node.lineno, s) for e in operands for s in _strings(e) if s in NAMES]
    return found


def test_the_scan_finds_comparisons() -> None:
    assert name_comparisons('if s.format == "ort" or p in ("native", h) or "onnx" != f:\n    pass\n') == \
        [(1, "ort"), (1, "native"), (1, "onnx")]
    assert name_comparisons('match p:\n    case "linux-aarch64":\n        pass\n') == [(2, "linux-aarch64")]
    assert name_comparisons('x = {"format": "ort"}\nif kind == "ortx":\n    pass\n') == []


def test_no_format_or_platform_name_compared_outside_precisions() -> None:
    found = {(str(f.relative_to(REPO)), line, name) for f in sorted((REPO / "ortbuild").rglob("*.py"))
             if f.name != "precisions.py" or f.parent.name != "project"
             for line, name in name_comparisons(f.read_text())}
    pending = {(f, name) for f, _, name in found} & PENDING
    assert pending == PENDING, f"{PENDING - pending} compares no more: drop it from PENDING"
    left = sorted(x for x in found if (x[0], x[2]) not in PENDING)
    assert not left, ("formats and platforms are rule objects (precisions.format_rule, platform_rule): ask the rule "
                      "instead of comparing the name:\n  " + "\n  ".join(f"{f}:{n}: {name!r}" for f, n, name in left))
