"""The command line's --json documents and exit codes, compared with golden files recorded before a refactor.

Volatile values (times, digests, paths, measured numbers) are masked; keys, statuses, verdicts, names, reasons
and exit codes must stay as recorded. Text tables are compared without what measured figures shape: numbers, the
width of the dashed rule under a header (the widest cell sets it: a p99 of 10 ms is one character wider than one
of 9 ms) and the slowest step a build row names once a step took 0.1 s (an up-to-date job's check, under load).
`ORTBUILD_GOLDEN_WRITE=1 pytest tests/test_cli_golden.py` re-records them (only when a change of output is
intended: the diff of the golden file is then part of the review).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import REPO, run_cli

GOLDEN = Path(__file__).parent / "fixtures" / "cli_golden.json"

TARGETS = """
    [targets.cpu]
    runtime = "RUNTIME"
    providers = ["CPUExecutionProvider"]
    latency = { p90_ms = 500 }

    [targets.cpu-int8]
    extends = "cpu"
    precision = "int8-dynamic"
    quantization = { op_types = ["Conv", "Gemm", "MatMul", "LSTM"] }

    [targets.tight]
    extends = "cpu"
    models = ["tiny_cnn"]
    size = { max_mb = 0.001 }

    [targets.mac]
    runtime = "RUNTIME"
    providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
    models = ["tiny_cnn"]
"""

_HEX = re.compile(r"\b[0-9a-f]{12,}\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z?")
# the CPU a run was on
_MACHINE = re.compile(r"^machine .*|^ *this machine: .*|x86_64-\w+|aarch64-\w+|x86-64-v[234](-vnni)?")
_NUM = re.compile(r"\d+(\.\d+)?")
_CHANGE = re.compile(r"[+-]<n>")  # the sign of a measured change is noise
_RULE = re.compile(r"-{3,}")  # a table's rule: as wide as its widest cell
_SLOWEST = re.compile(r"(<n>s) \([\w-]+ <n>s\)")  # a build row's time and, past 0.1 s, its slowest step


def _mask_text(s: str, root: str) -> str:
    s = s.replace(root, "<project>").replace(str(REPO), "<repo>")
    s = _MACHINE.sub("<machine>", s)
    s = _TIME.sub("<time>", s)
    s = _HEX.sub("<hex>", s)
    s = _SLOWEST.sub(r"\1", _CHANGE.sub("<±n>", _NUM.sub("<n>", s)))
    return re.sub(r"[ \t]+", " ", _RULE.sub("---", s)).strip()


KEPT = {"exit_code"}  # numbers that are decisions, not measurements
MACHINE = {"isa_flags"}  # what the build machine's CPU has (a VNNI CPU says avx_vnni too): its kind, not its value
DROPPED = {"unstable", "note", "speed"}  # what the machine's load did to a latency measurement; whether an
# artifact was measured slower than the one it derives from (ortbuild.gating.measure.speed: tests/test_speed.py)
_SPEED_WARNING = re.compile(r"^\s*\[[^\]]+\] warning: .* is [\d.]+x the speed of ")  # that warning, said


def mask(doc: Any, root: str) -> Any:
    """Keys and structure as they are; numbers and volatile strings replaced by their kind."""
    if isinstance(doc, dict):
        return {k: v if k in KEPT else "<machine>" if k in MACHINE else mask(v, root)
                for k, v in sorted(doc.items()) if k not in DROPPED}
    if isinstance(doc, list):
        if doc and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in doc):
            return "<numbers>"
        return [mask(v, root) for v in doc]
    if isinstance(doc, bool) or doc is None:
        return doc
    if isinstance(doc, (int, float)):
        return "<number>"
    if isinstance(doc, str):
        return _mask_text(doc, root)
    return repr(doc)


def _run(results: dict[str, Any], name: str, root: Path, *args: str) -> Any:
    proc = run_cli(*args, cwd=root)
    try:
        doc: Any = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        doc = [line for line in proc.stdout.splitlines() if not _SPEED_WARNING.match(line)]
    err = [line for line in proc.stderr.splitlines() if line.startswith(("ortbuild:", "  hint:"))]
    results[name] = {"exit": proc.returncode, "stdout": mask(doc, str(root)), "stderr": mask(err, str(root))}
    return doc


def _diff(want: Any, got: Any) -> str:
    """The lines that differ between the recorded and the observed document (pytest truncates its own diff)."""
    import difflib

    lines = [json.dumps(d, indent=1, sort_keys=True, ensure_ascii=False).splitlines() for d in (want, got)]
    return "\n".join(difflib.unified_diff(*lines, "recorded", "observed", lineterm="", n=1))


def test_cli_json_and_exit_codes_match_the_golden_file(make_project: Callable[..., Path], tmp_path: Path) -> None:
    path = make_project(TARGETS, models=("tiny_cnn", "tiny_lstm"))
    root = path.parent
    c = ("-c", str(path))
    out: dict[str, Any] = {}
    _run(out, "plan", root, "plan", *c, "--json")
    _run(out, "targets", root, "targets", *c, "--json")
    _run(out, "build", root, "build", *c, "--json")
    _run(out, "build-again", root, "build", *c, "--json")
    _run(out, "build-named-portable-strict", root, "build", *c, "-t", "mac", "--strict", "--json")
    _run(out, "test", root, "test", *c, "--json")
    _run(out, "test-one", root, "test", *c, "-t", "cpu", "-m", "tiny_cnn", "--json")
    _run(out, "inspect", root, "inspect", str(root / "dist" / "cpu" / "tiny_cnn"), "--json")
    _run(out, "matrix", root, "matrix", *c, "--compact")
    _run(out, "release", root, "release", *c, "-t", "cpu", "--to", str(tmp_path / "rel"), "--json",
         "--allow-development-key")
    _run(out, "release-failed-target", root, "release", *c, "-t", "tight", "--to", str(tmp_path / "rel2"), "--json")
    _run(out, "unknown-target", root, "build", *c, "-t", "nope", "--json")
    # the text forms of the same commands (the summary tables; spacing collapsed)
    _run(out, "plan-text", root, "plan", *c)
    _run(out, "build-text", root, "build", *c)
    _run(out, "test-text", root, "test", *c, "-m", "tiny_cnn")
    _run(out, "inspect-text", root, "inspect", str(root / "dist" / "cpu" / "tiny_cnn"))
    art = root / "dist" / "cpu-int8" / "tiny_cnn" / "model.onnx.enc"
    art.write_bytes(art.read_bytes()[:-10] + bytes(10))
    _run(out, "inspect-tampered", root, "inspect", str(art.parent), "--json")
    _run(out, "test-tampered", root, "test", *c, "-t", "cpu-int8", "--json")
    env_key = os.environ.pop("ORTBUILD_KEY")
    try:
        _run(out, "build-no-key", root, "build", *c, "-t", "cpu", "--json", "--repair")
    finally:
        os.environ["ORTBUILD_KEY"] = env_key
    shutil.copy(path, root / "bad.toml")
    (root / "bad.toml").write_text(path.read_text().replace('precision = "int8-dynamic"', 'precision = "int7"'))
    _run(out, "bad-config", root, "plan", "-c", str(root / "bad.toml"), "--json")

    if os.environ.get("ORTBUILD_GOLDEN_WRITE"):
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    differ = [name for name in golden if out.get(name) != golden[name]]
    assert not differ, "\n".join(f"`{n}` differs from {GOLDEN.name}:\n{_diff(golden[n], out.get(n))}" for n in differ)
    assert set(out) == set(golden)
