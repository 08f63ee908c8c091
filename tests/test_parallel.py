"""parallel: default -j is sized by every file of the biggest model, and says so when memory is what limits it;
small models build in the process."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ortbuild import machine
from ortbuild.cli import building
from ortbuild.pipeline.parallel import default_workers
from ortbuild.project import config, plan
from tests.bigmodels import mlp
from tests.test_build import TWO_TARGETS


def test_workers_are_sized_by_the_external_data_too_and_the_cli_says_why(
        make_project: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = mlp(tmp_path / "mlp", layers=2, width=64)
    path = make_project(TWO_TARGETS)
    path.write_text(path.read_text() + f'\n[models.mlp]\npath = "{src}"\ninputs = "{src.parent / "inputs.npz"}"\n')
    jobs = plan.jobs(config.load(path))
    assert len(jobs) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    n, why = default_workers(jobs)
    assert n == 1 and why == ""  # tiny models: built one after the other in this process, no worker started
    # the weights grow (sparse files: nothing is written; the graph file stays a few KB): to 64 MiB, one worker
    # per job (a 24 GiB machine has room for 4 x 0.8 GiB); to 64 GiB, one worker, and the CLI says why
    with open(src.parent / "model.onnx.data", "r+b") as f:
        f.truncate(64 << 20)
    monkeypatch.setattr(machine, "available_memory", lambda: 24 << 30)
    assert default_workers(jobs) == (4, "")
    with open(src.parent / "model.onnx.data", "r+b") as f:
        f.truncate(64 << 30)
    n, why = default_workers(jobs)
    assert n == 1
    assert "the largest model, mlp, is 64.00 GiB (all its files)" in why and "-j overrides" in why
    assert building.worker_count(None, jobs) == 1
    assert f"ortbuild: {why}" in capsys.readouterr().err
    assert building.worker_count(3, jobs) == 3  # -j is the user's word
