"""The closed vocabularies of a target: precisions, optimization levels, artifact formats and platforms.

Each precision, level, format and platform is a rule object that carries everything ortbuild does differently for
it (options table, defaults, calibration, the explain search's knob, the precision step's converter; a format's
file name and what it can hold; a platform's machine, runner labels and emulator); code is handed the rule
(`Settings.rule`, `format_rule`, `platform_rule`), never a name to compare. Stdlib-only: the noxfile imports it
(through ortbuild.project.config) before any venv exists.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

Precision = Literal["fp32", "fp16", "int8-dynamic", "int8-static", "int4-weight"]
Level = Literal["disable", "basic", "extended", "layout", "all"]
Format = Literal["onnx", "ort"]
Platform = Literal["native", "linux-x86_64", "linux-aarch64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4-vnni"]
OptionsTable = Literal["quantization", "fp16", "int4"]  # the target sub-tables holding a precision's options


class Quantizer(enum.Enum):
    """Which converter of the precision step (ortbuild.pipeline.steps.precision) a precision runs."""

    NONE = "none"                    # the source as it is
    FP16 = "fp16"                    # ORT's float16 converter
    INT8 = "int8"                    # quantize_dynamic, or quantize_static where the rule needs calibration
    INT4 = "int4"                    # MatMulNBitsQuantizer (block-wise, weight-only)


@dataclass(frozen=True, kw_only=True)
class SearchKnob:
    """Where a precision keeps nodes in float (`ortbuild test --explain`): its options table and keys."""

    table: OptionsTable
    nodes: str                       # node names kept in float
    op_types: str | None             # op types kept in float (None: op types are written as their nodes)


@dataclass(frozen=True, kw_only=True)
class PrecisionRule:
    """What a precision is: the table holding its options, what it needs, how it is judged and converted."""

    name: Precision
    options_table: OptionsTable | None  # the target sub-table read by this precision (None: no options)
    quantizer: Quantizer             # the precision step's converter
    quantized: bool = False          # the quantizers' int8 path (pre-processing, opset >= 13)
    needs_calibration: bool = False  # needs the model's `calibration` data
    # the golden test's default rule (under [targets.X.accuracy]), by key; fp32 is elementwise, the reduced
    # precisions are judged by task metrics (cosine similarity, top-1 agreement), not elementwise
    accuracy: Mapping[str, float] = field(default_factory=lambda: _accuracy(cosine=0.99), hash=False)
    max_size_ratio: float = 1.0      # the size gate's default: a reduced precision never outgrows its source
    knob: SearchKnob | None = None   # what the explain search keeps in float (None: nothing to search)

    @property
    def rule_family(self) -> tuple[object, ...]:
        """Precisions whose accuracy rules carry over to each other share it: the same options table and default
        rule (int8-dynamic and int8-static); fp32, fp16, int8 and int4 each stand alone."""
        return (self.options_table, self.accuracy)


def _accuracy(**keys: float) -> Mapping[str, float]:
    """A precision's default accuracy rule: [targets.X.accuracy] keys and their values (read-only)."""
    return MappingProxyType(keys)


FP32_ACCURACY = _accuracy(rtol=1e-4, atol=1e-5)
_INT8_KNOB = SearchKnob(table="quantization", nodes="exclude_nodes", op_types=None)

RULES: tuple[PrecisionRule, ...] = (
    PrecisionRule(name="fp32", options_table=None, quantizer=Quantizer.NONE, accuracy=FP32_ACCURACY,
                  max_size_ratio=1.1),
    PrecisionRule(name="fp16", options_table="fp16", quantizer=Quantizer.FP16, accuracy=_accuracy(cosine=0.999),
                  knob=SearchKnob(table="fp16", nodes="node_block_list", op_types="op_block_list")),
    PrecisionRule(name="int8-dynamic", options_table="quantization", quantizer=Quantizer.INT8, quantized=True,
                  knob=_INT8_KNOB),
    PrecisionRule(name="int8-static", options_table="quantization", quantizer=Quantizer.INT8, quantized=True,
                  needs_calibration=True, knob=_INT8_KNOB),
    PrecisionRule(name="int4-weight", options_table="int4", quantizer=Quantizer.INT4,
                  knob=SearchKnob(table="int4", nodes="exclude_nodes", op_types=None)),
)
# The one place that knows the precision names; everything else is handed these rules.
PRECISION_RULES: dict[str, PrecisionRule] = {r.name: r for r in RULES}
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
assert tuple(PRECISION_RULES) == PRECISIONS, "Precision and RULES name the same precisions, in one order"
FP32, FP16, INT8_DYNAMIC, INT8_STATIC, INT4_WEIGHT = PRECISIONS


