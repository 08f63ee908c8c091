"""The scale benchmark's code path on a small external-data model: build in every precision, test, release,
verify and the loader against plain ORT, each in a fresh process (CI runs it; the 0.5 and 2.5 GiB runs are
`nox -s scale`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import REPO


def test_a_small_external_data_model_goes_through_every_step(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, "tests/benchmarks/bench_scale.py", "--gib", "0.02", "--reps", "1",
                           "--precisions", "fp32,int8-dynamic,int4-weight,fp16", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    precisions = ("fp32", "int8-dynamic", "int4-weight", "fp16")
    assert set(result["steps"]) == {*(f"build {p}" for p in precisions), *(f"test {p}" for p in precisions),
                                    "release fp32", "verify fp32", "verify fp32 --no-run"}
    assert result["steps"]["test fp32"]["verdict"].startswith("PASS")
    for step in result["steps"].values():
        assert step["seconds"] > 0 and step["rss"] > 0
    # the private dir was seen (and measured) during the builds
    assert max(v.get("temp", 0) for v in result["steps"].values()) > 0
    assert result["loader"]["time_ratio"] > 0 and result["loader"]["rss_ratio"] > 0
    assert "| loader vs plain ORT" in proc.stdout
    assert result["plaintext"]["hits"] == [] and result["plaintext"]["private_dirs_left"] == []
    # the artifacts (fp32 1x, fp16 0.5x, int8 0.25x, int4 0.16x) and the fp32 release bundle (1x) were scanned
    assert result["plaintext"]["scanned"] > 2.5 * result["weights"]
