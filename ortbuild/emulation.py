"""Emulated platforms: the golden gate of a target whose `platform` is not this machine's runs through the
artifact's generated Python loader on that platform's ONNX Runtime wheel, under qemu-user.

linux-aarch64: an arm64 Debian userland (Debian's `debootstrap --foreign`, its packages unpacked with dpkg-deb: no
binfmt_misc and no chroot needed), the target's runtime and the loader's dependencies as manylinux aarch64 wheels
(`uv pip install --python-platform`, else pip's `--platform`), run by `qemu-aarch64-static -L <userland>`. Made
once per (platform, requirements) under ~/.cache/ortbuild/emulation (ORTBUILD_EMULATION_CACHE), under a lock, and
reused. ORTBUILD_EMULATION=off turns emulation off (the tests' default); the target is then SKIPPED with that reason.
Emulation says nothing about a device's speed: the latency, cold-start and memory gates are SKIPPED there.

x86-64 levels (x86-64-v2 ... x86-64-v4-vnni): ONNX Runtime picks its x86 kernels by CPUID, so an artifact gated on
one level may fail on another (u8s8 int8 kernels without VNNI saturate). A level target runs natively on a CPU of
that level; on a newer x86-64 CPU its golden gate runs this environment's own Python and ONNX Runtime under
`qemu-x86_64-static -cpu <that level's CPU model>` (nothing to set up); on an older one, or a level qemu's TCG
cannot run (AVX-512), it is SKIPPED with the reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ortbuild import machine
from ortbuild.errors import MissingProvider, OrtbuildError, from_loader
from ortbuild.project.precisions import Emulator, PlatformRule, platform_rule

SUITE = "bookworm"                    # the Debian release of the emulated userland (Python 3.11)
MIRROR_VAR, CACHE_VAR, SWITCH_VAR = "ORTBUILD_DEBIAN_MIRROR", "ORTBUILD_EMULATION_CACHE", "ORTBUILD_EMULATION"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
LAYOUT = 2                            # bump when what a set-up environment holds changes
TIMEOUT_S = 900                       # one emulated run of an artifact's golden data sets
SETUP_TIMEOUT_S = 1800                # one setup command (debootstrap, the wheels)
# what a set-up downloads and keeps, said when it starts (measured for bookworm arm64 with onnxruntime 1.31, numpy
# and cryptography: 110 Debian packages, 41 MB, unpacked to 249 MB; the wheels installed take 130 MB)
USERLAND_SIZE = "downloads about 50 MB of Debian packages, 250 MB unpacked"
WHEELS_SIZE = "downloads about 40 MB of wheels, 130 MB installed"


def _cpuinfo(e: Emulator, cpus: int = 2) -> str:
    """/proc/cpuinfo of the emulated CPU."""
    return "".join(f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: {e.cpu_features}\nCPU implementer\t: "
                   f"0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: {e.cpu_part}\nCPU revision\t: 1\n\n"
                   for i in range(cpus))


class EmulationError(OrtbuildError):
    """The emulated environment could not be set up or run: the target cannot run here, as with a missing
    provider."""

    exit_code = MissingProvider.exit_code


def host() -> str:
    """This machine's platform, in targets.toml's words."""
    m = platform.machine().lower()
    return f"{sys.platform.rstrip('0123456789')}-{ {'amd64': 'x86_64', 'arm64': 'aarch64'}.get(m, m)}"


def host_level() -> str | None:
    """This machine's x86-64 level (machine.X86_LEVELS), None on other machines."""
    lv = machine.x86_level()
    return lv.name if lv else None


def emulated(name: str) -> bool:
    """Whether a target of platform `name` runs emulated here ("native", this machine's own platform and its own
    x86-64 level run natively)."""
    return platform_rule(name).emulated_on(host(), host_level())


X86_QEMU = "qemu-x86_64-static"
# the Haswell model's features TCG does not emulate (system ones, meaningless to user mode): off, so qemu says nothing
_TCG_LACKS = ",-pcid,-x2apic,-tsc-deadline,-invpcid"


