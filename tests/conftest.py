"""Shared fixtures: the repository, the example models, and small throwaway projects."""

from __future__ import annotations

import base64
import fcntl
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from ortbuild.installed import installed_flavor
from tests import durations

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "models"


# Fixed test keys (never used outside the tests): every build and loader in the suite, subprocesses included.
TEST_KEY = bytes(range(32))
TEST_SIGNING_SEED = bytes(range(32, 64))
for _name in ("ORTBUILD_KEY_FILE", "ORTBUILD_SIGNING_KEY_FILE"):
    os.environ.pop(_name, None)
os.environ["ORTBUILD_KEY"] = base64.b64encode(TEST_KEY).decode()
os.environ["ORTBUILD_SIGNING_KEY"] = base64.b64encode(TEST_SIGNING_SEED).decode()
# The emulated platforms' golden gate (qemu-user) is slow to set up: off unless a test turns it on
# (tests/test_emulation.py); the example's linux-aarch64 target is then SKIPPED with that reason.
os.environ["ORTBUILD_EMULATION"] = "off"


# Tools some tests need beside Python: where one is missing, those tests are skipped with the command that installs
# it, or fail where the environment variable says it must be there (CI sets both: .ci/run).
CHROMIUM = ("chromium", "chromium-browser")
CHROMIUM_VAR = "ORTBUILD_REQUIRE_CHROMIUM"
CHROMIUM_INSTALL = "sudo apt-get install chromium (Debian; Ubuntu: sudo snap install chromium)"
NODE_VAR = "ORTBUILD_REQUIRE_NODE"
NODE_INSTALL = ("sudo apt-get install nodejs npm (Debian 13; elsewhere Node.js 20 LTS and npm from "
                "https://nodejs.org/en/download)")


def tool(*names: str, var: str, install: str) -> str:
    """The path of the first of `names` on PATH. Where none is: the calling test fails when the environment
    variable `var` is set (a machine that must run it), else it is skipped with the reason and `install`."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    missing = " or ".join(names)
    if os.environ.get(var):
        pytest.fail(f"{missing} is not installed and {var} is set (to install it: {install})")
    pytest.skip(f"{missing} is not installed (to run this test: {install})")


def node_tools() -> None:
    """Node.js and npm, or the calling test is skipped (fails with ORTBUILD_REQUIRE_NODE) saying how to get them."""
    tool("node", var=NODE_VAR, install=NODE_INSTALL)
    tool("npm", var=NODE_VAR, install=NODE_INSTALL)


def npm_install(app: Path, package: str, installed: Path, env: dict[str, str] | None = None) -> Path:
    """`app`, a folder with `package` (name@version) installed from the npm registry unless `installed` exists
    already; one test process installs it at a time (pytest-xdist workers share the folder)."""
    node_tools()
    app.mkdir(parents=True, exist_ok=True)
    with open(app / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed.exists():
            (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", package], cwd=app, env=env, check=True,
                           capture_output=True, timeout=600)
    return app


def here_runtime() -> str:
    """The pip requirement of the ORT flavor installed in this venv (so test targets are buildable here)."""
    flavor = installed_flavor()
    assert flavor is not None, "the test venv must hold one ONNX Runtime flavor"
    return f"{flavor.distribution}=={flavor.version}"


def model_table(name: str, calibration: bool = False) -> str:
    lines = [f"[models.{name}]", f'path = "{MODELS / name}.onnx"', f'inputs = "{MODELS / name}.inputs.npz"']
    if calibration:
        lines.append(f'calibration = "{MODELS / name}.calib.npz"')
    return "\n".join(lines) + "\n"


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """Write a targets.toml into tmp_path: example models by name, then target tables as TOML text."""

    def make(targets: str, models: tuple[str, ...] = ("tiny_cnn",), calibration: bool = False) -> Path:
        text = '[project]\nname = "t"\nversion = "1"\n\n'
        text += "\n".join(model_table(m, calibration) for m in models)
        text += "\n" + textwrap.dedent(targets).replace("RUNTIME", here_runtime())
        path = tmp_path / "targets.toml"
        path.write_text(text)
        return path

    return make


def run_cli(*args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ortbuild ARGS` in this process (cli.main), as `python -m ortbuild` would run it: in `cwd`, with `env` as the
    whole environment where given, its standard output and error (its child processes' too) captured at the file
    descriptors, an exception that escapes main() printed with its traceback and exit status 1. The environment,
    working directory, argv and core-file limit are restored afterwards. What only a process shows (the exit status
    of `python -m ortbuild`, signals, the hard core limit) is run_process's."""
    from ortbuild import cli

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_core = resource.getrlimit(resource.RLIMIT_CORE)
    streams = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for s in streams:
            s.flush()
        fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(n, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True) for n in (1, 2))
        try:
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            os.chdir(cwd)
            sys.argv = ["ortbuild", *args]
            try:
                code = cli.main(list(args))
            except SystemExit as e:  # argparse: usage errors (2), --help and --version (0)
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except BaseException:  # as the interpreter would report it
                traceback.print_exc()
                code = 1
        finally:
            for s in (sys.stdout, sys.stderr):
                s.flush()
            sys.stdout, sys.stderr = streams
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
            os.environ.clear()
            os.environ.update(saved_env)
            os.chdir(saved_cwd)
            sys.argv = saved_argv
            resource.setrlimit(resource.RLIMIT_CORE, saved_core)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace"))
    return subprocess.CompletedProcess(["ortbuild", *args], code, texts[0], texts[1])