def rule(precision: str | PrecisionRule) -> PrecisionRule:
    """The rule of a precision (a validated name: targets.toml, a manifest), or the rule itself."""
    return precision if isinstance(precision, PrecisionRule) else PRECISION_RULES[precision]


def find(precision: object) -> PrecisionRule | None:
    """The rule of `precision` if it names one (unvalidated input), else None."""
    return PRECISION_RULES.get(precision) if isinstance(precision, str) else None


@dataclass(frozen=True, kw_only=True)
class LevelRule:
    """What an optimization level does to the graph, and what that ties the artifact to."""

    name: Level
    ort_enum: str                    # the onnxruntime.GraphOptimizationLevel member
    portable: bool                   # standard ONNX ops only: any provider can load the result
    nchwc: bool                      # may hold NCHWc ops laid out for the build CPU's SIMD width


# The one place that knows the optimization levels, in increasing order.
LEVEL_RULES: dict[str, LevelRule] = {r.name: r for r in (
    LevelRule(name="disable", ort_enum="ORT_DISABLE_ALL", portable=True, nchwc=False),
    LevelRule(name="basic", ort_enum="ORT_ENABLE_BASIC", portable=True, nchwc=False),
    LevelRule(name="extended", ort_enum="ORT_ENABLE_EXTENDED", portable=False, nchwc=False),
    LevelRule(name="layout", ort_enum="ORT_ENABLE_LAYOUT", portable=False, nchwc=True),
    LevelRule(name="all", ort_enum="ORT_ENABLE_ALL", portable=False, nchwc=True),
)}
LEVELS: tuple[Level, ...] = get_args(Level)
assert tuple(LEVEL_RULES) == LEVELS, "Level and LEVEL_RULES name the same levels, in one order"
PORTABLE_LEVEL: Level = "basic"  # the highest level whose graph any provider loads


def cap_level(level: Level) -> Level:
    """The level, at most the highest portable one (for portable and compiling-provider builds)."""
    return level if LEVEL_RULES[level].portable else PORTABLE_LEVEL


FP16_UPCAST_GROWTH = 1.3  # an fp16 artifact over this many times its fp16 model: its weights are fp32 again


def fp16_upcast_hint(quantizer: Quantizer, level: str, providers: Sequence[str], growth: float | None,
                     where: str = "") -> str | None:
    """The one advice for an fp16 model whose weights the CPU provider's optimization stored as fp32 again (the
    build's note and the size gate's hint; None where that is not what happened). `growth`: the artifact's size
    over the fp16 model's. ORT has no fp16 CPU kernels: it casts fp16 inputs of CPU nodes to fp32, and at level
    `all` its FuseInitializersTransformer folds those casts of weights into fp32 initializers. With onnxruntime
    1.31.1, basic, extended and layout gave the example models one and the same fp16 graph (the CPU provider fuses
    nothing in it), so the advice names the portable level (docs/targets.md, fp16 on the CPU)."""
    if (quantizer is not Quantizer.FP16 or "CPUExecutionProvider" not in providers or level not in LEVEL_RULES
            or LEVEL_RULES[level].portable or growth is None or growth <= FP16_UPCAST_GROWTH):
        return None
    return (f'optimization = "{PORTABLE_LEVEL}"{f" in {where}" if where else ""} keeps fp16 storage: the CPU '
            f"provider has no fp16 kernels, and at level '{level}' ORT upcast the fp16 weights to fp32 initializers")


class Serialization(enum.Enum):
    """How an artifact format stores the graph."""

    PROTOBUF = "protobuf"            # ONNX's own: onnx reads it
    FLATBUFFER = "flatbuffer"        # ORT's format: onnx cannot read it


@dataclass(frozen=True, kw_only=True)
class FormatRule:
    """What an artifact format is: its file, what it can hold and what ships beside it."""

    name: Format
    suffix: str                      # the artifact's file name: model<suffix> (its external data: model.onnx.data)
    serialization: Serialization
    external_data: bool              # can keep weights in a file beside it (the ORT flatbuffer is one file, < 2 GiB)
    compiled_graphs: bool            # can hold graphs for providers that compile ahead of time (OpenVINO, TensorRT)
    operators: bool                  # ships ORT's required_operators.config for a reduced build (the operators step)

    @property
    def file(self) -> str:
        """The artifact's file name."""
        return f"model{self.suffix}"


# The one place that knows the artifact formats.
FORMAT_RULES: dict[str, FormatRule] = {r.name: r for r in (
    FormatRule(name="onnx", suffix=".onnx", serialization=Serialization.PROTOBUF, external_data=True,
               compiled_graphs=True, operators=False),
    FormatRule(name="ort", suffix=".ort", serialization=Serialization.FLATBUFFER, external_data=False,
               compiled_graphs=False, operators=True),
)}
FORMATS: tuple[Format, ...] = get_args(Format)
assert tuple(FORMAT_RULES) == FORMATS, "Format and FORMAT_RULES name the same formats, in one order"