def _x86_unavailable(p: PlatformRule) -> str:
    """Why an x86-64 level target's golden gate cannot run here ("" when it can, natively or emulated)."""
    assert p.x86_level is not None
    want = machine.x86_level_named(p.x86_level)
    here = machine.x86_level()
    linux_x86 = host() == f"linux-{p.machine}"  # qemu-user is Linux's, and runs this machine's own Python
    if not linux_x86 or here is None:
        what = "an x86-64 CPU older than x86-64-v2" if linux_x86 else f"a {host()} machine"
        return f"an {p.name} target is tested on an x86-64 CPU of that level ({want.says}); this is {what}"
    if here.name == want.name:
        return ""
    if machine.X86_LEVELS.index(here) < machine.X86_LEVELS.index(want):
        return (f"this machine's CPU ({machine.cpu_model()}) is {here.name} ({here.says}), older than {p.name} "
                f"({want.says}): its gates run on a CPU of that level or newer (a runner: `ortbuild matrix`)")
    if want.qemu_cpu is None:
        return (f"this machine's CPU is {here.name} ({here.says}) and qemu-user cannot emulate {p.name} "
                f"({want.says}): its gates run natively on a {p.name} CPU (a runner: `ortbuild matrix`)")
    if off := _switched_off(p.name):
        return off
    if shutil.which(X86_QEMU) is None:
        return (f"testing an {p.name} target on this {here.name} CPU needs qemu-user ({X86_QEMU}; Debian/Ubuntu: "
                "apt-get install qemu-user-static), or a runner with a CPU of that level (`ortbuild matrix`)")
    return ""


def _switched_off(name: str) -> str:
    """Why the emulated golden test of platform `name` is not run here: turned off (ORTBUILD_EMULATION), or ""."""
    if os.environ.get(SWITCH_VAR, "").lower() in ("off", "0", "no", "false"):
        return f"the emulated {name} golden test is turned off here ({SWITCH_VAR}={os.environ[SWITCH_VAR]})"
    return ""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VAR) or Path.home() / ".cache" / "ortbuild" / "emulation")


def _key(p: PlatformRule, requirements: Sequence[str]) -> str:
    mirror = os.environ.get(MIRROR_VAR, DEFAULT_MIRROR)
    return hashlib.sha256(json.dumps([LAYOUT, p.name, SUITE, mirror, sorted(requirements)]).encode()).hexdigest()[:16]


def _rootfs(p: PlatformRule) -> Path:
    return cache_root() / f"{p.name}-{SUITE}-rootfs-v{LAYOUT}"


def _site(p: PlatformRule, requirements: Sequence[str]) -> Path:
    return cache_root() / f"{p.name}-site-{_key(p, requirements)}"


def ready(name: str, requirements: Sequence[str]) -> bool:
    p = platform_rule(name)
    if p.x86_level is not None:
        return True  # this environment's own Python and runtime, under qemu: nothing to set up
    return (p.emulator is not None and (_rootfs(p) / ".ready").is_file()
            and (_site(p, requirements) / ".ready").is_file())


def unavailable(name: str, requirements: Sequence[str]) -> str:
    """Why targets of platform `name` cannot be tested here ("" when they can, setting up on first use)."""
    if platform_rule(name).x86_level is not None:
        return _x86_unavailable(platform_rule(name))
    e = platform_rule(name).emulator
    if e is None:
        return f"{name} is not this machine's platform ({host()}) and ortbuild cannot emulate it"
    if off := _switched_off(name):
        return off
    if shutil.which(e.qemu) is None:
        return (f"testing a {name} target here needs qemu-user ({e.qemu}; Debian/Ubuntu: apt-get install "
                "qemu-user-static debootstrap), or a runner of that platform (`ortbuild matrix`)")
    if ready(name, requirements):
        return ""
    tools = [t for t in ("debootstrap", "dpkg-deb") if shutil.which(t) is None]
    if tools:
        return (f"setting up the emulated {name} userland needs {' and '.join(tools)} (Debian/Ubuntu: apt-get install "
                "debootstrap)")
    if os.geteuid() != 0 and shutil.which("fakeroot") is None:
        return f"setting up the emulated {name} userland needs root or fakeroot (debootstrap)"
    if shutil.which("uv") is None and not _has_pip():
        return f"setting up the emulated {name} environment needs uv or pip (to fetch its aarch64 wheels)"
    return ""


def _has_pip() -> bool:
    import importlib.util

    return importlib.util.find_spec("pip") is not None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as f:  # O_NOFOLLOW: a symlink planted at the lock file is never opened
        fcntl.flock(f, fcntl.LOCK_EX)  # another process setting up the same environment: wait for it
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path, what: str, **kw: Any) -> None:
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=SETUP_TIMEOUT_S,
                                  **kw)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"{what} took over {SETUP_TIMEOUT_S} s (a stalled mirror or index?)",
                                 f"the log is {log}; run again, or set {MIRROR_VAR} to another Debian mirror") from None
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        mirror = os.environ.get(MIRROR_VAR, DEFAULT_MIRROR)
        raise EmulationError(f"{what} failed (exit {done.returncode}): " + " | ".join(tail),
                             f"the whole log is {log}; check that this machine reaches {mirror} and PyPI, then run "
                             "again")


