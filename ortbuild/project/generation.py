"""The keys of generative (decoder language) models: what a Hugging Face-format directory holds (what makes a
`[models.X]` one: ortbuild.project.kinds), which requirements its targets' virtualenvs get, and the budgets
`[targets.X.tokens]` (token-level accuracy) and `[targets.X.generation]` (time to first token, time per output
token, tokens per second, peak memory with the KV cache).
Stdlib-only at import (the noxfile imports it through ortbuild.project.config; stdlib-only modules import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortbuild.project.declare import setting
from ortbuild.project.sections import MS_MAX

# What a generative target's virtualenv holds besides its ONNX Runtime flavor: the model builder and what it
# imports (torch's CPU wheel: pip takes the one kept on disk where there is one; uv does not, see README), and the
# runtime the loaders open the model with. Pinned: the builder's output is part of the build key.
GENAI = "onnxruntime-genai==0.18.0"
BUILDER_REQUIREMENTS = (GENAI, "torch==2.13.0", "transformers==5.24.0", "onnx_ir==1.1.0")
# onnxruntime-genai's package per ONNX Runtime flavor: the CPU package cannot start CUDA (its is_cuda_available()
# is false everywhere); onnxruntime-genai-cuda (same version, same `onnxruntime_genai` module) requires
# onnxruntime-gpu, as the genai docs say for CUDA. A flavor not named here gets the CPU package.
GENAI_BY_FLAVOR = {"onnxruntime-gpu": "onnxruntime-genai-cuda"}


def genai_for(runtime: str) -> str:
    """The onnxruntime-genai requirement for a target whose ONNX Runtime flavor is `runtime` (a pinned
    requirement such as `onnxruntime-gpu==1.31.1`)."""
    from packaging.requirements import Requirement  # here: this module imports the stdlib only
    from packaging.utils import canonicalize_name

    package = GENAI_BY_FLAVOR.get(canonicalize_name(Requirement(runtime).name))
    return GENAI if package is None else package + GENAI[len("onnxruntime-genai"):]


def requirements_for(runtime: str, requirements: tuple[str, ...]) -> tuple[str, ...]:
    """A kind's requirements with the CPU onnxruntime-genai swapped for the flavor's package (genai_for)."""
    return tuple(genai_for(runtime) if r == GENAI else r for r in requirements)
# The files of a Hugging Face-format directory the builder reads (weights: any of WEIGHTS)
HF_CONFIG = "config.json"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER = "tokenizer.json"
# precision -> the builder's `-p`; the others (int8-static: calibrated QDQ) have no builder equivalent
BUILDER_PRECISION = {"fp32": "fp32", "fp16": "fp16", "int8-dynamic": "int8", "int4-weight": "int4"}
# provider -> the builder's `-e`
BUILDER_PROVIDER = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "DmlExecutionProvider": "dml",
                    "WebGpuExecutionProvider": "webgpu", "NvTensorRTRTXExecutionProvider": "NvTensorRtRtx"}


# why `ortbuild profile` and `ortbuild tune` skip a generative model
NOT_PROFILED = ("a generative model: onnxruntime-genai creates its session (its session options come from the "
                "target, docs/generative.md); `ortbuild tune` and `ortbuild profile` do not cover it")


def directory_problem(path: Path) -> str | None:
    """Why `path` is not a Hugging Face-format directory the builder can read (None: it is)."""
    if not path.is_dir():
        return "is not a directory"
    if not (path / HF_CONFIG).is_file():
        return f"has no {HF_CONFIG} (a Hugging Face-format model directory holds config.json, the weights and " \
               "tokenizer.json)"
    if not any((path / w).is_file() for w in WEIGHTS):
        return f"has no weights ({', '.join(WEIGHTS)})"
    if not (path / TOKENIZER).is_file():
        return f"has no {TOKENIZER}"
    return None


@dataclass(frozen=True)
class Tokens:
    """[targets.X.tokens]: the token gate of a generative model, over its precision's defaults (docs/generative.md)."""

    max_tokens: int = setting(
        32, maximum=4096, build="never",
        doc="Tokens generated greedily per golden prompt, by the fp32 source (the reference) and by the artifact.")
    match_tokens: int | None = setting(
        None, maximum=4096, build="never",
        doc="Every prompt's greedy continuation must equal the reference's on its first N tokens. Default per "
            "precision (docs/generative.md).")
    min_agreement: float | None = setting(
        None, maximum=1.0, build="never",
        doc="Least token agreement rate over all prompts (positions before each prompt's first divergence, over "
            "all positions). Default per precision.")
    min_cosine: float | None = setting(
        None, maximum=1.0, build="never",
        doc="Least cosine similarity of the next-token logits with the reference's, at every step of every prompt "
            "along the reference's continuation (teacher forcing). Default per precision.")
    min_top5: float | None = setting(
        None, maximum=1.0, build="never",
        doc="Least mean overlap of the top-5 next tokens with the reference's, along the reference's "
            "continuation. Default per precision.")
    max_kl: float | None = setting(
        None, maximum=1e6, build="never",
        doc="Largest mean KL divergence of the artifact's next-token distribution from the fp32 source's, in nats "
            "per position, along the reference's continuations (teacher forcing). Default per precision.")
    min_top1: float | None = setting(
        None, maximum=1.0, build="never",
        doc="Least top-1 agreement with the fp32 source at the decided positions: those where its top-1 token's "
            "logit leads the second's by at least `margin`. Default per precision.")
    margin: float | None = setting(
        None, maximum=1e6, build="never",
        doc="What a decided position is for `min_top1`: fp32's top-1 logit minus its second's, in nats (1.0: the "
            "top-1 token at least e = 2.7 times as likely as the next). Default 1.0.")
    max_ppl_increase: float | None = setting(
        None, maximum=1e6, build="never",
        doc="Largest relative increase of the perplexity on the model's `heldout` text over the reference's "
            "(0.05: 5%). Default per precision; without `heldout` text it is not judged.")


