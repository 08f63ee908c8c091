"""What `ortbuild init` measured of int8 against fp32 on this CPU before it gives a model a cpu-int8 target
(docs/project.md), and the rule it decides by: int8 is kept where the median of the paired ratios int8/fp32 is
below MAX_RATIO. The measurement itself (onnxruntime, the build's precision step, the latency gate's paired
sampling) is ortbuild.gating.measure.int8speed's; without onnxruntime where init runs, nothing is measured and
init says so in what it writes. Stdlib + packaging only (ortbuild.machine)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass

from ortbuild import machine

SECONDS = 1.5       # of paired runs per model
QUANTIZING = 1.5    # about what quantizing a small model takes (what init's announcement adds per model)
MIN_PAIRS = 9       # fewer cannot bound a median at CONFIDENCE
MAX_PAIRS = 2000
MAX_SECONDS = 10.0  # where MIN_PAIRS pairs would take longer, the model is not measured (init says so)
CONFIDENCE = 0.9    # of the interval printed beside the median
# int8 is kept where its runs take less than this share of fp32's (the median of the paired ratios): a ratio near
# 1.00 is no benefit worth int8's accuracy loss, and within what a busy machine moves a short measurement by
MAX_RATIO = 0.95


@dataclass(frozen=True)
class Measured:
    """int8 against fp32 on one model: the median of the paired ratios int8/fp32 and its interval."""

    ratio: float
    low: float | None                # the median's bounds at `confidence` (None: too few pairs)
    high: float | None
    pairs: int
    int8_ms: float                   # each one's median time
    fp32_ms: float
    confidence: float = CONFIDENCE

    @property
    def faster(self) -> bool:
        """Judged on the ratio as said (two decimals): a median of 0.9496 prints as 0.95, so it is not below 0.95."""
        return round(self.ratio, 2) < MAX_RATIO

    def said(self) -> str:
        """'int8 takes 0.62x fp32's time (median of 120 paired runs, ...)'"""
        bounds = "" if self.low is None or self.high is None else \
            f", {self.confidence:.0%} interval [{self.low:.2f}, {self.high:.2f}]"
        return (f"int8 takes {self.ratio:.2f}x fp32's time (median of {self.pairs} paired runs{bounds}; p50 "
                f"{self.int8_ms:.3g} ms vs {self.fp32_ms:.3g} ms)")


@dataclass(frozen=True)
class Unmeasured:
    """Why a model's int8 speed was not measured."""

    reason: str


def available() -> bool:
    """Whether onnxruntime can be imported here (what the measurement and init's expected outputs need)."""
    return importlib.util.find_spec("onnxruntime") is not None


def level() -> str:
    """This machine's x86-64 level's name (machine.x86_level), or its architecture elsewhere."""
    found = machine.x86_level()
    return found.name if found is not None else machine.simd_level()


def host() -> str:
    """This machine's CPU in words: 'an x86-64-v4-vnni CPU (AMD EPYC 7B13)'."""
    arch = level()
    return f"{'an' if arch[:1].lower() in 'aeiox' else 'a'} {arch} CPU ({machine.cpu_model()})"


@dataclass(frozen=True)
class Choice:
    """cpu-int8's models once measured, and what targets.toml (comment lines) and the terminal (notes) say of it."""

    kept: tuple[str, ...]
    comments: tuple[str, ...]
    notes: tuple[str, ...]


def _verdict(found: Measured, asked: bool) -> str:
    if found.faster:
        return ""
    slower = "slower than fp32 here" if found.ratio >= 1 else f"not {1 - MAX_RATIO:.0%} faster than fp32 here"
    return f": {slower}, " + ("kept: asked for" if asked else "left out")


def choose(found: Mapping[str, Measured | Unmeasured], asked: bool) -> Choice:
    """cpu-int8's models (`found`: each one's measurement, in order) by the rule (Measured.faster); `asked`: the
    target was asked for (--target), so it keeps every model and says which are slow."""
    where = level()
    comments = [f"# int8 against fp32 on this CPU ({where}), timed by `ortbuild init` in paired runs: int8 is kept",
                f"# where the median of int8/fp32 is below {MAX_RATIO}"]
    comments += [f"#   {name}: " + (f"not measured: {r.reason}" if isinstance(r, Unmeasured) else
                                     f"{r.said()}{_verdict(r, asked)}") for name, r in found.items()]
    slow = {n: r for n, r in found.items() if isinstance(r, Measured) and not r.faster}
    kept = tuple(n for n in found if asked or n not in slow)
    what = "; ".join(f"{n}: {r.said()}" for n, r in slow.items())
    notes = [f"cpu-int8 keeps {n}: {r.said()}" for n, r in found.items() if isinstance(r, Measured) and r.faster]
    notes += [f"cpu-int8: {n}'s int8 not timed against fp32: {r.reason}" for n, r in found.items()
              if isinstance(r, Unmeasured)]
    if slow and asked:
        notes.append(f"warning: cpu-int8 (asked for) is no faster than fp32 on this CPU ({where}) for {what}")
    elif slow:
        notes.append(f"cpu-int8 leaves out {', '.join(slow)}: int8 is no faster than fp32 on this CPU ({where}): "
                     f"{what}" if kept else f"no cpu-int8 target: int8 is no faster than fp32 on this CPU ({where}) "
                     f"for {what}")
    return Choice(kept, tuple(comments), tuple(notes))
