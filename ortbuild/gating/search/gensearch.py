"""Build to the gates for a generative model (`precision_search = "auto"` on an int4-weight or int8-dynamic target):
when its tokens gate fails, the builder's precision knobs are tried in order, each a rebuild through targets.lock
judged by the tokens gate, and the first setting that passes is kept in targets.lock (what later builds apply):

  int4-weight:   accuracy_level 0 (the MatMuls computed in fp32, where levels 2-4 compute in fp16/bf16/int8)
                 -> block_size 32, then 16 (those smaller than the target's)
                 -> asymmetric blocks (symmetric = false: a zero point per block), where the builder can make
                    them (not with tied int4 embeddings: ASYMMETRIC_TIED)
                 -> lm_head kept in float (nodes_to_exclude)
                 -> whole layers kept in float: the first and the last, then the outermost 4 (the 2 next
                    inwards added), 8, ... up to every layer
  int8-dynamic:  lm_head kept in float -> whole layers, as above
The knobs are cumulative (a smaller block keeps accuracy_level 0). ORT issue 29849 is the case it repairs: the
builder's CPU int4 default (accuracy_level 4) flipping greedy tokens. The rebuild budget is the search's
(`--explain-rebuilds`, `--explain-seconds`); when none passes, the build fails with every setting tried and its
tokens verdict, so nothing that fails its gate ships.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from ortbuild.artifact import manifest
from ortbuild.errors import GateFailed, OrtbuildError, OutputsBroken, first_line
from ortbuild.gating.record import TestResult
from ortbuild.gating.search.base import Found, JobSearch
from ortbuild.paths import inside
from ortbuild.pipeline.job import JobResult
from ortbuild.project import generation
from ortbuild.project.plan import Job
from ortbuild.project.sections import Int4, Quantization
from ortbuild.status import JobFinished, JobStatus, PhaseStarted, Verdict

LM_HEAD = "/lm_head/MatMul"
MIN_BLOCK = 16


def layers_of(matmuls: list[str]) -> list[list[str]]:
    """The MatMul names of each decoder layer (`/model/layers.N/...`), in layer order."""
    by: dict[int, list[str]] = {}
    for name in matmuls:
        if (m := re.match(r"/model/layers\.(\d+)/", name)) is not None:
            by.setdefault(int(m.group(1)), []).append(name)
    return [by[i] for i in sorted(by)]


def outside_in(n: int) -> list[int]:
    """0, n-1, 1, n-2, ...: the layers quantization hurts most first."""
    out: list[int] = []
    lo, hi = 0, n - 1
    while lo <= hi:
        out += [lo] if lo == hi else [lo, hi]
        lo, hi = lo + 1, hi - 1
    return out


def tied_embeddings(model_dir: Path) -> bool:
    """Whether the source's config.json says it ties the input embeddings to lm_head (save_pretrained() writes the
    key; where it is absent an asymmetric build is tried, and fails as a candidate if it cannot load)."""
    try:
        doc = json.loads((model_dir / generation.HF_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("tie_word_embeddings") is True


# onnxruntime-genai 0.18's builder gathers tied int4 embeddings from the quantized lm_head; with a zero point per
# block (is_symmetric=false) that graph does not load ("Type (tensor(uint8)) of output arg
# (/model/embed_tokens/Reshape/output_0) ... does not match expected type (tensor(float))"), checked on a tied Qwen2
ASYMMETRIC_TIED = ("not tried: the builder's tied int4 embeddings (tie_word_embeddings, lm_head quantized) take "
                   "symmetric blocks only: onnxruntime-genai 0.18 makes a graph ONNX Runtime cannot load")


def candidates(job: Job, matmuls: list[str]) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(what changes, the options table, its keys) of each setting to try, cumulative, in order; a setting the
    builder cannot make has no keys (its `what` says why). Every kind of knob comes within a few rebuilds (blocks:
    32, then 16; layers: the outermost 2, 4, 8, ... up to all), so a bounded budget reaches each of them."""
    opts = job.settings.typed_precision_options()
    if isinstance(opts, Int4):
        table, keys = "int4", {"block_size": opts.block_size, "accuracy_level": opts.accuracy_level,
                               "exclude_nodes": list(opts.exclude_nodes)}
        if opts.accuracy_level not in (0, 1):
            keys = {**keys, "accuracy_level": 0}
            yield "accuracy_level 0", table, keys
        for block in (32, MIN_BLOCK):
            if opts.block_size > block:
                keys = {**keys, "block_size": block}
                yield f"block_size {block}", table, keys
        if opts.symmetric:  # a zero point per block: a block's range fitted, not mirrored around zero
            if tied_embeddings(job.model.path) and LM_HEAD not in opts.exclude_nodes:
                yield f"asymmetric blocks: {ASYMMETRIC_TIED}", table, {}
            else:
                keys = {**keys, "symmetric": False}
                yield "asymmetric blocks", table, keys
    elif isinstance(opts, Quantization):
        table, keys = "quantization", {"exclude_nodes": list(opts.exclude_nodes)}
    else:
        return
    kept = list(keys["exclude_nodes"])  # type: ignore[call-overload]
    if LM_HEAD in matmuls and LM_HEAD not in kept:
        kept.append(LM_HEAD)
        yield "lm_head kept in float", table, {**keys, "exclude_nodes": list(kept)}
    layers = layers_of(matmuls)
    order = outside_in(len(layers))
    count = 2
    while order:
        count = min(count, len(order))
        chosen = sorted(order[:count])
        kept += [n for i in chosen for n in layers[i] if n not in kept]
        kind = "layer" if len(chosen) == 1 else "layers"
        yield f"{kind} {', '.join(map(str, chosen))} kept in float", table, {**keys, "exclude_nodes": list(kept)}
        order, count = order[count:], count * 2


