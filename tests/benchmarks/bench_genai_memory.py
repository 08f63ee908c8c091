"""Generative models at real sizes: the build's peak memory, and the generated loader's against onnxruntime-genai
opening the plaintext (memory, open time, TTFT, TPOT). docs/benchmarks.md, "Generative models at real sizes".

    python tests/benchmarks/bench_genai_memory.py --shape qwen2.5-0.5b [--precisions int4,int8] [--procs 3]
    python tests/benchmarks/bench_genai_memory.py --model HF_DIR ...

--shape generates the shape's random-weight directory into --work (tests/benchmarks/genai_shapes.py; /tmp by
default, reused when it is there). Needs the generative venv (torch, transformers, onnxruntime-genai) and the
keys in $ORTBUILD_KEY and $ORTBUILD_SIGNING_KEY (development keys will do). One heavy job at a time: run it alone.

1. **Build**: `ortbuild build --force` of one target per precision, its process tree sampled every 20 ms (RSS of
   each process: the ortbuild process, which folds the weights, opens the build and runs its loader, and the model
   builder's subprocess), and /dev/shm's use (the build's private dir: memory too; the tree's RSS plus it, at the
   same instant, is the build's footprint). Peaks as a ratio of the source's fp32 weights (the bytes of its
   safetensors files).
2. **Open**: fresh processes, alternating: `og.Model(og.Config(plain))` + `og.Tokenizer` on the builder's own
   output for the same options (model.onnx + model.onnx.data: the reference), the loader's `load()`, and the loader
   forced onto `Config.add_model_data(bytes)` (its fallback, and the route before the pipe). Peak RSS (VmHWM) when
   open, and the footprint sampled from outside: RSS of the process and its children plus the anonymous memory
   files it holds (memfd pages are not in RSS), each process's peak; open time from before the first import.
3. **Generation**, in the same processes once open: one warm-up then --gens generations of the same 64 prompt ids
   (drawn with a fixed seed below the special tokens) and 32 new tokens: TTFT (generator creation, prefill, first
   token) and TPOT (the other 31 steps, each generation's mean); medians over every generation of every process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks import genai_shapes  # noqa: E402
from tests.benchmarks.machine_class import describe  # noqa: E402

PRECISIONS = {"int4": 'precision = "int4-weight"', "int8": 'precision = "int8-dynamic"',
              "fp32": 'precision = "fp32"'}
PROMPTS = "The loaders check the same\nOnce upon a time\n"

CHILD = r"""
import json, os, random, re, sys, time
t0 = time.perf_counter()
mode, folder, gens = sys.argv[1], sys.argv[2], int(sys.argv[3])
import onnxruntime_genai as og
if mode == "plain":
    model = og.Model(og.Config(folder))
    tok = og.Tokenizer(model)
else:
    sys.path.insert(0, folder + "/loader")
    import importlib, pathlib
    mod = importlib.import_module(next(pathlib.Path(folder, "loader").glob("ortbuild_*.py")).stem)
    if mode == "loader-bytes":
        mod._Feed.start = classmethod(lambda cls, graph: None)
    model = mod.load(folder=folder).model
opened = time.perf_counter() - t0
status = open("/proc/self/status").read()
mb = lambda k: int(re.search(k + r":\s+(\d+)", status).group(1)) / 1024
print("opened " + json.dumps({"open_s": opened, "hwm_mb": mb("VmHWM"), "rss_mb": mb("VmRSS")}), flush=True)
cfg = json.load(open(os.path.join(folder, "genai_config.json")))["model"]
specials = {i for k in ("bos_token_id", "eos_token_id", "pad_token_id")
            for i in (cfg.get(k) if isinstance(cfg.get(k), list) else [cfg.get(k)]) if i is not None}
