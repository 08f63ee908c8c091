"""Peak memory of a generative model with its KV cache at the longest context, in fresh child processes.

A child (a fresh `sys.executable -B`, in a private temporary directory, so that nothing of the parent's memory
counts) reads one JSON document on its stdin (the key travels there, never in argv or the environment), imports
onnxruntime_genai and the caller's opener (`Opener`: a .py file's path or a module's name, the function in it,
its keyword arguments, `key=` where a secret is given, and the attribute of what it returns that is the
og.Model), opens the model, reads its RSS (VmRSS) right after opening, runs ONE greedy generation whose prompt
and new tokens fill the context (max_length = min_length = the context length: it cannot stop early at EOS),
and reads the RSS high-water mark (VmHWM of /proc/self/status: a spawned child's ru_maxrss can start at its
parent's; where /proc is absent, ru_maxrss of RUSAGE_SELF).

What onnxruntime-genai allocates for the KV cache (0.18.0, checked on the example model): with
`search.past_present_share_buffer = true` (the builder's default for CPU and CUDA decoders) the Generator
allocates, when it is created, one key and one value buffer per layer of [batch x beams, kv_heads, max_length,
head_size] in the model's KV type, for `max_length` (not for the tokens produced), and updates them in place;
without it the past/present tensors grow with each step. So the peak is reached with max_length at the context
length and the prompt's prefill (its attention activations grow with the prompt) filling it. The child reports
the KV cache's size from the present buffer of layer 0 (`kv_cache_bytes` = its bytes x 2 x layers, read after
the peak), and the RSS after opening, so the generation's share (peak - opened) is visible.

The verdict on `max_memory_mb` is the memory gate's (ortbuild.gating.measure.startup.judge): the median peak over
fresh processes, with the distribution-free sequential test at the stated confidence (the first look at
startup.FIRST_LOOK processes, then doubling, within max_seconds). Without a budget nothing is measured (the gate
does not call it).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ortbuild.gating.measure import startup
from ortbuild.gating.measure.percentiles import PercentileVerdict, nearest_rank
from ortbuild.status import Verdict

MIB = 1 << 20
PROCESS_TIMEOUT_S = 600
FIRST_PROCESSES = startup.FIRST_LOOK  # fresh processes before the memory verdict's first look

CHILD = r"""
import sys, json, time
doc = json.loads(sys.stdin.read())
t0 = time.perf_counter()
import importlib, importlib.util, numpy
og = importlib.import_module("onnxruntime_genai")
src = doc["source"]
if src.endswith(".py"):
    spec = importlib.util.spec_from_file_location("_ortbuild_generation_opener", src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
else:
    mod = importlib.import_module(src)
t1 = time.perf_counter()
kwargs = dict(doc["kwargs"])
if doc["key"] is not None:
    kwargs["key"] = doc["key"]
opened = getattr(mod, doc["function"])(**kwargs)
model = getattr(opened, doc["attribute"]) if doc["attribute"] else opened
t2 = time.perf_counter()
def status(name):
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(name))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
opened_rss = status("VmRSS:")
prompt = numpy.asarray(doc["prompt"], dtype=numpy.int32)
total = len(prompt) + doc["new_tokens"]
params = og.GeneratorParams(model)
params.set_search_options(max_length=total, min_length=total, do_sample=False)
gen = og.Generator(model, params)
gen.append_tokens(prompt)
while not gen.is_done():
    gen.generate_next_token()
t3 = time.perf_counter()
peak = status("VmHWM:")
if peak is None:
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    except ImportError:
        pass
kv = None
try:
    kv = int(gen.get_output(doc["present_key"]).nbytes) * 2 * doc["layers"]
except Exception:
    pass
ms = lambda a, b: (b - a) * 1e3
print(json.dumps({"import_ms": ms(t0, t1), "open_ms": ms(t1, t2), "generate_ms": ms(t2, t3),
                  "opened_rss_bytes": opened_rss, "peak_rss_bytes": peak, "kv_cache_bytes": kv,
                  "tokens": int(gen.token_count())}))
