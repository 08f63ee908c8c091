"""docs/project.md, run as written: the wheel built from this checkout installed into a fresh venv in an empty
directory holding one real ONNX file, then `ortbuild init`, `nox -s test`, `nox -s release`, `ortbuild verify`,
each target in its own venv; and its table of environment variables, checked against the package's sources."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGE = REPO / "docs" / "project.md"
MODEL_PLACEHOLDER = "/path/to/paraphrase-MiniLM-L3-v2.onnx"
WHEEL_PLACEHOLDER = re.compile(r"/path/to/(ortbuild-[^ ]+\.whl)")
PAGE_LEVEL, PAGE_CPU = "x86-64-v4-vnni", "AMD EPYC"  # the CPU init ran on for the page
# what init measured: the page's figures are one run's; a run here is compared with them in this shape
MEASURED = re.compile(r"(int8 takes )[0-9.]+x( fp32's time \(median of )\d+( paired runs, 90% interval \[)[0-9.]+, "
                      r"[0-9.]+(\]; p50 )[0-9.]+ ms vs [0-9.]+ ms\)|(: about )\d+ s")


def _shape(text: str) -> str:
    """init's output with the figures it measured left out."""
    return MEASURED.sub(lambda m: "".join(g or "" for g in m.groups()) + "N", text)


def _block(kind: str, index: int = 0) -> str:
    blocks = re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)
    return str(blocks[index])


def test_every_environment_variable_ortbuild_reads_is_in_the_table() -> None:
    sources = [p for p in (REPO / "ortbuild").rglob("*") if p.suffix in (".py", ".j2")]
    read = set()
    for path in sources:
        read |= set(re.findall(r"ORTBUILD_[A-Z_]+[A-Z]", path.read_text()))
    read |= {"SOURCE_DATE_EPOCH"}
    table = PAGE.read_text().split("## Environment variables", 1)[1]
    listed = set(re.findall(r"`((?:ORTBUILD_|SOURCE_DATE)[A-Z_]+)`", table))
    assert read - listed == set(), "read by ortbuild but not in docs/project.md's table"
    everywhere = "".join(p.read_text() for p in [*sources, *(REPO / "tests").rglob("*.py"), REPO / ".ci" / "run"])
    assert {v for v in listed if v not in everywhere} == set(), "in the table but read nowhere"


def _wheel(out: Path) -> Path:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    cmd = [uv, "build", "--wheel", "-q", "-o", str(out), str(REPO)] if uv else \
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("ortbuild-*.whl")
    return wheel


@pytest.mark.e2e
def test_the_pages_commands_take_one_onnx_file_to_a_verified_release(tmp_path: Path) -> None:
    from tests.realmodels import minilm

    commands = [line[2:] for line in _block("console").splitlines() if line.startswith("$ ")]
    wheel = _wheel(tmp_path / "wheels")
    named = WHEEL_PLACEHOLDER.search(_block("console"))
    assert named is not None and named.group(1) == wheel.name, "docs/project.md names another wheel"
    script = ["set -euo pipefail"]
    for cmd in commands:
        cmd = cmd.replace(MODEL_PLACEHOLDER, str(minilm())).replace(named.group(0), str(wheel))
        script += [f"echo '### {cmd}'", cmd]
    # a new user's shell: no key, no config of ortbuild's test suite, not this checkout on the path
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ORTBUILD_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "CI")}
    here = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != here)
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    said = {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in proc.stdout.split("### ")[1:]}
    # what init printed is what the page shows, but for the CPU it names (this machine's, not the page's) and the
    # figures it measured
    from ortbuild import machine
    from ortbuild.project import speedup

    printed = said["ortbuild init"].replace(speedup.level(), PAGE_LEVEL).replace(f"({machine.cpu_model()})",
                                                                                f"({PAGE_CPU})")
    if "cpu-int8 keeps" not in printed:  # int8 measured no faster than fp32 here: the page shows a CPU where it is
        pytest.skip(f"int8 is not faster than fp32 on this CPU ({speedup.host()}): {printed[-800:]}")
    assert _shape(printed).strip() == _shape(_block("text")).strip()
    project = tmp_path / "encoder"
    # each target in its runtime's venv (the two hold the same one: .nox/target-<name> links to it), holding its
    # runtime and ortbuild from the wheel (not this checkout)
    for target in ("cpu-fp32", "cpu-int8"):
        python = project / ".nox" / f"target-{target}" / "bin" / "python"
        assert (project / ".nox" / f"target-{target}").resolve().name.startswith("runtime-")
        where = subprocess.run([str(python), "-c", "import onnxruntime, ortbuild; print(ortbuild.__file__)"],
                               capture_output=True, text=True, env=env, cwd=project, timeout=60)
        assert where.returncode == 0, where.stderr
        venv = python.parent.parent.resolve()
        assert Path(where.stdout.strip()).resolve().is_relative_to(venv) and str(REPO) not in where.stdout
        assert (project / "dist" / "release" / target / "SHA256SUMS.minisig").is_file()
    assert "2 PASS, 0 FAIL" in said["python -m nox -s test"]
    assert "released, verified" in said["python -m nox -s release"]
