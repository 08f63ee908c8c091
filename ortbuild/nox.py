"""ortbuild's nox sessions: build, test, profile and release, one of each per target of targets.toml, each in
the virtualenv of its ONNX Runtime flavor. A project's noxfile.py imports them:

    from ortbuild.nox import build, profile, release, test, tune  # noqa: F401  (registers one session per target)

    nox -s build / test / profile / release   every target: build what is missing or stale, the release gates,
                                  ORT traces; sign, publish and verify
    nox -s "build(cpu-int8)"      one target;  nox -t openvino / nox -k int8 select by tag or keyword
    nox -s tune -- -t cpu-int8    tune a target's session options (`ortbuild tune`; one session, no tags)

The configuration is `targets.toml` in the noxfile's directory (nox runs there), or $ORTBUILD_CONFIG. A target's
sessions run in one virtualenv per distinct set of requirements, .nox/<kind>-<digest> (.nox/target-<name> links
to it), holding the target's runtime and the same ortbuild as nox's own (ortbuild_requirement: a source checkout,
editable; the wheel or sdist it was installed from; else ortbuild==<version>; $ORTBUILD_REQUIREMENT overrides it).
Where a target's GPU/accelerator is absent (no NVIDIA driver or device; no Intel CPU, GPU or NPU for OpenVINO),
that virtualenv holds the CPU flavor of the same ONNX Runtime version instead of the hardware wheel: the target's
portable artifacts are built with it and its tests are SKIPPED with the reason. `-- --require`, `require = true` or
ORTBUILD_INSTALL_RUNTIMES=all install the target's own runtime anyway.

Imports stdlib, packaging, nox and ortbuild's stdlib-only modules: nox's interpreter needs nothing else.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import nox
import nox.virtualenv
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ortbuild import installed, machine
from ortbuild.artifact import manifest, manifest_types
from ortbuild.errors import ConfigError, UsageError
from ortbuild.gating.record import TestResult
from ortbuild.project import config
from ortbuild.project.kinds import kind_rule
from ortbuild.status import ProfileStatus, Verdict

__all__ = ["build", "profile", "release", "test"]

# nox's defaults changed here, unless a noxfile changed them before importing this module (after it, theirs win
# anyway): nox's own defaults are virtualenv, no default session list, reuse "no".
if nox.options.default_venv_backend in (None, "virtualenv"):
    nox.options.default_venv_backend = "uv|virtualenv"
if nox.options.sessions is None:
    nox.options.sessions = ["test"]
nox.options.error_on_missing_interpreters = True
# Venvs are kept between runs; a target's venv is reinstalled only when what it should hold changed (a stamp
# file records it), so a no-op `nox -s build` costs the builds' own no-op time. `--reuse-venv=no` recreates them.
if nox.options.reuse_venv in (None, "no"):
    nox.options.reuse_venv = "yes"

CONFIG_VAR = "ORTBUILD_CONFIG"
REQUIREMENT_VAR = installed.REQUIREMENT_VAR
CONFIG = os.environ.get(CONFIG_VAR, config.DEFAULT_FILE)
ROOT = Path.cwd()  # nox runs in the noxfile's directory

PROJECT: config.Project | None
CONFIG_ERROR = ""
try:
    PROJECT = config.load(ROOT / CONFIG, check_files=False)
except ConfigError as err:  # a broken targets.toml must not hide the project's other sessions
    print(err.render(), file=sys.stderr)
    PROJECT, CONFIG_ERROR = None, err.render()

TARGETS = list(PROJECT.targets.values()) if PROJECT else []
# One parameter per target; with a broken targets.toml, one that fails (`nox -s test` must not pass, skipped for
# want of parameters, with nothing built): build(invalid-config), test(invalid-config), ...
PARAMS = [nox.param(t.name, id=t.name, tags=t.tags) for t in TARGETS if not kind_rule(t.kind).session_suffix] \
    or [nox.param("", id="invalid-config")]
# Generative targets (decoder LLMs, built by onnxruntime-genai's model builder, whose venv holds torch: a big
# download) have their own sessions (KindRule.session_suffix), tagged `generative` (its tag), out of `nox -s
# build/test/release`: `nox -t generative`.
GENERATIVE = [nox.param(t.name, id=t.name, tags=[x for x in t.tags if x != kind_rule(t.kind).tag])
              for t in TARGETS if kind_rule(t.kind).session_suffix]
# Where `nox -s build` keeps a development key pair when no key is configured (git-ignored by `ortbuild init`).
DEV_KEYS = ROOT / ".ortbuild" / "dev-keys"
KEY_VARS = ("ORTBUILD_KEY", "ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY", "ORTBUILD_SIGNING_KEY_FILE")
RUNTIME_FLAVORS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                   "onnxruntime-qnn", "onnxruntime-rocm")


def _uv() -> str | None:  # uv, where nox was installed with it (`nox[uv]`)
    uv = getattr(nox.virtualenv, "UV", "uv")
    return uv if getattr(nox.virtualenv, "HAS_UV", False) else None


def target_venv(session: nox.Session, target: str, *, link: bool = False) -> Path:
    """The virtualenv a target's sessions run in: one per distinct set of requirements, `.nox/<kind>-<digest>`
    (six of the example's targets hold onnxruntime alone; the generative ones share one 1.3 GB of torch). `link`:
    `.nox/target-<name>`, which the target's own sessions point at it (so it says one of them ran here)."""
    envdir = str(getattr(session._runner.global_config, "envdir", ROOT / ".nox"))
    t = PROJECT.targets.get(target) if PROJECT is not None else None
    name = f"target-{target}"
    if t is not None and not link:
        digest = hashlib.sha256(" ".join(_requirements(session, t)[0]).encode()).hexdigest()[:12]
        name = f"{kind_rule(t.kind).venv}-{digest}"
    return Path(nox.sessions._normalize_path(envdir, name))


def _link(link: Path, venv: Path) -> None:
    """Point `link` at `venv` (a sibling), in place of a link elsewhere or of an earlier ortbuild's own venv."""
    if not link.is_symlink() and (link / ".ortbuild-installed").exists():
        shutil.rmtree(link)  # a per-target venv of an earlier ortbuild: its requirements live in `venv` now
    if not link.exists() or (link.is_symlink() and os.readlink(link) != venv.name):
        partial = link.with_name(link.name + ".partial")
        partial.unlink(missing_ok=True)
        partial.symlink_to(venv.name)
        partial.replace(link)


def _requirements(session: nox.Session, t: config.Target) -> tuple[tuple[str, ...], machine.StandIn | None]:
    """What the target's venv holds: its requirements, or where its hardware is absent (and it is not required
    here) the CPU stand-in's, and that stand-in (None: its own)."""
    required = t.require or "--require" in session.posargs
    standin = machine.stand_in(t.requirements)
    if standin is not None and not required and os.environ.get(INSTALL_VAR, "") != "all":
        return standin.requirements, standin
    return tuple(t.requirements), None


def _install_target(session: nox.Session, venv: Path, requirements: tuple[str, ...]) -> None:
    """Make `venv` hold ortbuild and exactly `requirements` (one ONNX Runtime flavor: a changed flavor first
    removes the others); nothing is installed when a stamp file says it already does."""
    try:
        tool, identity = installed.ortbuild_requirement()
    except UsageError as err:
        session.error(err.render())
    want = json.dumps({"requirements": requirements, "ortbuild": identity})
    stamp = venv / ".ortbuild-installed"
    if stamp.exists() and stamp.read_text() == want:
        return
    stamp.unlink(missing_ok=True)
    python = str(venv / "bin" / "python")
    # uv never sees the CPU torch wheel pip finds (it would fetch PyPI's multi-GB CUDA build): pip for torch
    uv = None if any(canonicalize_name(Requirement(r).name) == "torch" for r in requirements) else _uv()
    if not Path(python).exists():
        if uv:
            session.run(uv, "venv", "--quiet", "--python", sys.executable, str(venv), external=True, silent=True)
        else:
            session.run(sys.executable, "-m", "venv", str(venv), external=True, silent=True)
    wanted = {canonicalize_name(Requirement(r).name) for r in requirements}
    others = [f for f in RUNTIME_FLAVORS if f not in wanted]
    pip = [uv, "pip"] if uv else [python, "-m", "pip"]
    where = ["--python", python] if uv else []
    session.run(*pip, "uninstall", *where, *([] if uv else ["-y"]), *others, external=True, silent=True,
                success_codes=[0, 1, 2])
    session.log(f"installing into {venv}: {' '.join(requirements)}")
    session.run(*pip, "install", *where, *([] if uv else ["--quiet"]), *requirements, external=True, silent=True)
    session.log(f"installing ortbuild into {venv} from {tool[-1]}")
    try:  # ortbuild itself must install: never a skip (a green run with nothing built)
        session.run(*pip, "install", *where, *([] if uv else ["--quiet"]), *tool, external=True, silent=True)
    except nox.command.CommandFailed:
        session.error(f"ortbuild could not be installed into {venv} from '{' '.join(tool)}' (see pip's output "
                      f"above): set {REQUIREMENT_VAR} to the ortbuild wheel, sdist or requirement to install")
    stamp.write_text(want)


def keys_env(session: nox.Session, venv: Path) -> dict[str, str]:
    """The configured keys, or a local DEVELOPMENT key pair (made once, marked as such in every manifest): so that
    a fresh clone builds with two commands, never to protect anything (releases set their own keys)."""
    if any(os.environ.get(v) for v in KEY_VARS):
        return {}
    if not (DEV_KEYS / "encryption.key").exists():
        _ortbuild(session, venv, "keygen", "--dev", "--out", str(DEV_KEYS), silent=True)
    session.log(f"no key configured: using the DEVELOPMENT keys in {DEV_KEYS} (not for a release)")
    return {"ORTBUILD_KEY_FILE": str(DEV_KEYS / "encryption.key"),
            "ORTBUILD_SIGNING_KEY_FILE": str(DEV_KEYS / "signing.key")}


INSTALL_VAR = "ORTBUILD_INSTALL_RUNTIMES"  # "all": every target's own runtime, even where its hardware is absent


def _target_env(session: nox.Session, target: str, *, required_fails: bool = False) -> tuple[config.Target, Path]:
    """(the target, its venv), holding ortbuild and the target's runtime or CPU stand-in (the module's docstring).
    Skip (or, when asked and the target is required, fail) where that runtime cannot be installed."""
    if PROJECT is None:
        session.error(f"{CONFIG} is invalid: {CONFIG_ERROR}")
    t = PROJECT.targets[target]
    venv = target_venv(session, target)
    session.env.pop(installed.STAND_IN_VAR, None)
    required = t.require or "--require" in session.posargs
    requirements, standin = _requirements(session, t)
    if standin is not None:
        session.env[installed.STAND_IN_VAR] = "1"
        session.log(f"{target}: {standin.reason}: its venv gets {' '.join(standin.requirements)} in place of "
                    f"{' '.join(standin.left_out)}, to build its portable artifacts (`-- --require` or "
                    f"{INSTALL_VAR}=all installs them)")
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    try:
        _install_target(session, venv, requirements)
    except nox.command.CommandFailed:
        if required_fails and required:
            session.error(f"{target}: its runtime '{t.runtime_text}' cannot be installed, and the target is required")
        session.skip(f"{target}: its runtime '{t.runtime_text}' cannot be installed on this machine")
    _link(target_venv(session, target, link=True), venv)
    return t, venv


def target_python(session: nox.Session, target: str) -> Path:
    """The python of a target's virtualenv, as its sessions make it: a project's noxfile runs its own model
    generators there (a generative target's venv holds torch and transformers)."""
    _, venv = _target_env(session, target)
    return venv / "bin" / "python"


def _ortbuild(session: nox.Session, venv: Path, *args: str, env: dict[str, str] | None = None,
              silent: bool = False) -> None:  # `env`: added to the environment; `silent`: output shown on failure
    session.run(str(venv / "bin" / "ortbuild"), *args, external=True, env=env, silent=silent)


_SUMMARIES: list[str] = []  # what the sessions of this nox run ask to summarise at its end
_RELEASES: list[list[str]] = []  # the release sessions' rows: target, bundle, where, what happened


def _print_summaries() -> None:
    from ortbuild.gating.reports import summary

    sys.stdout.flush()
    for what in _SUMMARIES:
        assert PROJECT is not None
        if what == "release":
            rows = summary.table(_RELEASES, ["target", "bundle", "where", "result"])
            print(f"\nrelease summary, every target:\n{rows}")
        else:
            summary.print_summary(what, PROJECT.file)
    sys.stdout.flush()


def _summary(session: nox.Session, what: str) -> None:
    """One table of every target's results at the very end of `nox -s build/test/release`, read from dist/ when
    nox exits (release: what its sessions recorded), in nox's interpreter (summary is stdlib + packaging only)."""
    if PROJECT is not None and what not in _SUMMARIES:
        _SUMMARIES.append(what)
        if len(_SUMMARIES) == 1:
            atexit.register(_print_summaries)


@nox.session(venv_backend="none")
@nox.parametrize("target", PARAMS)
def build(session: nox.Session, target: str) -> None:
    """Build one target's artifacts in the target's virtualenv, which holds its ONNX Runtime flavor."""
    _build(session, target)


def _build(session: nox.Session, target: str) -> None:
    _summary(session, "build")
    t, venv = _target_env(session, target)
    assert PROJECT is not None
    _ortbuild(session, venv, "build", "-c", str(PROJECT.file), "-t", target, "--no-summary", *session.posargs,
              env=keys_env(session, venv))
    dist = PROJECT.root / "dist" / target
    docs = [manifest.read(dist / m)[0] for m in t.models if (dist / m / manifest_types.MANIFEST).exists()]
    if docs and all(d.portable_only for d in docs):
        reasons = sorted({r for d in docs for r in d.missing_providers.values()})
        session.skip(f"{target} cannot run here ({'; '.join(reasons)}); only its portable artifacts were "
                     f"built (precision + basic level), see {dist}")


def _skipped_here(t: config.Target, gates: bool = False) -> str | None:
    """The reason, when the last `ortbuild test` of every model of `t` was SKIPPED (it cannot run here); with
    `gates`, also when it skipped some of their gates (an emulated platform's timing: `ortbuild release` refuses
    those)."""
    assert PROJECT is not None
    dist = PROJECT.root / "dist" / t.name
    reports = [TestResult.from_json(json.loads(f.read_text())["result"]) for m in t.models
               if (f := dist / m / "test-report.json").exists()]
    if reports and all(r.status == Verdict.SKIPPED for r in reports):
        return reports[0].reason
    if gates and reports and all(Verdict.SKIPPED in r.gates().values() for r in reports):
        return f"gates SKIPPED here: {reports[0].reason}"
    return None


@nox.session(venv_backend="none")
@nox.parametrize("target", PARAMS)
def test(session: nox.Session, target: str) -> None:
    """Build (if missing or stale) and test one target's artifacts in its virtualenv: golden outputs, latency and
    size budgets, into dist/<target>/<model>/test-report.json and dist/report.{json,html}."""
    _test(session, target)


def _test(session: nox.Session, target: str) -> None:
    _summary(session, "test")
    t, venv = _target_env(session, target, required_fails=True)
    assert PROJECT is not None
    _ortbuild(session, venv, "test", "-c", str(PROJECT.file), "-t", target, "--no-summary", *session.posargs,
              env=keys_env(session, venv))
    skipped = _skipped_here(t)
    if skipped:
        session.skip(f"{target} cannot run here: {skipped}")


@nox.session(venv_backend="none")
@nox.parametrize("target", PARAMS)
def profile(session: nox.Session, target: str) -> None:
    """Build (if missing or stale) and profile one target's artifacts through their loader, in its virtualenv:
    dist/<target>/<model>/profile.trace.json (ORT's trace) and profile.json (the top operators)."""
    t, venv = _target_env(session, target)
    assert PROJECT is not None
    _ortbuild(session, venv, "profile", "-c", str(PROJECT.file), "-t", target, *session.posargs,
              env=keys_env(session, venv))
    dist = PROJECT.root / "dist" / target
    docs = {m: json.loads(f.read_text()) for m in t.models if (f := dist / m / "profile.json").exists()}
    if docs and all(d.get("status") == ProfileStatus.SKIPPED for d in docs.values()):
        session.skip(f"{target} cannot run here: {next(iter(docs.values()))['reason']}")
    missing = [m for m in t.models if docs.get(m, {}).get("status") != ProfileStatus.SKIPPED
               and not (dist / m / "profile.trace.json").exists()]
    if missing:
        session.error(f"{target}: no trace was written for {', '.join(missing)}")


@nox.session(venv_backend="none")
def tune(session: nox.Session) -> None:
    """Tune the session options of the targets named by `-t` (all without) in their virtualenvs (`nox -s tune -- -t
    cpu-int8 --tune-seconds 30`); what it keeps goes to targets.lock (docs/build-to-the-gates.md). One session, no
    tags: a tag or keyword selection (`nox -t openvino`) never tunes, so never rebuilds what it just tested."""
    assert PROJECT is not None
    args = list(session.posargs)
    named = {i + 1 for i, a in enumerate(args[:-1]) if a in ("-t", "--target")}  # the words after -t
    patterns = [args[i] for i in sorted(named)]
    rest = [a for i, a in enumerate(args) if a not in ("-t", "--target") and i not in named]
    names = [t.name for t in TARGETS if kind_rule(t.kind).not_covered is None]  # e.g. not onnxruntime-genai's
    chosen = config.matches(names, patterns) if patterns else names
    if not chosen:
        session.error(f"no target matches {', '.join(patterns)} (targets: {', '.join(names)})")
    for target in chosen:
        _, venv = _target_env(session, target)
        _ortbuild(session, venv, "tune", "-c", str(PROJECT.file), "-t", target, *rest, env=keys_env(session, venv))


@nox.session(venv_backend="none")
@nox.parametrize("target", PARAMS)
def release(session: nox.Session, target: str) -> None:
    """Bundle, sign, publish and verify one tested target, with the ortbuild and runtime of the target's
    virtualenv (release what was tested, as it was tested). Arguments go to `ortbuild release`, e.g.
    `nox -s "release(cpu-fp32)" -- --to oci://localhost:5000/models`. Default: dist/release/<target>/."""
    _release(session, target)


def _release(session: nox.Session, target: str) -> None:
    if PROJECT is None:
        session.error(f"{CONFIG} is invalid: {CONFIG_ERROR}")
    _summary(session, "release")
    venv = target_venv(session, target, link=True)
    ortbuild = venv / "bin" / "ortbuild"
    if not ortbuild.exists():
        _RELEASES.append([target, "-", "-", "FAILED: not tested here"])
        test = PROJECT.targets[target].session("test")
        session.error(f"{target} was not tested here: run `python3 -m nox -s \"{test}\"` first")
    skipped = _skipped_here(PROJECT.targets[target], gates=True)
    if skipped and not PROJECT.targets[target].require:
        _RELEASES.append([target, "-", "-", "SKIPPED: cannot run here"])
        session.skip(f"{target} cannot run here ({skipped}): nothing fully tested to release")
    env = keys_env(session, venv)
    # this session's own DEVELOPMENT keys (no key configured): a local release, marked as such; configured keys
    # never get the flag, so a release built with development keys by mistake is refused
    dev = ["--allow-development-key"] if env.get("ORTBUILD_SIGNING_KEY_FILE") == str(DEV_KEYS / "signing.key") \
        else []
    out = session.run(str(ortbuild), "release", "-c", str(PROJECT.file), "-t", target, "--json", *dev,
                      *session.posargs, env=env, external=True, silent=True, success_codes=range(256))
    text = str(out)
    try:  # the JSON document on stdout (stderr lines, e.g. a lock wait, may come first)
        done = json.JSONDecoder().raw_decode(text[text.index("{\n"):])[0]
    except ValueError:
        session.error(f"ortbuild release failed:\n{out}")
    for why in done["refused"]:
        session.log(why)
    for warning in done.get("warnings", []) if done["released"] else []:  # about what was released
        session.warn(warning)
    if done["exit_code"]:
        _RELEASES.append([target, "-", "-", f"FAILED: exit {done['exit_code']}, {len(done['refused'])} refused"])
        session.error(f"ortbuild release -t {target} failed (exit {done['exit_code']})")
    for r in done["released"]:
        where = r.get("pushed", r["dir"])
        session.log(f"released {r['bundle']}" + (f", pushed {r['pushed']}" if "pushed" in r else ""))
        _RELEASES.append([target, Path(r["bundle"]).name, where, "FAILED: verify"])
        session.run(str(ortbuild), "verify", where, env=env, external=True, silent=True)
        _RELEASES[-1][-1] = "released, verified"
        session.log(f"verified {where}")


def _generative(kind: str, run: Callable[[nox.Session, str], None], doc: str) -> None:
    """Register `<kind>-generative(<target>)`, one per generative target, tagged `generative` (its KindRule's)."""
    def session(session: nox.Session, target: str) -> None:
        run(session, target)
    session.__doc__ = doc
    rule = kind_rule("generative")
    nox.session(name=f"{kind}{rule.session_suffix}", venv_backend="none", tags=[t for t in (rule.tag,) if t])(
        nox.parametrize("target", GENERATIVE)(session))


if GENERATIVE:  # only where targets.toml has generative targets
    _generative("build", _build, "Build one generative target (onnxruntime-genai's model builder, venv with torch).")
    _generative("test", _test, "Build (if missing or stale) and test one generative target: tokens, generation, size.")
    _generative("release", _release, "Bundle, sign, publish and verify one tested generative target.")