"""


@dataclass(frozen=True)
class Opener:
    """How a child process opens the model: `source` is a .py file's path (the generated loader) or an importable
    module's name; `function` in it is called with `kwargs` (JSON values) and, where `secret` is given,
    key=<the secret, base64> (read from the child's stdin); `attribute` names the og.Model on what it returns
    ("": it returns the og.Model). E.g. Opener(str(loader_py), "load", {"folder": str(folder)}, secret, "model")."""

    source: str
    function: str
    kwargs: Mapping[str, object] = field(default_factory=dict)
    secret: bytes | None = None
    attribute: str = ""


@dataclass(frozen=True)
class MemorySample(startup.Sample):
    """One child's figures (startup.Sample's: cold_start_ms = import + open + the generation, session_ms = the
    opening, first_run_ms = the generation; peak_rss_bytes), and what this measurement adds."""

    opened_rss_bytes: int | None = None
    kv_cache_bytes: int | None = None
    tokens: int = 0


class GenerationMemoryError(startup.StartupError):
    """A child process could not open the model or generate."""


def measure_once(opener: Opener, prompt: Sequence[int], new_tokens: int, present_key: str, layers: int,
                 workdir: Path) -> MemorySample:
    """One fresh child: open, fill the context (len(prompt) + new_tokens), read the memory."""
    doc = {"source": opener.source, "function": opener.function, "kwargs": dict(opener.kwargs),
           "attribute": opener.attribute, "key": base64.b64encode(opener.secret).decode() if opener.secret else None,
           "prompt": list(prompt), "new_tokens": new_tokens, "present_key": present_key, "layers": layers}
    try:
        proc = subprocess.run([sys.executable, "-B", "-c", CHILD], input=json.dumps(doc), capture_output=True,
                              text=True, cwd=workdir, timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GenerationMemoryError(f"a fresh process did not open the model and generate within "
                                    f"{PROCESS_TIMEOUT_S} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
        raise GenerationMemoryError(f"a fresh process failed to open the model and generate "
                                    f"(exit {proc.returncode}): {tail}")
    d = json.loads(lines[-1])
    if d["tokens"] != len(prompt) + new_tokens:
        raise GenerationMemoryError(f"the generation stopped at {d['tokens']} tokens, not the "
                                    f"{len(prompt) + new_tokens} asked for")
    opened = None if d["opened_rss_bytes"] is None else int(d["opened_rss_bytes"])
    return MemorySample(d["import_ms"] + d["open_ms"] + d["generate_ms"], d["import_ms"], d["open_ms"],
                        d["generate_ms"], None if d["peak_rss_bytes"] is None else int(d["peak_rss_bytes"]),
                        opened, None if d["kv_cache_bytes"] is None else int(d["kv_cache_bytes"]), d["tokens"])


@dataclass
class MemoryOutcome:
    samples: list[MemorySample]
    verdict: PercentileVerdict | None   # None: no budget (or an error)
    looks: int = 0
    stopped: str = ""
    error: str = ""


def measure(opener: Opener, prompt: Sequence[int], new_tokens: int, present_key: str, layers: int,
            budget_mb: float | None, confidence: float, max_seconds: float = startup.MAX_SECONDS) -> MemoryOutcome:
    """With a budget, the memory gate's sequential plan over fresh children; without, one child. A child that
    fails makes the verdict FAIL (MemoryOutcome.error says why)."""
    taken: list[MemorySample] = []
    with tempfile.TemporaryDirectory(prefix="ortbuild-generation-") as tmp:

        def one() -> MemorySample:
            s = measure_once(opener, prompt, new_tokens, present_key, layers, Path(tmp))
            if s.peak_rss_bytes is None and budget_mb is not None:
                raise GenerationMemoryError("this platform does not say a process's peak memory (no /proc, no "
                                            "resource module): max_memory_mb cannot be checked here")
            taken.append(s)
            return s

        try:
            if budget_mb is None:
                one()
                return MemoryOutcome(taken, None)
            out = startup.judge(one, {"memory": budget_mb}, confidence, max_seconds=max_seconds)
        except startup.StartupError as e:
            return MemoryOutcome(taken, None, error=e.message)
    return MemoryOutcome(taken, out.verdicts["memory"], out.looks, out.stopped)


def _mb(xs: list[int | None]) -> dict[str, float] | None:
    ys = sorted(x / MIB for x in xs if x is not None)
    if not ys:
        return None
    return {"p50": round(nearest_rank(ys, 0.5), 2), "min": round(ys[0], 2), "max": round(ys[-1], 2)}


def section(outcome: MemoryOutcome, context_length: int, new_tokens: int, budget_mb: float | None) -> dict[str, object]:
    """The memory part of the generation section: the settings, peak and opened RSS (MB), the KV cache, the verdict."""
    xs = outcome.samples
    out: dict[str, object] = {"context_length": context_length, "prompt_tokens": context_length - new_tokens,
                              "new_tokens": new_tokens, "processes": len(xs), "looks": outcome.looks,
                              "stopped": outcome.stopped, "peak_rss_mb": _mb([s.peak_rss_bytes for s in xs]),
                              "opened_rss_mb": _mb([s.opened_rss_bytes for s in xs]),
                              "kv_cache_mb": _mb([s.kv_cache_bytes for s in xs])}
    if xs and all(s.peak_rss_bytes is not None and s.opened_rss_bytes is not None for s in xs):
        out["generation_mb"] = _mb([(s.peak_rss_bytes or 0) - (s.opened_rss_bytes or 0) for s in xs])
    if outcome.error:
        out["error"] = outcome.error
        out["verdict"] = {"kind": "max_memory_mb", "budget": budget_mb, "verdict": Verdict.FAIL, "note": outcome.error}
    elif outcome.verdict is not None:
        note = outcome.verdict.note.replace("more samples", "more processes")
        out["verdict"] = {"kind": "max_memory_mb", "unit": "MB", **outcome.verdict.as_json(), "note": note}
    return out


def verdict_of(outcome: MemoryOutcome, budget_mb: float | None) -> Verdict | None:
    if budget_mb is None:
        return None
    return Verdict.FAIL if outcome.error or outcome.verdict is None else outcome.verdict.verdict


def failure_lines(name: str, outcome: MemoryOutcome, doc: Mapping[str, object], budget_mb: float | None,
                  where: str) -> list[str]:
    """The failure report's lines when max_memory_mb FAILed (or a child failed)."""
    if budget_mb is None:
        return []
    if outcome.error:
        return [f"generation memory: {name} {outcome.error}",
                "  hint: open the model in a fresh Python process through its loader (docs/loaders.md) to see the "
                "whole error"]
    v = outcome.verdict
    if v is None or v.verdict is not Verdict.FAIL:
        return []
    bound = f" (at least {v.lower:.1f} MB with {v.confidence:.0%} confidence)" if v.lower is not None else ""
    opened, kv = doc.get("opened_rss_mb"), doc.get("kv_cache_mb")
    parts = [f"{opened['p50']:.1f} MB right after opening" if isinstance(opened, dict) else "",
             f"KV cache {kv['p50']:.1f} MB" if isinstance(kv, dict) else ""]
    said = f"; {', '.join(p for p in parts if p)}" if any(parts) else ""
    return [f"generation memory: {name} peak RSS median {v.observed:.1f} MB{bound} over {v.samples} fresh processes at "
            f"context {doc['context_length']} ({doc['prompt_tokens']} prompt + {doc['new_tokens']} new tokens) > "
            f"budget max_memory_mb = {budget_mb:g} MB{said}",
            f"  hint: raise max_memory_mb{' in ' + where if where else ''} if this peak is expected, or state a "
            "shorter context_length (the KV cache is allocated for it)"]