def _make_rootfs(p: PlatformRule, e: Emulator, say: Callable[[str], None]) -> None:
    dest = _rootfs(p)
    if (dest / ".ready").is_file():
        return
    mirror = os.environ.get(MIRROR_VAR, DEFAULT_MIRROR)
    say(f"setting up the emulated {p.name} userland: debootstrap {SUITE} {e.debian_arch} (first time only; "
        f"{USERLAND_SIZE})")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    log = dest.parent / f"{dest.name}.log"
    log.unlink(missing_ok=True)
    try:
        fake = [] if os.geteuid() == 0 else ["fakeroot"]
        # --foreign: download and unpack the base without running any arm64 program (second stage skipped: the
        # loader needs python3's files, not a configured system); --include's packages are only downloaded
        _run([*fake, "debootstrap", f"--arch={e.debian_arch}", "--variant=minbase", "--foreign",
              "--include=python3,libstdc++6", SUITE, str(tmp / "root"), mirror], log, "debootstrap")
        archives = sorted((tmp / "root" / "var" / "cache" / "apt" / "archives").glob("*.deb"))
        for deb in archives:
            _run(["dpkg-deb", "-x", str(deb), str(tmp / "root")], log, f"unpacking {deb.name}")
            deb.unlink()
        # qemu-user 7.2 shows the guest the host's x86 /proc/cpuinfo, on which ORT's cpuinfo crashes at import:
        # qemu looks a path up under -L first, so the userland carries the emulated CPU's own
        (tmp / "root" / "proc").mkdir(exist_ok=True)
        (tmp / "root" / "proc" / "cpuinfo").write_text(_cpuinfo(e))
        (tmp / "root" / ".ready").write_text(json.dumps({"suite": SUITE, "mirror": mirror, "debs": len(archives)}))
        if dest.exists():
            shutil.rmtree(dest)
        (tmp / "root").rename(dest)
        for old in dest.parent.glob(f"{p.name}-{SUITE}-rootfs*"):  # earlier layouts' userlands
            if old != dest and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _python_version(p: PlatformRule) -> str:
    found = sorted(x.name for x in (_rootfs(p) / "usr" / "bin").glob("python3.*") if x.name[8:].isdigit())
    if not found:
        raise EmulationError(f"no python3 in the emulated userland {_rootfs(p)}", "delete it and run again")
    return found[-1].removeprefix("python")


