"""What ortbuild writes in its output directory, by place: the list `ortbuild clean` removes, and nothing else.

    dist/.ortbuild.lock, dist/.ortbuild-dist     the lock and the marker (clean holds the one and keeps both)
    dist/report.json, report.html, report.previous.json                     `ortbuild test`'s report
    dist/logs/<target>/<model>.{build,test}.log, <model>.build.json         job logs and build records
    dist/release/<target>/<project>-<version>-<target>.{tar,release.json,intoto.jsonl}, SHA256SUMS[.minisig]
                                                                            `ortbuild release`'s default output
    dist/<target>/<model>/                                                  an artifact directory:
        manifest.json, manifest.sig, the files its manifest lists (artifact files, custom-op libraries, the operator
        config), model.onnx*/model.ort*/*.enc (a build cut short before its manifest), loader/<the loaders> (and
        ortbuild_loader.py, the Python loader's name before it was named per model),
        golden/ (written whole), test-report.json/.sig, profile.json, profile.trace.json
    partial files of interrupted writes anywhere (`.NAME.*.partial`, `.golden.*`: workspace.partial_files)

Anything else (a user's NOTES.txt, a directory of theirs) is left where it is, and `clean` says so.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from pathlib import Path

from ortbuild import logs, workspace
from ortbuild.artifact import loaders, manifest, manifest_types
from ortbuild.errors import ArtifactError
from ortbuild.gating import runner
from ortbuild.gating.measure import profile
from ortbuild.gating.reports import report
from ortbuild.pipeline.steps import operators
from ortbuild.publish import release

TOP_FILES = frozenset({report.REPORT_JSON, report.REPORT_HTML, report.REPORT_PREVIOUS})
KEPT = frozenset({workspace.LOCK, workspace.MARKER})
LOG_PATTERNS = ("*.build.log", "*.test.log", "*.build.json")
RELEASE_DIR = "release"
RELEASE_PATTERNS = (f"*{release.BUNDLE_SUFFIX}", f"*{release.OLD_BUNDLE_SUFFIX}", f"*.{release.INDEX}",
                    "*.intoto.jsonl", release.SUMS, release.SUMS_SIG)
ARTIFACT_FILES = frozenset({manifest_types.MANIFEST, manifest.SIGNATURE, runner.REPORT, runner.REPORT_SIG,
                            profile.TRACE, profile.SUMMARY, operators.CONFIG})
ARTIFACT_PATTERNS = ("model.onnx*", "model.ort*", "*.enc")


def _plain(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _match(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def _listed(folder: Path) -> set[str]:
    """The names beside a manifest that it lists (read, not trusted: it decides only what clean removes inside
    ortbuild's own artifact directory), or none when it is unreadable."""
    try:
        path = folder / manifest_types.MANIFEST
        m = manifest_types.Manifest.from_json(path.read_bytes(), str(path))
    except (OSError, ArtifactError):
        return set()
    return {name.split("/")[0] for name, *_ in m.signed_files()}


def is_artifact_dir(folder: Path) -> bool:
    """A dist/<target>/<model>/ directory ortbuild wrote: it holds a manifest, its signature, the loaders or an
    encrypted artifact file (a build killed before its manifest)."""
    return folder.is_dir() and not folder.is_symlink() and (
        any((folder / n).exists() for n in (manifest_types.MANIFEST, manifest.SIGNATURE, loaders.LOADER_DIR))
        or any(p.name.endswith(".enc") for p in folder.iterdir()))


def _sort(entries: list[Path], ours: list[Path], kept: list[Path], is_ours: Callable[[Path], bool]) -> None:
    for e in entries:
        (ours if is_ours(e) else kept).append(e)


def _in_dirs(root: Path, ours: list[Path], kept: list[Path], file_ok: Callable[[str], bool]) -> None:
    """root/<sub>/<file>: files `file_ok` accepts are ortbuild's; anything else (and anything at root's top) kept."""
    for sub in sorted(root.iterdir()):
        if not sub.is_dir() or sub.is_symlink():
            kept.append(sub)
            continue
        _sort(sorted(sub.iterdir()), ours, kept, lambda p: _plain(p) and file_ok(p.name))


def _artifact(folder: Path, ours: list[Path], kept: list[Path]) -> None:
    listed = _listed(folder)
    names = loaders.loader_files(folder.name)  # today's loader names and the old ortbuild_loader.py
    for e in sorted(folder.iterdir()):
        if e.name == manifest.GOLDEN_DIR and e.is_dir() and not e.is_symlink():
            ours.append(e)  # written (and replaced) whole by the golden gate
        elif e.name == loaders.LOADER_DIR and e.is_dir() and not e.is_symlink():
            _sort(sorted(e.iterdir()), ours, kept, lambda p: _plain(p) and p.name in names)
        elif _plain(e) and (e.name in ARTIFACT_FILES or e.name in listed or _match(e.name, ARTIFACT_PATTERNS)):
            ours.append(e)
        else:
            kept.append(e)


def sort_out(dist: Path) -> tuple[list[Path], list[Path]]:
    """(what ortbuild made in `dist`, what it did not: a user's files, kept), each in path order. The lock and
    the marker are in neither list. The directories that held only ortbuild's files are removed by the caller once
    they are empty (`prune_empty`)."""
    ours: list[Path] = []
    kept: list[Path] = []
    for entry in sorted(dist.iterdir()):
        name = entry.name
        if name in KEPT:
            continue
        if name in TOP_FILES and _plain(entry):
            ours.append(entry)
        elif name == logs.LOG_DIR and entry.is_dir() and not entry.is_symlink():
            _in_dirs(entry, ours, kept, lambda n: _match(n, LOG_PATTERNS))
        elif name == RELEASE_DIR and entry.is_dir() and not entry.is_symlink():
            _in_dirs(entry, ours, kept, lambda n: _match(n, RELEASE_PATTERNS))
        elif entry.is_dir() and not entry.is_symlink() and any(is_artifact_dir(m) for m in entry.iterdir()):
            for sub in sorted(entry.iterdir()):  # a target directory: its models' artifact directories
                if is_artifact_dir(sub):
                    _artifact(sub, ours, kept)
                else:
                    kept.append(sub)
        else:
            kept.append(entry)
    return ours, kept


def prune_empty(dist: Path, removed: Iterable[Path]) -> list[Path]:
    """Remove the directories between `dist` and each of `removed` (deepest first) that are empty now: those
    clean emptied. One that still holds a kept file stays, and so does any directory clean did not empty."""
    below = {parent for p in removed for parent in p.parents if dist in parent.parents}
    gone = []
    for d in sorted(below, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:  # not empty: it holds what clean kept
            continue
        gone.append(d)
    return gone
