"""The shared build cache, as CI uses it: two fresh clones of this repository, one cache in a real OCI registry
(Debian's docker-registry, started here on loopback), the same keys.

1. both clones' nox venvs are made first, by a build into a throwaway directory (`nox -s build -- --no-cache --dist
   DIR`, not timed: a CI runner caches its venvs too; the sessions install into their venvs themselves, so
   `--install-only` makes none);
2. clone A: `nox -R -s build` with ORTBUILD_CACHE set: builds every job and pushes it (cold cache);
3. clone B: the same command: every job pulled, verified and used; B's dist/ must equal A's, byte for byte;
4. clone A again: `nox -R -s build -- --force --no-cache`: the build alone, the baseline.
Prints the three times, the jobs each run built and pulled, and whether the artifacts are identical; exits 1 if
B built anything or its dist/ differs. `--gib G` adds the same three runs of `ortbuild build` (this Python's
environment, no nox) on two fresh projects of a generated G GiB model (tests/bigmodels.py, external data) with an
fp32 and an int8 target: where building costs most, quantization and optimization of real sizes.

    python tests/benchmarks/bench_cache.py [--json OUT] [--gib G]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ortbuild import installed

REPO = Path(__file__).resolve().parents[2]


def _registry(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        sys.exit("Debian's docker-registry is not installed (apt install docker-registry)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "registry.yml").write_text(f"""version: 0.1
log: {{level: error, accesslog: {{disabled: true}}}}
storage: {{filesystem: {{rootdirectory: {root / 'registry'}}}}}
http: {{addr: "127.0.0.1:{port}"}}
""")
    proc = subprocess.Popen([binary, "serve", str(root / "registry.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("docker-registry did not start")


def _nox(clone: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nox", *args], cwd=clone, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"nox {' '.join(args)} failed in {clone}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return took, proc.stdout + proc.stderr


def _digests(dist: Path) -> dict[str, str]:
    """Every artifact file's sha256 (dist/<target>/<model>/..., logs and build records left out)."""
    return {str(p.relative_to(dist)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dist.rglob("*"))
            if p.is_file() and len(p.relative_to(dist).parts) > 2 and p.parts[len(dist.parts)] != "logs"}


def _counts(log: str) -> dict[str, int]:
    return {s: len(re.findall(rf"^\[[^\]]+\] {s}", log, re.M)) for s in ("building", "pulled")}


BIG_TARGETS = """
[targets.cpu-fp32]
runtime = "onnxruntime==1.31.1"
providers = ["CPUExecutionProvider"]
precision = "fp32"

[targets.cpu-int8]
runtime = "onnxruntime==1.31.1"
providers = ["CPUExecutionProvider"]
precision = "int8-dynamic"
"""


