"""The scale benchmark's code path on a small external-data model: build in every precision, test, release,
verify and both loaders against plain ORT, each in a fresh process (CI runs it; the 0.5 and 2.5 GiB runs are
`nox -s scale`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_a_small_external_data_model_goes_through_every_step(tmp_path: Path) -> None:
    out, private = tmp_path / "scale.json", tmp_path / "private"
    private.mkdir()
    # the builds' private dirs in a directory of this test's own ($ORTBUILD_TMPDIR): its count of dirs left behind
    # sees no other test's (and no other test's command sweeps this one's), so it runs beside the others
    proc = subprocess.run([sys.executable, "tests/benchmarks/bench_scale.py", "--gib", "0.02", "--reps", "1",
                           "--precisions", "fp32,int8-dynamic,int4-weight,fp16", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "ORTBUILD_TMPDIR": str(private)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    precisions = ("fp32", "int8-dynamic", "int4-weight", "fp16")
    assert set(result["steps"]) == {*(f"build {p}" for p in precisions), *(f"test {p}" for p in precisions),
                                    "release (every target, gates passed)", *(f"verify {p}" for p in precisions),
                                    *(f"verify {p} --no-run" for p in precisions)}
    for p in precisions:  # the release ran without --force, so it needed every gate to pass
        assert result["steps"][f"test {p}"]["verdict"].startswith("PASS"), result["steps"][f"test {p}"]
    for step in result["steps"].values():
        assert step["seconds"] > 0 and step["rss"] > 0
    # the private dir was seen (and measured) during the builds
    assert max(v.get("temp", 0) for v in result["steps"].values()) > 0
    assert result["loader"]["time_ratio"] > 0 and result["loader"]["rss_ratio"] > 0
    assert "| loader vs plain ORT" in proc.stdout
    # both loaders: the Node one against plain onnxruntime-node (CI installs node and npm)
    assert result["node_loader"]["time_ratio"] > 0 and result["node_loader"]["rss_ratio"] > 0
    assert "| Node loader vs plain onnxruntime-node" in proc.stdout
    assert result["plaintext"]["hits"] == [] and result["plaintext"]["private_dirs_left"] == []
    assert list(private.iterdir()) == []
    # the artifacts (fp32 1x, fp16 0.5x, int8 0.25x, int4 0.16x) and their release bundles (as much) were scanned
    assert result["plaintext"]["scanned"] > 3.5 * result["weights"]