def format_rule(fmt: str | FormatRule) -> FormatRule:
    """The rule of an artifact format (a validated name: targets.toml, a manifest), or the rule itself."""
    return fmt if isinstance(fmt, FormatRule) else FORMAT_RULES[fmt]


def find_format(fmt: object) -> FormatRule | None:
    """The rule of `fmt` if it names one (unvalidated input), else None."""
    return FORMAT_RULES.get(fmt) if isinstance(fmt, str) else None


@dataclass(frozen=True, kw_only=True)
class Emulator:
    """How ortbuild runs a platform's artifacts on another machine (ortbuild.emulation): qemu-user over a Debian
    userland holding the platform's manylinux wheels."""

    qemu: str                        # Debian qemu-user-static's binary
    cpu: str                         # the CPU qemu emulates
    debian_arch: str                 # the userland's Debian architecture
    wheel: str                       # uv's --python-platform
    pip_platform: str                # pip's --platform
    cpu_features: str                # the emulated CPU's /proc/cpuinfo Features line
    cpu_part: str                    # and its CPU part number


@dataclass(frozen=True, kw_only=True)
class PlatformRule:
    """What a platform is: the machine its artifacts run on, the CI runner that has one, and how another machine
    emulates it."""

    name: Platform
    machine: str | None              # platform.machine() there (None: native, whichever machine runs the tests)
    runner: tuple[str, ...] | None   # its default runner labels (None: the `runner` key's default)
    nchwc: bool                      # may take the NCHWc levels (layout, all): built on the machine that runs it
    emulator: Emulator | None = None  # how another machine runs its artifacts (None: ortbuild does not emulate it)
    x86_level: str | None = None     # an x86-64 level (machine.X86_LEVELS): run natively on a CPU of that level,
                                     # under qemu-user's model of it on a newer one (ortbuild.emulation)

    @property
    def native(self) -> bool:
        """Whichever machine runs the tests (`native`), not a named platform."""
        return self.machine is None

    def emulated_on(self, host: str, host_level: str | None = None) -> bool:
        """Whether its artifacts do not run natively on the machine of platform `host` (emulation.host()) and x86-64
        level `host_level` (machine.x86_level()): emulated there, or not run at all (emulation.unavailable)."""
        if self.x86_level is not None:
            return host != "linux-x86_64" or host_level != self.x86_level
        return not self.native and self.name != host


ARM_RUNNER = ("ubuntu-24.04-arm",)   # the default runner labels of a linux-aarch64 target (GitHub's ARM runner)
# Neoverse-N1 (Graviton2, Ampere Altra; the Cortex-A76 of a Raspberry Pi 5 is its sibling): ARMv8.2 with the
# dot-product instructions ORT's int8 GEMMs use and fp16 arithmetic, no SVE.
NEOVERSE_N1 = Emulator(
    qemu="qemu-aarch64-static", cpu="neoverse-n1", debian_arch="arm64", wheel="aarch64-manylinux_2_28",
    pip_platform="manylinux_2_28_aarch64", cpu_part="0xd0c",
    cpu_features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp")

# The one place that knows the platforms: "native" is the machine that runs the tests (ortbuild.emulation
# emulates the others where it can; linux-x86_64 is the build machines': not emulated).
PLATFORM_RULES: dict[str, PlatformRule] = {r.name: r for r in (
    PlatformRule(name="native", machine=None, runner=None, nchwc=True),
    PlatformRule(name="linux-x86_64", machine="x86_64", runner=None, nchwc=False),
    PlatformRule(name="linux-aarch64", machine="aarch64", runner=ARM_RUNNER, nchwc=False, emulator=NEOVERSE_N1),
    # x86-64 levels (ORT's x86 kernels are chosen by CPUID: a result on one level says little about another):
    # each a portable artifact gated natively on a CPU of that level, under qemu-user's model of it on a newer one
    *(PlatformRule(name=n, machine="x86_64", runner=None, nchwc=False, x86_level=n)
      for n in ("x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4-vnni")),
)}
PLATFORMS: tuple[Platform, ...] = get_args(Platform)
assert tuple(PLATFORM_RULES) == PLATFORMS, "Platform and PLATFORM_RULES name the same platforms, in one order"
NATIVE = PLATFORMS[0]               # whichever machine runs the tests


def platform_rule(platform: str | PlatformRule) -> PlatformRule:
    """The rule of a platform (a validated name: targets.toml), or the rule itself."""
    return platform if isinstance(platform, PlatformRule) else PLATFORM_RULES[platform]