class GenerativeSearch(JobSearch):
    """Build to the gates for a generative model: its tokens gate judges the build; a failing one (or NaN logits at
    reload) gets the builder's knobs, in order, each a rebuild through targets.lock (base.Locking)."""

    def search(self, job: Job, given: JobResult) -> Found[JobResult]:
        """The job's final result: as built where its tokens pass (or cannot be judged here, or its build failed
        otherwise), else as repaired, or failed with every setting tried."""
        from ortbuild.gating.gates import tokens as token_gate

        clock = self.budget.start()
        if given.status == JobStatus.FAILED and isinstance(given.error, OutputsBroken):  # NaN logits at reload
            return self.repair(job, given, f"broken outputs ({given.error.message})")
        if given.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
            return clock.found(given, found=False, cut_short=False)
        self.progress(job.name, PhaseStarted("precision_search = \"auto\": the tokens gate of the build"))
        res = TestResult(job.target.name, job.model.name, job.settings.precision)
        try:
            verdict, summary = token_gate.summarized(self.tester.judge_alone(token_gate.GATE, job, res))
        except OrtbuildError as e:
            given.notes.append(f"precision_search: the tokens gate could not run here, nothing searched: "
                               f"{first_line(e)}")
            return clock.found(given, found=False, cut_short=False)
        if verdict == Verdict.PASS:
            self.locking.passes(job, given, summary)
            return clock.found(given, found=True, cut_short=False)
        return self.repair(job, given, f"tokens gate {verdict} ({summary})")

    def repair(self, job: Job, failed: JobResult, why: str) -> Found[JobResult]:
        """Try the candidates until one passes the tokens gate (kept in targets.lock) or the budget ends (the job
        fails, naming every setting tried)."""
        from ortbuild.gating.gates import tokens as token_gate

        clock = self.budget.start()
        try:  # the graph's MatMuls, from the manifest of the build that failed its gate
            m, _ = manifest.read(inside(self.locking.builder.dist, job.target.name, job.model.name))
            matmuls = list(m.generative.matmuls) if m.generative else []  # its manifest section
        except OrtbuildError:  # its build failed (NaN logits at reload): no manifest of it, no layers to keep
            matmuls = []
        tried: list[str] = []
        cut_short = False
        self.progress(job.name, PhaseStarted(f"precision_search: {why}; trying the builder's precision knobs"))
        for what, table, keys in candidates(job, matmuls):
            if not keys:  # a setting the builder cannot make: said, not built
                tried.append(what)
                continue
            if clock.exhausted():
                n = clock.rebuilds
                tried.append(f"(stopped: {n} rebuilds, {clock.spent():.0f} s: --explain-rebuilds/-seconds)"
                             if n else "(stopped before trying a setting: --explain-rebuilds 0)")
                cut_short = True
                break
            entry = self.locking.entry(job).merged({table: keys}, search={"kept": what, "failed_with": why})
            self.progress(job.name, f"precision_search: {what}: rebuilding")
            locked, result = self.locking.rebuild(job, entry)
            clock.rebuilt()
            if result.status not in (JobStatus.BUILT, JobStatus.UP_TO_DATE, JobStatus.PULLED):
                tried.append(f"{what}: build {result.status}: {result.reason}")
                continue
            res = TestResult(job.target.name, job.model.name, job.settings.precision)
            try:
                verdict, summary = token_gate.summarized(self.tester.judge_alone(token_gate.GATE, locked, res))
            except OrtbuildError as e:
                verdict, summary = Verdict.FAIL, first_line(e)
            tried.append(f"{what}: tokens {verdict} ({summary})")
            if verdict == Verdict.PASS:
                entry = entry.merged({}, search={**entry.search, "rebuilds": clock.rebuilds, "tokens": summary,
                                                 "seconds": round(clock.spent(), 1)})
                self.locking.keep(locked, result, entry, f"precision_search: {what}: tokens PASS ({summary})")
                return clock.found(result, found=True, cut_short=False)
        out = JobResult(failed.target, failed.model, JobStatus.FAILED, precision=failed.precision,
                        notes=list(failed.notes))
        out.error = GateFailed(
            f"{job.name}: precision_search = \"auto\" found no builder setting whose tokens pass ({why}):\n"
            + "\n".join(f"  {t}" for t in tried or ["(no knob to try)"]),
            f"raise --explain-rebuilds/--explain-seconds, loosen [targets.{job.target.name}.tokens], or pick int8 / "
            "fp32 for this target (same as the ONNX models' search: exit 9)")
        out.reason = out.error.message.split("\n", 1)[0]
        self.progress(job.name, JobFinished(JobStatus.FAILED, f"FAILED: {out.reason}"))
        return clock.found(out, found=False, cut_short=cut_short)
