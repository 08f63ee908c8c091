"""Steps of a generative model (ortbuild.pipeline.genai): check its Hugging Face-format directory, run
onnxruntime-genai's model builder for the target's provider and precision, fold the weights into the one graph
file the loaders hand to onnxruntime-genai from memory, and open the plaintext build once (greedy tokens on the
golden prompts: never NaN, and what the sealed artifact must reproduce through its loader)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortbuild.errors import ConfigError, OutputsBroken, StepError
from ortbuild.project import generation
from ortbuild.project.config import Settings
from ortbuild.project.sections import Int4, Quantization

PROTOBUF_LIMIT = (2 << 30) - (64 << 20)  # a single ONNX file is a protobuf: under 2 GiB, with room for the graph
RELOAD_TOKENS = 8                        # greedy tokens per golden prompt at build time
CONFIG_FILE = "genai_config.json"


@dataclass(frozen=True)
class GenSource:
    """The checked source directory and the golden prompts."""

    architecture: str
    prompts: tuple[str, ...]
    size: int                         # every file of the directory
    config: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)  # its config.json


@dataclass(frozen=True)
class GenBuilt:
    """The builder's output in the build's private temp dir, its graph folded into one file."""

    folder: Path
    graph: Path                       # the decoder (model.onnx), weights inside
    config: dict[str, Any]            # genai_config.json
    side_files: tuple[str, ...]       # genai_config.json and the tokenizer files, in folder
    precision: str                    # the builder's -p
    execution_provider: str           # the builder's -e
    extra_options: dict[str, str]
    seconds: float
    notes: tuple[str, ...] = ()
    matmuls: tuple[str, ...] = ()     # matmul_names(graph)


@dataclass(frozen=True)
class GenReloaded:
    """Greedy tokens of the plaintext build on each golden prompt (prompt -> token ids)."""

    tokens: dict[str, list[int]] = field(hash=False)


def read_prompts(path: Path, config: str, key: str, *, strip: bool = True) -> tuple[str, ...]:
    """The golden prompts: one per non-empty line of a UTF-8 text file (`strip`: without the spaces around it;
    an expected continuation keeps its leading space, which a tokenizer reads as part of its first token)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(config, key, f"cannot read the prompts file {path}: {e}",
                          "a UTF-8 text file of golden prompts, one per line") from None
    prompts = tuple(line.strip() if strip else line.rstrip("\r") for line in lines if line.strip())
    if not prompts:
        raise ConfigError(config, key, f"{path} holds no prompt", "write one golden prompt per line")
    return prompts


