"""Rewrite the output samples and timings that README.md and docs/ quote, from a real run (never by hand).

    python3 docs/samples.py [--clean]       run `python3 -m nox -s test`, then rewrite the samples from what it printed;
                                            the samples show a first run (every job built), so a dist/ left by an
                                            earlier run is an error unless --clean (`ortbuild clean` first)
    python3 docs/samples.py --no-run        rewrite them from the last run's dist/, printed again by
                                            `ortbuild summary test` and `ortbuild summary build` (the same tables,
                                            from what that run recorded; a build or profile since then records
                                            the jobs it reused as up-to-date)
    python3 docs/samples.py --time-checks   also time `python3 -m nox -t check` in a fresh clone of HEAD, with
                                            CPU burners beside it (--burners N, default 2), and rewrite the
                                            minutes README.md and docs/testing.md quote

Each sample sits between markers, `<!-- sample: NAME -->` ... `<!-- /sample -->` (a sentence saying what ran and
on what machine, then the block), each timing between `<!-- timing: NAME -->` ... `<!-- /timing -->`; the script
replaces what is between them and nothing else. Without --time-checks the timings stay as they are: they cost a
full run of the checks (about ten minutes on 2 CPUs). The samples:

- README.md `test-summary`: the table `nox -s test` ends with. Its rows are the real lines, widths included,
  abridged by `keep_test_rows`: the first row of each verdict, the first with a relative budget, the first of
  each accuracy metric.
- README.md `build-summary`: `ortbuild summary build` after that run (the table `nox -s build` ends with), abridged
  by `keep_build_rows`: the first row of each status, the first BUILT row of each precision.
- docs/diagnose.md `profile`: `ortbuild profile -t cpu-int8 -m tiny_cnn --top 5`, as docs/diagnose.md shows it,
  in the target's venv, on the artifact the run built.

Paths are printed relative to the checkout (the run prints them absolute). The script lives in docs/, beside the
pages it writes: it is neither a test nor a benchmark (pytest and `nox -s benchmark` must not collect it, and
nothing may run it by accident: it takes minutes).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ortbuild import machine  # noqa: E402
from ortbuild.project import config, plan  # noqa: E402
from ortbuild.project.kinds import kind_rule  # noqa: E402

README = REPO / "README.md"
TESTING = REPO / "docs" / "testing.md"
DIAGNOSE = REPO / "docs" / "diagnose.md"
DEV_KEYS = REPO / ".ortbuild" / "dev-keys"  # where the nox sessions keep their development keys
TEST_TITLE = "test summary, every target ("
BUILD_TITLE = "build summary, every target ("
PROFILE_COMMAND = ("profile", "-t", "cpu-int8", "-m", "tiny_cnn", "--top", "5")
# every marked span of the pages, and the page it is in (tests/test_readme.py checks the pages hold exactly these)
SAMPLES = {"test-summary": README, "build-summary": README, "profile": DIAGNOSE}
TIMINGS = {"checks": (README, TESTING)}  # the README's wording, then docs/testing.md's


class SampleError(Exception):
    """A run or a page the script cannot use; the message says which and what to do."""


# ------------------------------------------------------------------------------------------------------------
# markers


def marked(text: str, kind: str, name: str) -> re.Match[str]:
    """The one `<!-- KIND: NAME -->...<!-- /KIND -->` span of `text` (group "body": what is between them)."""
    found = list(re.finditer(rf"<!-- {kind}: {re.escape(name)} -->(?P<body>.*?)<!-- /{kind} -->", text, flags=re.S))
    if len(found) != 1:
        raise SampleError(f"expected one <!-- {kind}: {name} --> ... <!-- /{kind} --> span, found {len(found)}")
    return found[0]


def replace_marked(text: str, kind: str, name: str, body: str) -> str:
    m = marked(text, kind, name)
    return text[:m.start("body")] + body + text[m.end("body"):]


def block_of(text: str, name: str) -> tuple[str, str]:
    """A sample's sentence and the lines of its fenced block."""
    m = re.fullmatch(r"\n(?P<sentence>.*?)\n*```text\n(?P<block>.*?)```\n", marked(text, "sample", name)["body"],
                     flags=re.S)
    if m is None:
        raise SampleError(f"the <!-- sample: {name} --> span is not a sentence and a ```text block")
    return m["sentence"], m["block"]


def sample_body(sentence: str, lines: Sequence[str]) -> str:
    """A marked span's text: the sentence, wrapped as the pages' prose is, then the block."""
    sentence = textwrap.fill(sentence, width=115, break_long_words=False, break_on_hyphens=False)
    return "\n" + (sentence + "\n\n" if sentence else "") + "```text\n" + "\n".join(lines) + "\n```\n"