def run_process(*args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None) \
        -> subprocess.CompletedProcess[str]:
    """`python -m ortbuild ARGS` as its own process (run_cli runs it in this one)."""
    return subprocess.run([sys.executable, "-m", "ortbuild", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """A directory `make(dir)` fills once per test run, by whichever pytest-xdist worker asks first (the others
    wait for it; a directory a failed `make` left is made again), copied for the caller: a module's tests may
    change their copy. Modules that build the same project share one build this way."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    made, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(made, ignore_errors=True)
            made.mkdir()
            make(made)
            done.touch()
    copy = tmp_path_factory.mktemp(name) / name
    shutil.copytree(made, copy, symlinks=True)
    return copy


@pytest.fixture
def absent_provider_project(make_project: Callable[..., Path]) -> Path:
    """A target whose provider the runtime does not ship here: CoreML in the Linux onnxruntime wheel."""
    flavor = installed_flavor()
    if flavor is None or flavor.distribution != "onnxruntime":
        pytest.skip("needs the onnxruntime flavor (its CoreML provider is absent on Linux)")
    return make_project("""
        [targets.mac]
        runtime = "RUNTIME"
        providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
    """)


@pytest.fixture(scope="session")
def llm() -> Path:
    """The example generative model (Hugging Face format, models/generate_llm.py: about 2.5 minutes on 2 cores),
    made once into the tests' cache (tests/genmodels.py; never committed)."""
    pytest.importorskip("torch")
    from tests.genmodels import example_llm

    return example_llm()


# The `runtime` mark says a test's outcome depends on the installed ONNX Runtime flavor: `nox -s tests-openvino`
# runs those tests (and only those) again inside the OpenVINO flavor. Checked on every run: a marked test that
# opened no ONNX Runtime session, asked it (or ortbuild's probe) for no provider and started no process (which may:
# a loader, `python -m ortbuild`), neither in its body nor in a fixture it uses (a module's build), fails, saying so.
_TOUCHES = [0]               # sessions opened, provider lists asked and processes started in this process so far
_TOUCHING: set[int] = set()  # the fixture definitions whose setup did either


def _counted(owner: object, name: str) -> None:
    real = getattr(owner, name)

    def counting(*args: object, **kwargs: object) -> object:
        _TOUCHES[0] += 1
        return real(*args, **kwargs)

    setattr(owner, name, counting)


def pytest_configure(config: pytest.Config) -> None:
    import onnxruntime

    from ortbuild import runtime

    for owner, name in ((onnxruntime.InferenceSession, "__init__"), (onnxruntime, "get_available_providers"),
                        (runtime, "probe_provider"), (subprocess.Popen, "__init__")):
        _counted(owner, name)


# the marks of the sessions that run one parallel pass and no serial pass (noxfile.py: `serial=False`)
NO_SERIAL_PASS = ("runtime", "e2e", "slow", "generative")


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected: a file weighs what runs of it
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only `tests` has a serial pass (noxfile.py): tests-openvino (`runtime`), e2e (`e2e`, `slow`) and
    tests-generative (`generative`) run one parallel pass, which leaves `serial` tests out, so a `serial` test with
    one of their marks would never run there: it is refused. Then the heaviest files first (tests/durations.py)."""
    both = [f"{i.nodeid} ({m})" for i in items if i.get_closest_marker("serial")
            for m in NO_SERIAL_PASS if i.get_closest_marker(m)]
    if both:
        raise pytest.UsageError(f"marked `serial` and a mark whose session has no serial pass: {both}; a test "
                                "that needs the machine to itself goes in the default session")
    order = durations.heaviest_first([i.nodeid for i in items], durations.load())
    items[:] = [items[i] for i in order]


_MEASURED: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(durations.WRITE_VAR):
        _MEASURED[report.nodeid] = _MEASURED.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """`ORTBUILD_DURATIONS_WRITE=1`: this run's durations into tests/durations.json (by pytest-xdist's controller,
    which gets every worker's reports)."""
    if os.environ.get(durations.WRITE_VAR) and _MEASURED and not hasattr(session.config, "workerinput"):
        durations.write(_MEASURED)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> object:
    before = _TOUCHES[0]
    try:
        return (yield)
    finally:
        if _TOUCHES[0] > before:
            _TOUCHING.add(id(fixturedef))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    before = _TOUCHES[0]
    result = yield
    mark = item.get_closest_marker("runtime")
    defs = item._fixtureinfo.name2fixturedefs.values() if mark and isinstance(item, pytest.Function) else ()
    if mark and _TOUCHES[0] == before and not any(id(d) in _TOUCHING for ds in defs for d in ds):
        pytest.fail(f"{item.nodeid} is marked `runtime` but opened no ONNX Runtime session, asked it for no "
                    "provider and started no process (nor did a fixture it uses): its outcome cannot depend on the "
                    "flavor; remove the mark", pytrace=False)
    return result