def _big(root: Path, host: str, gib: float) -> dict[str, object]:
    """Two fresh projects of one generated model: cold cache, warm cache, no cache (module doc)."""
    sys.path.insert(0, str(REPO))
    from tests.bigmodels import dev_keys_env, layers_for, mlp

    model = mlp(root / "big-model", layers=layers_for(gib))
    runtime_req = f"onnxruntime=={installed.installed_flavor().version}"  # type: ignore[union-attr]
    env: dict[str, str] = {}
    for c in ("P", "Q"):
        (root / c).mkdir()
        (root / c / "targets.toml").write_text(
            f'[project]\nname = "big"\nversion = "1"\n\n[models.mlp]\npath = "{model}"\n'
            f'inputs = "{model.parent / "inputs.npz"}"\n' + BIG_TARGETS.replace("onnxruntime==1.31.1", runtime_req))
    env = dev_keys_env(root / "P")
    env["PYTHONPATH"] = str(REPO)

    def run(c: str, *args: str) -> tuple[float, dict[str, int]]:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ortbuild", "build", "-c", str(root / c / "targets.toml"),
                               "--json", *args], env=env, capture_output=True, text=True)
        took = time.perf_counter() - t
        if proc.returncode != 0:
            sys.exit(f"ortbuild build {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        jobs = json.loads(proc.stdout)["jobs"]
        return took, {s: sum(j["status"] == s for j in jobs) for s in ("built", "pulled")}

    ref = f"oci://{host}/bench-big"
    cold, a = run("P", "--cache", ref)
    warm, b = run("Q", "--cache", ref)
    same = _digests(root / "P" / "dist") == _digests(root / "Q" / "dist")
    alone, c = run("P", "--force", "--no-cache")
    weights = sum(f.stat().st_size for f in model.parent.glob("model.onnx*"))
    return {"gib": gib, "weights_bytes": weights, "cold_cache_build_and_push_s": round(cold, 1),
            "warm_cache_pull_s": round(warm, 1), "no_cache_build_s": round(alone, 1), "identical": same,
            "A": a, "B": b, "baseline": c}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--gib", type=float, help="also a generated model of this many GiB (module doc)")
    ap.add_argument("--big-only", action="store_true", help="only the generated model's runs (needs --gib)")
    args = ap.parse_args()
    big: dict[str, object] | None = None
    with tempfile.TemporaryDirectory(prefix="ortbuild-bench-cache-") as tmp:
        root = Path(tmp)
        proc, host = _registry(root)
        try:
            if args.gib:
                big = _big(root, host, args.gib)
                print(f"{args.gib:g} GiB model, 2 jobs (fp32, int8): cold cache {big['cold_cache_build_and_push_s']} s "
                      f"{big['A']}, warm cache {big['warm_cache_pull_s']} s {big['B']}, no cache "
                      f"{big['no_cache_build_s']} s; identical: {big['identical']}")
                if args.big_only:
                    if args.json:
                        Path(args.json).write_text(json.dumps({"big": big}, indent=2) + "\n")
                    sys.exit(0 if big["identical"] else 1)
            for c in ("A", "B"):
                subprocess.run(["git", "clone", "-q", str(REPO), str(root / c)], check=True)
            subprocess.run([sys.executable, "-m", "ortbuild", "keygen", "--out", str(root / "keys")], check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
            env = {**os.environ, "ORTBUILD_KEY_FILE": str(root / "keys" / "encryption.key"),
                   "ORTBUILD_SIGNING_KEY_FILE": str(root / "keys" / "signing.key")}
            for var in ("ORTBUILD_KEY", "ORTBUILD_SIGNING_KEY", "ORTBUILD_CACHE"):
                env.pop(var, None)
            for c in ("A", "B"):
                _nox(root / c, env, "-s", "build", "--", "--no-cache", "--dist", str(root / f"warm-{c}"))
            cached = {**env, "ORTBUILD_CACHE": f"oci://{host}/bench-cache"}
            cold, log_a = _nox(root / "A", cached, "-R", "-s", "build")
            warm, log_b = _nox(root / "B", cached, "-R", "-s", "build")
            same = _digests(root / "A" / "dist") == _digests(root / "B" / "dist")
            files = len(_digests(root / "B" / "dist"))
            alone, log_c = _nox(root / "A", env, "-R", "-s", "build", "--", "--force", "--no-cache")
        finally:
            proc.terminate()
            proc.wait(10)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "cold_cache_build_and_push_s": round(cold, 1),
           "warm_cache_pull_s": round(warm, 1), "no_cache_build_s": round(alone, 1), "identical": same,
           "artifact_files": files, "A": _counts(log_a), "B": _counts(log_b), "baseline": _counts(log_c),
           "big": big}
    print(f"clone A, cold cache (build + push):   {cold:7.1f} s  {out['A']}")
    print(f"clone B, warm cache (pull + verify):  {warm:7.1f} s  {out['B']}")
    print(f"clone A, --force --no-cache (build):  {alone:7.1f} s  {out['baseline']}")
    print(f"B's dist/ identical to A's: {same} ({files} files); B / build alone: {warm / alone:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if not same or out["B"]["building"] or not out["B"]["pulled"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