@dataclass(frozen=True)
class Generation:
    """[targets.X.generation]: generation latency and memory budgets of a generative model (docs/generative.md)."""

    prompt_tokens: int = setting(
        64, maximum=1 << 20, build="never",
        doc="Prompt length the time to first token is measured at (token ids drawn with a fixed seed).")
    new_tokens: int = setting(
        32, maximum=1 << 20, build="never", doc="Tokens generated per timed generation (EOS ignored).")
    ttft_p50_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the median time to first token (prefill + first token), ms.")
    ttft_p90_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the 90th percentile time to first token, ms.")
    ttft_p99_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the 99th percentile time to first token, ms.")
    tpot_p50_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the median time per output token (each decode step), ms.")
    tpot_p90_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the 90th percentile time per output token, ms.")
    tpot_p99_ms: float | None = setting(None, maximum=MS_MAX, build="never",
                                        doc="Budget of the 99th percentile time per output token, ms.")
    min_tokens_per_second: float | None = setting(
        None, maximum=1e9, build="never", doc="Least decode throughput: new tokens per second of decoding.")
    max_memory_mb: float | None = setting(
        None, maximum=1 << 20, build="never",
        doc="Budget of the peak resident memory (MiB) of a fresh process that opens the artifact through its "
            "generated loader and generates up to the model's context length (the KV cache at its largest).")
    confidence: float = setting(0.95, maximum=0.999999, build="never", doc="Confidence of every verdict.")
    context_length: int | None = setting(
        None, maximum=1 << 24, build="never",
        doc="The context peak memory is measured at (prompt + new tokens filling it); default: the model's "
            "context length (genai_config.json), where onnxruntime-genai's KV cache is largest.")
    min_samples: int = setting(
        0, maximum=1_000_000, build="never",
        doc="Timed generations before the first look; 0: the latency gate's plan (first look at 20).")
    max_seconds: float = setting(60.0, maximum=86400, build="never",
                                 doc="Timed generations stop after this long; a budget still undecided is "
                                     "INCONCLUSIVE.")

    @property
    def declared(self) -> bool:
        """Whether any budget is set (the gate runs only then)."""
        return any(v is not None for v in (self.ttft_p50_ms, self.ttft_p90_ms, self.ttft_p99_ms, self.tpot_p50_ms,
                                           self.tpot_p90_ms, self.tpot_p99_ms, self.min_tokens_per_second,
                                           self.max_memory_mb))