def check(folder: Path, prompts: Path, config: str, model: str, size: int) -> GenSource:
    problem = generation.directory_problem(folder)
    if problem:
        raise ConfigError(config, f"models.{model}.path", f"{folder} {problem}",
                          "a Hugging Face-format directory: config.json, model.safetensors, tokenizer.json")
    try:
        hf = json.loads((folder / generation.HF_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(config, f"models.{model}.path", f"{folder / generation.HF_CONFIG} is unreadable: {e}",
                          "write the model with transformers' save_pretrained()") from None
    archs = hf.get("architectures") if isinstance(hf, dict) else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(config, f"models.{model}.path", f"{folder / generation.HF_CONFIG} names no `architectures`",
                          "write the model with transformers' save_pretrained() (it records the architecture)")
    return GenSource(archs[0], read_prompts(prompts, config, f"models.{model}.inputs"), size, hf)


HF_REMOTE = "hf_remote"  # the builder's trust_remote_code switch: always passed as false


def extra_options(settings: Settings) -> dict[str, str]:
    """The builder's --extra_options from the target's precision options (docs/generative.md)."""
    opts = settings.typed_precision_options()
    out: dict[str, str] = {}
    if isinstance(opts, Int4):
        out["block_size"] = str(opts.block_size)
        out["is_symmetric"] = "true" if opts.symmetric else "false"
        out["accuracy_level"] = str(opts.accuracy_level)
    excluded = opts.exclude_nodes if isinstance(opts, Int4 | Quantization) else ()
    if excluded:
        out["nodes_to_exclude"] = ",".join(excluded)
    return out


def missing_builder() -> list[str]:
    """The builder's packages this environment lacks."""
    return [name for name in ("onnxruntime_genai", "torch", "transformers") if importlib.util.find_spec(name) is None]


def build(source: Path, work: Path, settings: Settings, provider: str, target: str, model: str,
          config_file: str = "targets.toml") -> GenBuilt:
    missing = missing_builder()
    if missing:
        raise StepError(target, model, "genai-build", f"this environment lacks {', '.join(missing)}: "
                        "onnxruntime-genai's model builder needs them to read a Hugging Face-format directory",
                        f"pip install {' '.join(generation.BUILDER_REQUIREMENTS)} (nox installs them into a generative "
                        "target's venv)")
    out, cache = work / "genai", work / "genai-cache"
    precision = generation.BUILDER_PRECISION[settings.precision]
    ep = generation.BUILDER_PROVIDER[provider]
    extra = extra_options(settings)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
               "-p", precision, "-e", ep, "-c", str(cache)]
    # hf_remote=false: the builder's default today, said so that a later pin cannot run a model directory's
    # `auto_map` code (transformers' trust_remote_code) behind ortbuild's back
    command += ["--extra_options", *(f"{k}={v}" for k, v in extra.items()), f"{HF_REMOTE}=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    for line in (done.stdout + done.stderr).splitlines():
        print(line, file=sys.stderr)  # the build's log (dist/logs/) keeps what the builder said
    if done.returncode != 0 or not (out / CONFIG_FILE).is_file():
        said = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise StepError(target, model, "genai-build", f"onnxruntime-genai's model builder failed (exit "
                        f"{done.returncode}): {said[-1][:300] if said else 'no output'}",
                        f"its full output is in the build log; the command was: {' '.join(command)}")
    config = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8"))
    notes_of_session = session_options(config, settings)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    graph = out / config["model"]["decoder"]["filename"]
    notes = fold(graph, target, model)
    matmuls = matmul_names(graph)
    kept = [n for n in extra.get("nodes_to_exclude", "").split(",") if n]
    unknown = [n for n in kept if n not in matmuls]
    if unknown:  # the builder ignores a name it does not know without a word
        more = " ..." if len(matmuls) > 8 else ""
        table = "int4" if settings.precision == "int4-weight" else "quantization"
        raise ConfigError(config_file, f"targets.{target}.{table}.exclude_nodes", f"names {', '.join(unknown)}, which "
                          f"the graph the builder made for model '{model}' has no MatMul of (the builder would ignore "
                          "it without a word)", f"its MatMul nodes: {', '.join(matmuls[:8])}{more}")
    side = tuple(sorted(f.name for f in out.iterdir() if f.is_file() and f != graph))
    return GenBuilt(out, graph, config, side, precision, ep, extra, seconds, (*notes_of_session, *notes),
                    tuple(matmuls))


# ONNX Runtime's graph optimization level by the target's `optimization` (onnxruntime-genai's names)
GENAI_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                "layout": "ORT_ENABLE_ALL", "all": "ORT_ENABLE_ALL"}


def session_options(config: dict[str, Any], settings: Settings) -> tuple[str, ...]:
    """The target's session options and optimization level, written into genai_config.json's decoder
    session_options (what onnxruntime-genai creates its session with); what it has no key for is said."""
    so = config["model"]["decoder"].setdefault("session_options", {})
    s = settings.session
    so["graph_optimization_level"] = GENAI_LEVELS[settings.optimization]
    so["enable_cpu_mem_arena"], so["enable_mem_pattern"] = s.enable_cpu_mem_arena, s.enable_mem_pattern
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        if getattr(s, key):
            so[key] = getattr(s, key)
    ignored = [k for k in s.config] + (["execution_mode"] if s.execution_mode != "sequential" else []) + \
        (["use_deterministic_compute"] if s.use_deterministic_compute else [])
    said = f"session options onnxruntime-genai's genai_config.json has no key for, not applied: {', '.join(ignored)}"
    return (said,) if ignored else ()


def matmul_names(graph: Path) -> list[str]:
    """The graph's MatMul nodes, quantized or not, by the name the builder's nodes_to_exclude takes (a quantized
    one's name less its _Q4/_Q8 suffix)."""
    import onnx

    proto = onnx.load(str(graph), load_external_data=False)
    return [re.sub(r"_Q\d+$", "", n.name) for n in proto.graph.node if n.op_type in ("MatMul", "MatMulNBits")]


def fold(graph: Path, target: str, model: str) -> tuple[str, ...]:
    """The builder writes its weights beside the graph (model.onnx.data); onnxruntime-genai takes only the graph
    from memory (Config.add_model_data) and would read the data file from disk, so the weights go into the graph."""
    import onnx

    data = [f for f in graph.parent.iterdir() if f.name.startswith(graph.name + ".") or f.suffix == ".data"]
    if not data:
        return ()
    size = sum(f.stat().st_size for f in data) + graph.stat().st_size
    if size > PROTOBUF_LIMIT:
        raise StepError(target, model, "genai-build", f"the built model holds {size / (1 << 30):.2f} GiB: "
                        "onnxruntime-genai 0.18 opens a model from memory as one ONNX file (Config.add_model_data "
                        "ignores external data), which protobuf limits to 2 GiB",
                        "use a smaller precision (int4-weight) or a smaller model; writing the plaintext weights to a "
                        "file for onnxruntime-genai to read is what ortbuild never does")
    tmp = graph.with_name(graph.name + ".folded")
    if not _fold_streaming(onnx, graph, tmp):  # a tensor outside the initializers holds external data: in memory
        proto = onnx.load(str(graph), load_external_data=True)
        onnx.save_model(proto, str(tmp), save_as_external_data=False)
        del proto
    for f in data:
        f.unlink()
    tmp.replace(graph)
    return (f"weights folded into the graph ({', '.join(f.name for f in data)}): onnxruntime-genai opens it from "
            "memory as one file",)


def _fold_streaming(onnx: Any, graph: Path, out: Path) -> bool:
    """fold() without the model in memory: the bytes onnx.save_model writes for the model loaded with its external
    data, each initializer's data copied from the data file in 8 MiB pieces. Protobuf writes fields in field-number
    order, so the model is its fields before the graph (7), the graph, then the rest; the graph likewise around its
    initializers (5), and a tensor around its raw_data (9). False where a tensor other than an initializer holds
    external data, or data outside the graph's folder (nothing written: onnx.load then does it, or refuses)."""
    from onnx import external_data_helper as ext

    proto = onnx.load(str(graph), load_external_data=False)
    inits = list(proto.graph.initializer)
    own = {id(t) for t in inits}
    every = getattr(ext, "_get_all_tensors", None)
    if every is None or any(ext.uses_external_data(t) for t in every(proto) if id(t) not in own):
        return False
    plan: list[tuple[bytes, Path | None, int, int, bytes]] = []  # head, data file, offset, length, tail
    for t in inits:
        if not ext.uses_external_data(t):
            plan.append((t.SerializeToString(), None, 0, 0, b""))
            continue
        info = {e.key: e.value for e in t.external_data}
        src = graph.parent / info.get("location", "")
        offset = int(info.get("offset") or 0)
        if not src.is_file() or not src.resolve().is_relative_to(graph.parent.resolve()):
            return False
        length = int(info["length"]) if info.get("length") else src.stat().st_size - offset
        meta = type(t)()
        meta.CopyFrom(t)
        del meta.external_data[:]
        meta.data_location = onnx.TensorProto.DEFAULT  # as onnx.load sets it
        head, tail = _split_fields(meta.SerializeToString(), 8)
        plan.append((head + _varint(9 << 3 | 2) + _varint(length), src, offset, length, tail))
    pieces = [len(head) + length + len(tail) for head, _, _, length, tail in plan]
    spans = sorted((str(src), offset, offset + length) for _, src, offset, length, _ in plan if src is not None)
    # each range of the data file freed once copied (it is RAM on /dev/shm), unless two tensors share bytes
    free = _punch_hole() if all(a[0] != b[0] or a[2] <= b[1] for a, b in itertools.pairwise(spans)) else None
    del proto.graph.initializer[:]
    g_head, g_tail = _split_fields(proto.graph.SerializeToString(), 5)
    g_size = len(g_head) + len(g_tail) + sum(len(_varint(5 << 3 | 2)) + len(_varint(n)) + n for n in pieces)
    proto.ClearField("graph")
    m_head, m_tail = _split_fields(proto.SerializeToString(), 7)
    with out.open("wb") as f:
        f.write(m_head + _varint(7 << 3 | 2) + _varint(g_size) + g_head)
        for (head, src, offset, length, tail), n in zip(plan, pieces, strict=True):
            f.write(_varint(5 << 3 | 2) + _varint(n) + head)
            if src is not None:
                with src.open("rb" if free is None else "r+b") as data:  # punching a hole needs a writable fd
                    data.seek(offset)
                    left = length
                    while left:
                        chunk = data.read(min(left, 8 << 20))
                        if not chunk:
                            raise OSError(f"{src} ends before the {length} bytes of an initializer at {offset}")
                        f.write(chunk)
                        if free is not None:
                            free(data.fileno(), offset + length - left, len(chunk))
                        left -= len(chunk)
            f.write(tail)
        f.write(g_tail + m_tail)
    return True


def _punch_hole() -> Any:
    """fallocate(fd, PUNCH_HOLE | KEEP_SIZE, offset, length) where the C library has it (Linux), else None."""
    try:
        import ctypes

        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
        fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    except (OSError, AttributeError, TypeError):
        return None
    return lambda fd, offset, length: fallocate(fd, 3, offset, length)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    n, shift = 0, 0
    while True:
        n |= (buf[pos] & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not buf[pos - 1] & 0x80:
            return n, pos


def _split_fields(buf: bytes, field: int) -> tuple[bytes, bytes]:
    """A serialized message split before its first field numbered above `field` (protobuf's wire format)."""
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        if key >> 3 > field:
            return buf[:start], buf[start:]
        kind = key & 7
        if kind == 0:
            pos = _read_varint(buf, pos)[1]
        elif kind == 2:
            n, pos = _read_varint(buf, pos)
            pos += n
        else:
            pos += 8 if kind == 1 else 4
    return buf, b""


def facts(built: GenBuilt) -> Mapping[str, Any]:
    """What the manifest records of genai_config.json."""
    m = built.config["model"]
    eos = m.get("eos_token_id", [])
    return {"model_type": str(m.get("type", "")), "context_length": int(m.get("context_length", 0)),
            "vocab_size": int(m.get("vocab_size", 0)), "num_layers": int(m["decoder"].get("num_hidden_layers", 0)),
            "eos_token_ids": [int(e) for e in (eos if isinstance(eos, list) else [eos])]}


def reload(built: GenBuilt, prompts: tuple[str, ...], target: str, model: str, cpu: bool) -> GenReloaded:
    """Open the plaintext build with onnxruntime-genai and generate RELOAD_TOKENS greedy tokens per prompt; logits
    that are not finite fail the build (an int4/int8 that gives NaN is never BUILT). `cpu`: on the CPU provider
    (a portable build: the target's providers cannot run here), else on the providers the builder configured."""
    import numpy as np
    import onnxruntime_genai as og

    try:
        return _greedy_prompts(og, np, built, prompts, target, model, cpu)
    except OutputsBroken:
        raise
    except Exception as e:  # onnxruntime-genai's own exception types
        fp16_cpu = built.precision == "fp16" and (cpu or built.execution_provider == "cpu")
        raise StepError(target, model, "reload", f"onnxruntime-genai could not run the built model: "
                        f"{str(e).strip()[:300]}",
                        "the builder's fp16 graph for the CPU provider fails in onnxruntime 1.31 (docs/generative.md): "
                        "use fp32, int8-dynamic or int4-weight on CPU" if fp16_cpu else
                        "rerun with --debug; the builder's output is in the build log") from e


def _greedy_prompts(og: Any, np: Any, built: GenBuilt, prompts: tuple[str, ...], target: str, model: str,
                    cpu: bool) -> GenReloaded:
    config = og.Config(str(built.folder))
    if cpu:
        config.clear_providers()
    m = og.Model(config)
    tok = og.Tokenizer(m)
    out: dict[str, list[int]] = {}
    for prompt in prompts:
        ids = [int(t) for t in tok.encode(prompt)]
        params = og.GeneratorParams(m)
        params.set_search_options(max_length=min(len(ids) + RELOAD_TOKENS, facts(built)["context_length"] or 1 << 30),
                                  do_sample=False)
        gen = og.Generator(m, params)
        gen.append_tokens(ids)
        tokens: list[int] = []
        while not gen.is_done() and len(tokens) < RELOAD_TOKENS:
            logits = np.asarray(gen.get_logits(), dtype=np.float32)
            if not np.isfinite(logits).all():
                bad = int((~np.isfinite(logits)).sum())
                raise OutputsBroken(target, model, "genai-reload",
                                    f"the built model's next-token logits hold {bad} NaN/inf values of "
                                    f"{logits.size} after {len(tokens)} generated token(s) of prompt {prompt[:60]!r}",
                                    "a lower-precision setting broke the model: try int8 / a smaller int4 block_size / "
                                    "accuracy_level 0, or keep layers in float (docs/generative.md)")
            gen.generate_next_token()
            tokens.append(int(gen.get_next_tokens()[0]))
        out[prompt] = tokens
    return GenReloaded(out)
