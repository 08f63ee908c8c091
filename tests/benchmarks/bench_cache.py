"""The shared build cache, as CI uses it: two fresh clones of this repository, one cache in a real OCI registry
(Debian's docker-registry, started here on loopback), the same keys.

1. both clones' nox venvs are made first, by a build into a throwaway directory (`nox -s build -- --no-cache --dist
   DIR`, not timed: a CI runner caches its venvs too; the sessions install into their venvs themselves, so
   `--install-only` makes none);
2. clone A: `nox -R -s build` with ORTBUILD_CACHE set: builds every job and pushes it (cold cache);
3. clone B: the same command: every job pulled, verified and used; B's dist/ must equal A's, byte for byte;
4. clone A again: `nox -R -s build -- --force --no-cache`: the build alone, the baseline.
Prints the three times, the jobs each run built and pulled, and whether the artifacts are identical; exits 1 if
B built anything or its dist/ differs.

    python tests/benchmarks/bench_cache.py [--json OUT]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ortbuild-bench-cache-") as tmp:
        root = Path(tmp)
        proc, host = _registry(root)
        try:
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
           "artifact_files": files, "A": _counts(log_a), "B": _counts(log_b), "baseline": _counts(log_c)}
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