ids = random.Random(0).sample([i for i in range(cfg["vocab_size"]) if i not in specials], 64)
ttft, tpot = [], []
for g in range(gens + 1):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=96, min_length=96, do_sample=False)
    a = time.perf_counter()
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    gen.generate_next_token()
    b = time.perf_counter()
    for _ in range(31):
        gen.generate_next_token()
    c = time.perf_counter()
    if g:
        ttft.append((b - a) * 1000)
        tpot.append((c - b) * 1000 / 31)
print("done " + json.dumps({"ttft_ms": ttft, "tpot_ms": tpot}), flush=True)
"""


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            pass
    return out


def _status(pid: int) -> dict[str, Any]:
    got: dict[str, Any] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                got[k] = int(v.split()[0]) / 1024
        got["cmd"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return {}
    return got


def _memfds(pids: list[int]) -> float:
    """MB of the anonymous memory files the processes hold (each counted once): RAM that RSS does not show."""
    seen: dict[tuple[int, int], int] = {}
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:"):
                    st = os.stat(f"/proc/{p}/fd/{fd}")
                    seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
    return sum(seen.values()) / (1 << 20)


def _shm_used() -> float:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize / (1 << 20)


class Sampler(threading.Thread):
    """Every `every` s until stop(): the tree's RSS + memfds (footprint), and each process's largest sample."""

    def __init__(self, pid: int, every: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.halt = pid, every, threading.Event()
        self.footprint = self.shm = self.with_shm = 0.0
        self.procs: dict[int, dict[str, Any]] = {}
        self.shm0 = _shm_used()
        self.start()

    def run(self) -> None:
        while not self.halt.is_set():
            pids = _tree(self.pid)
            total = 0.0
            for p in pids:
                s = _status(p)
                total += s.get("VmRSS", 0.0)
                if s and s.get("VmRSS", 0.0) >= self.procs.get(p, {}).get("VmRSS", -1.0):
                    self.procs[p] = {**s, "VmHWM": max(s.get("VmHWM", 0.0), self.procs.get(p, {}).get("VmHWM", 0.0))}
            self.footprint = max(self.footprint, total + _memfds(pids))
            shm = _shm_used() - self.shm0
            self.shm = max(self.shm, shm)
            self.with_shm = max(self.with_shm, total + shm)  # the build's private dir on /dev/shm is RAM too
            time.sleep(self.every)

    def stop(self) -> None:
        self.halt.set()
        self.join()


def build(project: Path, target: str, fp32_mb: float) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, "-m", "ortbuild", "build", "-c", str(project / "targets.toml"), "-t",
                             target, "--force"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    sampler = Sampler(proc.pid, every=0.02)
    start = time.perf_counter()
    out = proc.communicate()[0]
    seconds = time.perf_counter() - start
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"ortbuild build failed:\n{out[-3000:]}")
    procs = list(sampler.procs.values())
    builder = max((p for p in procs if "onnxruntime_genai.models.builder" in p["cmd"]), key=lambda p: p["VmHWM"])
    main = max((p for p in procs if " -m ortbuild " in p["cmd"]), key=lambda p: p["VmHWM"])
    figures = {"seconds": round(seconds, 1), "tree_peak_mb": round(sampler.footprint),
               "tree_and_dev_shm_peak_mb": round(sampler.with_shm),
               "builder_peak_mb": round(builder["VmHWM"]), "builder_at_peak_anon_mb": round(builder["RssAnon"]),
               "builder_at_peak_file_mb": round(builder["RssFile"]), "ortbuild_process_peak_mb": round(main["VmHWM"]),
               "dev_shm_peak_mb": round(sampler.shm)}
    figures["ratios_to_fp32_weights"] = {k[:-3]: round(v / fp32_mb, 2) for k, v in figures.items()
                                         if k.endswith("_mb")}
    return figures


def plain_build(source: Path, artifact: Path, out: Path) -> None:
    """The builder's own output for the artifact's precision and options (the reference genai opens from disk)."""
    if (out / "genai_config.json").is_file():
        return
    gen = json.loads((artifact / "manifest.json").read_text())["generative"]
    extra = [f"{k}={v}" for k, v in gen["extra_options"].items()]
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
                    "-p", gen["precision"], "-e", gen["execution_provider"], "-c", str(out.parent / "builder-cache"),
                    "--extra_options", *extra, "hf_remote=false"], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def child(mode: str, folder: Path, gens: int) -> dict[str, Any]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(folder), str(gens)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = Sampler(proc.pid)
    result: dict[str, Any] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("opened "):
            sampler.stop()
            result.update(json.loads(line[7:]), footprint_mb=sampler.footprint)
        elif line.startswith("done "):
            result.update(json.loads(line[5:]))
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0 or "tpot_ms" not in result:
        raise SystemExit(f"{mode} failed: {err[-3000:]}")
    return result


def compare(artifact: Path, plain: Path, procs: int, gens: int) -> dict[str, Any]:
    modes = {"plain": plain, "loader": artifact, "loader-bytes": artifact}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(procs):
        for mode, folder in modes.items():  # alternating: the machine's drift falls on every mode
            runs[mode].append(child(mode, folder, gens if mode != "loader-bytes" else 0))
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("open_s", "hwm_mb", "rss_mb", "footprint_mb")}
        if mode != "loader-bytes":
            med["ttft_ms"] = statistics.median(x for r in rs for x in r["ttft_ms"])
            med["tpot_ms"] = statistics.median(x for r in rs for x in r["tpot_ms"])
        out[mode] = {k: round(v, 3 if k.endswith("_s") else 1) for k, v in med.items()}
        out[mode]["runs"] = {k: [round(r[k], 2 if k.endswith("_s") else 0) for r in rs]
                             for k in ("hwm_mb", "rss_mb", "open_s")}
    for mode in ("loader", "loader-bytes"):
        out[mode]["vs_plain"] = {k: round(v / out["plain"][k], 2) for k, v in out[mode].items()
                                 if k != "runs" and k in out["plain"] and out["plain"][k]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", type=Path, help="a Hugging Face-format directory")
    group.add_argument("--shape", choices=sorted(genai_shapes.SHAPES))
    parser.add_argument("--precisions", default="int4,int8")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ortbuild-genai-memory"))
    parser.add_argument("--procs", type=int, default=3, help="fresh processes per mode")
    parser.add_argument("--gens", type=int, default=5, help="timed generations per process")
    parser.add_argument("--skip-build", action="store_true", help="reuse the artifacts in --work")
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    source = args.model.resolve() if args.model else args.work / args.shape
    if args.shape and not (source / "ortbuild_shape.json").is_file():
        print(json.dumps(genai_shapes.generate(args.shape, source)), flush=True)
    fp32_mb = sum(f.stat().st_size for f in source.glob("*.safetensors")) / (1 << 20)
    project = args.work / "project"
    project.mkdir(exist_ok=True)
    (project / "prompts.txt").write_text(PROMPTS)
    precisions = args.precisions.split(",")
    toml = ['[project]\nname = "mem"\nversion = "1"\n',
            f'[models.m]\npath = "{source}"\ninputs = "prompts.txt"\n']
    toml += [f'[targets.{p}]\nruntime = "onnxruntime==1.31.1"\nproviders = ["CPUExecutionProvider"]\n'
             f'models = ["m"]\n{PRECISIONS[p]}\n' for p in precisions]
    (project / "targets.toml").write_text("\n".join(toml))
    report: dict[str, Any] = {"source": str(source), "fp32_weights_mb": round(fp32_mb)}
    for p in precisions:
        if not args.skip_build:
            report[f"build {p}"] = build(project, p, fp32_mb)
            print(json.dumps({f"build {p}": report[f"build {p}"]}), flush=True)
        artifact = project / "dist" / p / "m"
        plain = args.work / f"plain-{p}"
        plain_build(source, artifact, plain)
        report[f"open and generate {p}"] = compare(artifact, plain, args.procs, args.gens)
        print(json.dumps({f"open and generate {p}": report[f"open and generate {p}"]}), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
