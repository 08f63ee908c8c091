"""What is installed here: the ONNX Runtime flavor (the pip distribution that provides `onnxruntime`), whether this
environment holds a target's requirements (its flavor, plugin EPs and custom-op packages at their pinned versions),
and where this ortbuild was installed from (what installs the same one into a target's venv). Reads package
metadata only: never imports ONNX Runtime."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import unquote, urlparse

from packaging.requirements import Requirement
from packaging.version import Version

from ortbuild import __version__, files, machine
from ortbuild.errors import RuntimeMismatch, UsageError
from ortbuild.project import options
from ortbuild.project.config import Target


@dataclass(frozen=True)
class Flavor:
    distribution: str
    version: str

    def as_json(self) -> dict[str, str]:
        return {"distribution": self.distribution, "version": self.version}


def installed_flavor() -> Flavor | None:
    """The pip distribution that provides `onnxruntime` here, or None."""
    found = []
    for name in options.RUNTIMES:
        try:
            found.append(Flavor(name, md.version(name)))
        except md.PackageNotFoundError:
            continue
    if len(found) > 1:
        names = ", ".join(f.distribution for f in found)
        raise RuntimeMismatch(
            f"several ONNX Runtime flavors are installed together ({names}); they overwrite each other's "
            "`onnxruntime` module", "use one virtualenv per flavor: `nox -s build` does that for you")
    return found[0] if found else None


STAND_IN_VAR = "ORTBUILD_STAND_IN"  # "1": this environment holds CPU stand-ins of absent hardware's runtimes


def stand_in(target: Target) -> machine.StandIn | None:
    """The CPU stand-in `target` is built with here: where its GPU/accelerator hardware is absent and this
    environment was made with the stand-in (nox does that by default, and sets ORTBUILD_STAND_IN=1); else None."""
    if os.environ.get(STAND_IN_VAR, "") in ("", "0"):
        return None
    s = machine.stand_in(target.requirements)
    if s is None or requirements_problem(target.name, s.requirements, "") is not None:
        return None  # the hardware is here, or the environment holds the target's own runtime
    return s


def runtime_problem(target: Target) -> str | None:
    """Why this environment cannot build `target` (wrong flavor, version or plugin EP), or None if it can (its
    own runtime, or its CPU stand-in: see stand_in)."""
    how = (f"run `nox -s '{target.session('build')}'`, which installs {target.runtime_text} in the target's own "
           "virtualenv")
    if stand_in(target) is not None:
        return None
    return requirements_problem(target.name, target.requirements, how)


def requirements_problem(name: str, requirements: Sequence[str], how: str) -> str | None:
    """Why this environment does not hold `requirements` (a target's: its flavor first, then its plugin EPs and
    custom-op packages), or None."""
    flavor, *packages = requirements
    return requirement_problem(name, flavor, how) or next(
        (why for req in packages if (why := package_problem(name, req, how))), None)


def requirement_problem(name: str, requirement: str, how: str) -> str | None:
    """Why this environment's ONNX Runtime does not satisfy `requirement` (a target's runtime), or None."""
    req = Requirement(requirement)
    have = installed_flavor()
    if have is None:
        return f"no ONNX Runtime is installed here; {name} needs {requirement}; {how}"
    if have.distribution != req.name.lower() or not req.specifier.contains(Version(have.version), prereleases=True):
        return f"{name} needs {requirement}, this environment has {have.distribution} {have.version}; {how}"
    return None


def package_problem(name: str, requirement: str, how: str) -> str | None:
    """Why the package `requirement` (a plugin EP, a custom-op library) is not installed here at its version."""
    req = Requirement(requirement)
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        what = "the plugin EP " if req.name.lower() in options.PLUGINS else ""
        return f"{name} needs {what}{requirement}, which is not installed here; {how}"
    if not req.specifier.contains(Version(version), prereleases=True):
        return f"{name} needs {requirement}, this environment has {req.name} {version}; {how}"
    return None


REQUIREMENT_VAR = "ORTBUILD_REQUIREMENT"


def _checkout() -> Path | None:
    """The source checkout this ortbuild is imported from, if it is one."""
    source = Path(__file__).resolve().parent.parent
    return source if (source / "pyproject.toml").is_file() and (source / "ortbuild" / "__init__.py").is_file() \
        else None


class DirectUrl(TypedDict, total=False):
    """The keys read of PEP 610's direct_url.json (each checked: the file is another tool's)."""

    url: str
    vcs_info: dict[str, object]
    dir_info: dict[str, object]


def _origin() -> DirectUrl:
    """Where pip or uv installed ortbuild from (PEP 610's direct_url.json), or {}."""
    try:
        origin = json.loads(md.distribution("ortbuild").read_text("direct_url.json") or "{}")
    except (md.PackageNotFoundError, ValueError, OSError):
        return {}
    usable = isinstance(origin, dict) and isinstance(origin.get("url"), str)
    return origin if usable else {}


def ortbuild_requirement() -> tuple[list[str], str]:
    """What installs this very ortbuild into a target's venv (pip arguments), and what identifies it (the stamp
    part that reinstalls it when it changes): $ORTBUILD_REQUIREMENT; else a source checkout (editable); else where
    pip or uv installed it from (PEP 610: a local wheel, sdist or folder, a VCS commit); else ortbuild==<version>.
    A path in $ORTBUILD_REQUIREMENT that does not exist is a UsageError naming the variable."""
    given = os.environ.get(REQUIREMENT_VAR, "").strip()
    if given:
        path = Path(given)
        if path.exists():
            return [given], f"{given} {files.sha256_file(path)}" if path.is_file() else given
        if os.sep in given or given.endswith((".whl", ".tar.gz", ".zip")):
            raise UsageError(f"{REQUIREMENT_VAR}={given}: no such file",
                             f"point {REQUIREMENT_VAR} at the ortbuild wheel or sdist, or unset it")
        return [given], given
    source = _checkout()
    if source is not None:
        return ["-e", str(source)], f"-e {source} {files.sha256_file(source / 'pyproject.toml')}"
    origin = _origin()
    url, vcs, folder = urlparse(origin.get("url", "")), origin.get("vcs_info"), origin.get("dir_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str):
        pinned = f"ortbuild @ {origin['url']}@{vcs['commit_id']}"
        return [pinned], pinned
    if url.scheme == "file":
        path = Path(unquote(url.path))
        if isinstance(folder, dict) and path.is_dir():
            return (["-e", str(path)] if folder.get("editable") else [str(path)]), f"{path}"
        if path.is_file():
            return [str(path)], f"{path} {files.sha256_file(path)}"
    return [f"ortbuild=={__version__}"], f"ortbuild=={__version__}"