def _make_site(p: PlatformRule, e: Emulator, requirements: Sequence[str], say: Callable[[str], None]) -> None:
    dest = _site(p, requirements)
    if (dest / ".ready").is_file():
        return
    version = _python_version(p)
    say(f"installing {', '.join(requirements)} for {p.name} (Python {version}) into the emulated environment "
        f"({WHEELS_SIZE})")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    log = dest.parent / f"{dest.name}.log"
    log.unlink(missing_ok=True)
    try:
        site = tmp / "site"
        if shutil.which("uv"):
            cmd = ["uv", "pip", "install", "--quiet", "--python-platform", e.wheel, "--python-version", version,
                   "--only-binary", ":all:", "--target", str(site), *requirements]
        else:
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--platform", e.pip_platform, "--python-version",
                   version, "--implementation", "cp", "--only-binary=:all:", "--target", str(site), *requirements]
        _run(cmd, log, f"installing the {p.name} wheels")
        (site / ".ready").write_text(json.dumps({"requirements": sorted(requirements), "python": version}))
        if dest.exists():
            shutil.rmtree(dest)
        site.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure(name: str, requirements: Sequence[str], say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Set up (once; then reused) the emulated environment of platform `name` holding `requirements`; what it is."""
    p = platform_rule(name)
    why = unavailable(name, requirements)
    if p.emulator is None or why:
        raise EmulationError(why)
    e = p.emulator
    began = time.monotonic()
    with _locked(cache_root() / ".lock"):
        _make_rootfs(p, e, say)
        _make_site(p, e, requirements, say)
    return {"platform": name, "emulator": f"{e.qemu} -cpu {e.cpu}", "userland": f"Debian {SUITE} {e.debian_arch}",
            "python": _python_version(p), "requirements": sorted(requirements),
            "setup_s": round(time.monotonic() - began, 1)}


# Runs under emulation, with the emulated Python: opens the artifact through its generated loader and runs the
# feeds in <work>/in_N.npz into <work>/out_N.npz; a loader's refusal goes to <work>/error.json with its code.
_RUNNER = r'''
import importlib.util, json, platform, sys
if sys.argv[1]:  # the emulated userland's wheels (an x86-64 level: this environment's own site-packages)
    sys.path.insert(0, sys.argv[1])
import numpy as np
loader, folder, work = sys.argv[2:5]
spec = importlib.util.spec_from_file_location("_ortbuild_loader", loader)
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
sys.dont_write_bytecode = True
spec.loader.exec_module(mod)
key = sys.stdin.buffer.read() or None
import onnxruntime
info = {"machine": platform.machine(), "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers()}
try:
    model = mod.load(key=key, folder=folder)
    for i in range(int(sys.argv[5])):
        with np.load(f"{work}/in_{i}.npz", allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
        out = model.run(feeds)
        np.savez(f"{work}/out_{i}.npz", **{k: (v.astype(str) if v.dtype == object else v) for k, v in out.items()})
except mod.LoaderError as e:
    info["error"] = {"code": e.code, "message": str(e)}
with open(f"{work}/info.json", "w") as f:
    json.dump(info, f)
'''


def _arm_command(p: PlatformRule, requirements: Sequence[str],
                 say: Callable[[str], None]) -> tuple[dict[str, Any], list[str], str]:
    """What it is, the command that runs the runner in the emulated userland (set up first where needed), and the
    site directory holding its wheels."""
    e = p.emulator
    assert e is not None
    env_info = ensure(p.name, requirements, say)
    return env_info, [e.qemu, "-cpu", e.cpu, "-L", str(_rootfs(p)), str(_rootfs(p) / "usr" / "bin" / "python3"),
                      "-I"], str(_site(p, requirements))


def _x86_command(p: PlatformRule, requirements: Sequence[str]) -> tuple[dict[str, Any], list[str], str]:
    """What it is, and the command that runs the runner with this environment's own Python and runtime under qemu's
    model of an x86-64 level's CPU (its CPUID says that level: ONNX Runtime picks that level's kernels); no site
    directory (the environment's own)."""
    why = unavailable(p.name, requirements)
    if why:
        raise EmulationError(why)
    level = machine.x86_level_named(p.x86_level or "")
    assert level.qemu_cpu is not None
    return ({"platform": p.name, "x86_level": p.name, "emulator": f"{X86_QEMU} -cpu {level.qemu_cpu}",
             "host_x86_level": host_level(), "python": platform.python_version(),
             "requirements": sorted(requirements), "setup_s": 0.0},
            [X86_QEMU, "-cpu", level.qemu_cpu + _TCG_LACKS, sys.executable, "-I"], "")


def _no_core() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def run(name: str, requirements: Sequence[str], loader: Path, folder: Path, key: bytes | None,
        feeds: Sequence[dict[str, Any]], where: str,
        say: Callable[[str], None] = lambda _: None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each feed's outputs from the artifact in `folder`, opened by its generated Python loader under emulation
    (set up first where needed: `say` tells each setup step), and what ran them. A loader's refusal raises the same
    ortbuild error as natively (errors.from_loader)."""
    import numpy as np

    p = platform_rule(name)
    env_info, prefix, site = (_x86_command(p, requirements) if p.x86_level is not None
                              else _arm_command(p, requirements, say))
    with tempfile.TemporaryDirectory(prefix="ortbuild-emulated-") as tmp:
        work = Path(tmp)
        (work / "runner.py").write_text(_RUNNER)
        for i, f in enumerate(feeds):
            objects = [k for k, v in f.items() if np.asarray(v).dtype == object]
            if objects:  # npz would pickle them; the runner reads no pickles
                raise EmulationError(f"{where}: input(s) {', '.join(objects)} are object arrays (strings), which the "
                                     f"emulated {name} golden test does not pass yet",
                                     "test this target on a runner of its platform (`ortbuild matrix`)")
            np.savez(work / f"in_{i}.npz", **f)
        cmd = [*prefix, str(work / "runner.py"), site, str(loader), str(folder), str(work), str(len(feeds))]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", "ORT_DISABLE_TELEMETRY": "1"}
        began = time.monotonic()
        try:
            # in the private work dir and with no core dump: qemu writes a crashed guest's memory (the decrypted
            # model, the key) as qemu_*.core into its working directory
            done = subprocess.run(cmd, input=key or b"", capture_output=True, env=env, timeout=TIMEOUT_S,
                                  check=False, cwd=work, preexec_fn=_no_core)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"{where}: the emulated {name} run took over {TIMEOUT_S} s") from None
        info_file = work / "info.json"
        if done.returncode != 0 or not info_file.is_file():
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-6:]
            raise EmulationError(f"{where}: the emulated {name} run failed (exit {done.returncode}): "
                                 + " | ".join(tail), f"reproduce: {' '.join(cmd)}")
        info: dict[str, Any] = json.loads(info_file.read_text())
        if "error" in info:
            raise from_loader(_Refusal(info["error"]["code"], info["error"]["message"]), where)
        outputs = []
        for i in range(len(feeds)):
            with np.load(work / f"out_{i}.npz", allow_pickle=False) as z:
                outputs.append({k: z[k] for k in z.files})
    info.update(env_info, run_s=round(time.monotonic() - began, 1))
    return outputs, info