# ------------------------------------------------------------------------------------------------------------
# tables: the real lines, abridged by explicit rules


@dataclass
class Table:
    """A summary table as printed: title, header and dashed rule, rows, then the lines after it."""

    title: str
    head: str
    rule: str
    rows: list[str]
    after: list[str]

    def spans(self) -> list[tuple[int, int]]:
        out, at = [], 0
        for dashes in self.rule.split("  "):
            out.append((at, at + len(dashes)))
            at += len(dashes) + 2
        return out

    def cells(self, line: str) -> list[str]:
        return [line[a:b].strip() for a, b in self.spans()]

    def column(self, name: str) -> int:
        return self.cells(self.head).index(name)


def parse_table(lines: Sequence[str], title: str, last: Callable[[str], bool]) -> Table:
    """The table whose title line starts with `title`, up to the first line `last` accepts (included)."""
    starts = [i for i, line in enumerate(lines) if line.startswith(title)]
    if not starts:
        raise SampleError(f"the run printed no '{title}...' table")
    i = starts[-1]
    head, rule = lines[i + 1], lines[i + 2]
    rows: list[str] = []
    after: list[str] = []
    for line in lines[i + 3:]:
        if after or not line or line.startswith(" "):
            after.append(line)
        else:
            rows.append(line)
        if last(line):
            break
    else:
        raise SampleError(f"the '{title}...' table has no closing line")
    if rows and last(rows[-1]):
        after.append(rows.pop())
    return Table(lines[i], head, rule, rows, after)


def _first_of(rows: Sequence[str], key: Callable[[str], str | None]) -> set[str]:
    seen: dict[str, str] = {}
    for r in rows:
        k = key(r)
        if k is not None:
            seen.setdefault(k, r)
    return set(seen.values())


def accuracy_metric(cell: str) -> str | None:
    """`PASS (logits: cosine 0.999772)` -> `cosine`; `max abs err 6e-07` -> `max abs err`."""
    m = re.search(r": ([a-z][a-z0-9 _]*?) [-+0-9.e]+\)?$", cell)
    return m[1] if m else None


def keep_test_rows(t: Table) -> list[str]:
    """The test summary's rule: the first row of each verdict cell (`PASS`, `FAIL (size)`, `SKIPPED`, ...), the
    first row with a relative budget, the first row of each accuracy metric; in the table's order."""
    verdict, relative, accuracy = t.column("verdict"), t.column("relative"), t.column("accuracy (worst)")
    keep = _first_of(t.rows, lambda r: t.cells(r)[verdict])
    keep |= _first_of(t.rows, lambda r: "relative" if t.cells(r)[relative] not in ("", "-") else None)
    keep |= _first_of(t.rows, lambda r: accuracy_metric(t.cells(r)[accuracy]))
    return [r for r in t.rows if r in keep]


def keep_build_rows(t: Table) -> list[str]:
    """The build summary's rule: the first row of each status, the first BUILT row of each precision."""
    status, precision = t.column("status"), t.column("precision")
    keep = _first_of(t.rows, lambda r: t.cells(r)[status])
    keep |= _first_of(t.rows, lambda r: t.cells(r)[precision] if t.cells(r)[status] == "BUILT" else None)
    return [r for r in t.rows if r in keep]


def _about(line: str, rows: Sequence[str], t: Table) -> bool:
    """Whether a `  [target/model, ...] ...` line after a table is about one of `rows`."""
    m = re.match(r"  \[(.*?)\] ", line)
    if m is None:
        return True
    jobs = {tuple(t.cells(r)[:2]) for r in rows}
    named = [tuple(j.split("/", 1)) for j in m[1].split(", ")]
    return any(j in jobs or (j[1] == "*" and any(t_ == j[0] for t_, _ in jobs)) for j in named)


def abridged(t: Table, keep: Callable[[Table], list[str]]) -> list[str]:
    rows = keep(t)
    return [t.title, t.head, t.rule, *rows, *(line for line in t.after if line and _about(line, rows, t))]


# ------------------------------------------------------------------------------------------------------------
# the run


def relative(text: str) -> str:
    return text.replace(f"{REPO}/", "")


def run(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> tuple[int, list[str]]:
    """Run `cmd`, its output shown as it comes (on stderr) and returned, stdout and stderr in one stream."""
    print(f"samples: $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line.rstrip())  # the pages keep no trailing spaces (a table pads its last column)
    return proc.wait(), [relative(x) for x in lines]


def venv_ortbuild(target: str) -> str:
    exe = REPO / ".nox" / f"target-{target}" / "bin" / "ortbuild"
    if not exe.exists():
        raise SampleError(f"{exe} is missing: run `python3 -m nox -s test` first (or this script without --no-run)")
    return str(exe)


def keys_env() -> dict[str, str]:
    """The keys the nox sessions used: the configured ones, else the development pair they made."""
    env = dict(os.environ)
    if not any(env.get(v) for v in ("ORTBUILD_KEY", "ORTBUILD_KEY_FILE")):
        env["ORTBUILD_KEY_FILE"] = str(DEV_KEYS / "encryption.key")
        env["ORTBUILD_SIGNING_KEY_FILE"] = str(DEV_KEYS / "signing.key")
    env.pop("PYTHONPATH", None)  # the target's venv runs its own (editable) ortbuild
    return env


def test_output(rerun: bool, clean: bool) -> list[str]:
    if rerun:
        if (REPO / "dist").exists():  # the samples are a first run, as on a fresh clone: every job BUILT
            if not clean:
                raise SampleError("dist/ holds an earlier run, and the samples show a first one (as on a fresh "
                                  "clone): pass --clean to run `ortbuild clean` first, or --no-run to reuse it")
            code, _ = run([venv_ortbuild("cpu-fp32"), "clean"], env=keys_env())
            if code != 0:
                raise SampleError(f"`ortbuild clean` failed (exit {code})")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        code, lines = run([sys.executable, "-m", "nox", "-s", "test"], env=env)
        if code != 0:
            raise SampleError(f"`python3 -m nox -s test` failed (exit {code}): a README sample is a passing run; "
                              "fix that first")
        return lines
    code, lines = run([venv_ortbuild("cpu-fp32"), "summary", "test"], env=keys_env())
    if code != 0:
        raise SampleError(f"`ortbuild summary test` failed (exit {code})")
    return lines


def skipped_targets(t: Table) -> list[str]:
    """The targets every row of which is SKIPPED."""
    verdicts: dict[str, set[str]] = {}
    for r in t.rows:
        c = t.cells(r)
        verdicts.setdefault(c[0], set()).add(c[t.column("verdict")])
    return [name for name, v in verdicts.items() if v == {"SKIPPED"}]


def said_list(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def this_machine() -> str:
    gpu = "no GPU" if machine.nvidia_absent() else "an NVIDIA GPU"
    qemu = ("qemu-user present (arm64-int8 and mobile-int8 emulated)" if shutil.which("qemu-aarch64-static")
            and shutil.which("debootstrap") else "no qemu-user")
    level = machine.x86_level()
    cpu = f"{machine.cpu_model()} ({level.name}: {level.says})" if level else machine.cpu_model()
    return f"{os.cpu_count()}-core {cpu}, {gpu}, {qemu}"


def test_sample(lines: Sequence[str], jobs: int) -> tuple[str, list[str]]:
    t = parse_table(lines, TEST_TITLE, lambda line: bool(re.match(r"\d+ PASS, ", line)))
    if len(t.rows) != jobs:
        raise SampleError(f"the test summary has {len(t.rows)} rows, targets.toml {jobs} (target, model) jobs")
    block = abridged(t, keep_test_rows)
    skipped = skipped_targets(t)
    partly = {t.cells(r)[0] for r in t.rows if t.cells(r)[-1] == "SKIPPED"} - set(skipped)
    if partly:  # the sentence names whole targets, and tests/test_readme.py counts their jobs as the SKIPPED ones
        raise SampleError(f"{', '.join(sorted(partly))}: some rows SKIPPED, others not; the README's sentence "
                          "names only targets skipped as a whole: extend docs/samples.py to say which rows")
    why = f", so {said_list(skipped)} {'is' if len(skipped) == 1 else 'are'} skipped" if skipped else ""
    kept = len(keep_test_rows(t))
    sentence = (f"What `nox -s test` prints at the end, after nox's list of sessions (abridged: {kept} of "
                f"its {len(t.rows)} rows, by docs/samples.py; {this_machine()}{why}):")
    return sentence, block


def build_sample() -> tuple[str, list[str]]:
    code, lines = run([venv_ortbuild("cpu-fp32"), "summary", "build"], env=keys_env())
    if code != 0:
        raise SampleError(f"`ortbuild summary build` failed (exit {code})")
    t = parse_table(lines, BUILD_TITLE, lambda line: bool(re.match(r"\d+ [a-z-]+(, |$)", line)))
    block = abridged(t, keep_build_rows)
    gpu = "without a GPU" if machine.nvidia_absent() else "with an NVIDIA GPU"
    sentence = (f"What the build prints at the end (`nox -s build`, `ortbuild build`; `ortbuild summary build` prints "
                f"it again, here after the `nox -s test` above; abridged: {len(keep_build_rows(t))} of its "
                f"{len(t.rows)} rows, by docs/samples.py, on a machine {gpu}):")
    return sentence, block


def profile_sample() -> list[str]:
    code, lines = run([venv_ortbuild("cpu-int8"), *PROFILE_COMMAND], env=keys_env())
    if code != 0:
        raise SampleError(f"`ortbuild {' '.join(PROFILE_COMMAND)}` failed (exit {code})")
    start = lines.index("cpu-int8/tiny_cnn: PROFILED")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("  trace: "))
    return lines[start:end + 1]


# ------------------------------------------------------------------------------------------------------------
# the checks' time


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def time_checks(burners: int) -> tuple[str, str]:
    """`python3 -m nox -t check` in a fresh clone of HEAD with `burners` CPU burners beside it: the README's and
    docs/testing.md's wording of what was measured."""
    with tempfile.TemporaryDirectory(prefix="ortbuild-checks-") as tmp:
        clone = Path(tmp) / "ortbuild"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        burning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
        try:
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            started: list[tuple[str, float]] = []
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "nox", "-t", "check"], cwd=clone, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                if m := re.match(r"nox > Running session (\S+)", line):
                    started.append((m[1], time.monotonic()))
            code = proc.wait()
            t1 = time.monotonic()
        finally:
            for b in burning:
                b.kill()
                b.wait()
    if code != 0:
        raise SampleError(f"`python3 -m nox -t check` failed (exit {code}) in a fresh clone: fix that first")
    took = {name: (ends - at) for (name, at), ends in zip(started, [*(s for _, s in started[1:]), t1], strict=True)}
    total = f"{(t1 - t0) / 60:.1f} minutes ({t1 - t0:.0f} s)"  # not rounded down to a whole minute
    os_name = next((line.split("=", 1)[1].strip('"').split()[0] for line in Path("/etc/os-release").read_text()
                    .splitlines() if line.startswith("NAME=")), sys.platform)
    count = ["no", "one", "two", "three", "four"][burners] if burners < 5 else str(burners)
    beside = f"{count} CPU burner{'s' if burners != 1 else ''}"
    node = "present" if shutil.which("node") and shutil.which("npm") else "absent"
    chromium = "present" if shutil.which("chromium") else "absent, so its tests skipped"
    level = machine.x86_level()
    cls = f" ({level.name}: {level.says})" if level else ""
    readme = (f"{total} on a fresh clone, {os.cpu_count()}-CPU {os_name} machine{cls}, with {beside} running beside "
              f"it, Node.js {node}, Chromium {chromium.split(',')[0]}")
    parts = ", ".join(f"{name} {_minutes(s)}" for name, s in took.items())
    testing = (f"a fresh clone, {os.cpu_count()}-CPU {os_name} machine ({machine.cpu_model()}), with {beside} "
               f"running beside it: {total} ({parts}; uv's download cache warm; Node.js {node}; Chromium {chromium})")
    return readme, testing


# ------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--no-run", action="store_true", help="use the last run's dist/ instead of running nox -s test")
    ap.add_argument("--clean", action="store_true", help="run `ortbuild clean` before nox -s test (a first run)")
    ap.add_argument("--time-checks", action="store_true", help="also time `python3 -m nox -t check` (minutes)")
    ap.add_argument("--burners", type=int, default=2, help="CPU burners beside the timed checks (default 2)")
    args = ap.parse_args(argv)
    try:
        # nox -s test's jobs: the generative targets have their own sessions (nox -t generative)
        jobs = len([j for j in plan.jobs(config.load(REPO / "targets.toml"))
                    if not kind_rule(j.model.kind).session_suffix])
        test_sentence, test_block = test_sample(test_output(rerun=not args.no_run, clean=args.clean), jobs)
        build_sentence, build_block = build_sample()
        profile_block = profile_sample()
        timings = time_checks(args.burners) if args.time_checks else None
        write_pages(test_sentence, test_block, build_sentence, build_block, profile_block, timings)
    except SampleError as err:
        print(f"samples: error: {err}", file=sys.stderr)
        return 1
    return 0


def write_pages(test_sentence: str, test_block: list[str], build_sentence: str, build_block: list[str],
                profile_block: list[str], timings: tuple[str, str] | None) -> None:
    pages = {path: path.read_text() for path in {*SAMPLES.values(), *(p for ps in TIMINGS.values() for p in ps)}}
    bodies = {"test-summary": sample_body(test_sentence, test_block),
              "build-summary": sample_body(build_sentence, build_block), "profile": sample_body("", profile_block)}
    for name, path in SAMPLES.items():
        pages[path] = replace_marked(pages[path], "sample", name, bodies[name])
    if timings is not None:
        for path, wording in zip(TIMINGS["checks"], timings, strict=True):
            pages[path] = replace_marked(pages[path], "timing", "checks", wording)
    for path, text in pages.items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"samples: rewrote {path.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
