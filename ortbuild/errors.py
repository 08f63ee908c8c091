"""The error hierarchy. Each class carries its exit code; messages say what to do next.

Exit codes (documented in README.md and docs/design.md):
    0  success
    1  internal error (a bug in ortbuild: rerun with --debug and report it)
    2  command-line usage error
    3  configuration error (targets.toml, its models and data files)
    4  runtime mismatch (this environment's ONNX Runtime flavor is not the target's)
    5  missing execution provider (with --strict, or a provider a step needs)
    6  a build step failed (check, precision, optimize, reload; the reload step's broken outputs included)
    7  an artifact or manifest is unreadable, tampered or does not fit this machine
    8  no key: the encryption or signing key is missing or unreadable
    9  a release gate failed (accuracy, latency or size; INCONCLUSIVE latency with --strict)
   10  the output directory is locked by another ortbuild process (gave up after --lock-timeout)
   11  an OCI registry cannot be reached, refuses a push or pull, or holds no ortbuild release there
  130  interrupted (Ctrl-C)
  141  the reader of stdout went away (`ortbuild matrix | head -1`)

Each error class carries its code as `exit_code`; the codes no class carries are named below the classes
(INTERRUPTED, BROKEN_PIPE, SUMMARY_FAILED, ORPHANED). Nothing else in the package spells an exit code as a
number but 0 (tests/test_architecture.py checks it).
"""

from __future__ import annotations


class OrtbuildError(Exception):
    """Base class: a message for the user, an optional hint, and an exit code."""

    exit_code = 1
    label = "error"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[object, ...]:
        """Pickle by state (parallel builds send results between processes; subclasses take other args)."""
        return (_restore, (type(self), self.message, dict(self.__dict__)))

    def render(self) -> str:
        text = f"ortbuild: {self.label}: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class UsageError(OrtbuildError):
    """Arguments that parse but do not fit together (argparse's own errors exit 2 too)."""

    exit_code = 2
    label = "usage error"


class ConfigError(OrtbuildError):
    """targets.toml (or a file it names) is wrong. `where` is the table/key, e.g. targets.cpu.precision."""

    exit_code = 3
    label = "config error"

    def __init__(self, file: str, where: str, message: str, hint: str | None = None) -> None:
        prefix = f"{file}: [{where}] " if where else f"{file}: "
        super().__init__(prefix + message, hint)
        self.file = file
        self.where = where
        self.detail = message  # without the file and key


class RuntimeMismatch(OrtbuildError):
    exit_code = 4
    label = "runtime mismatch"


class MissingProvider(OrtbuildError):
    exit_code = 5
    label = "missing execution provider"


class StepError(OrtbuildError):
    """A build step failed for one (target, model) job."""

    exit_code = 6
    label = "build step failed"

    def __init__(self, target: str, model: str, step: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{target}/{model}: step '{step}': {message}", hint)
        self.target = target
        self.model = model
        self.step = step


class OutputsBroken(StepError):
    """The reload step: the artifact's outputs on the golden inputs are broken where the source model's are not
    (non-finite values where the source's are finite, or a constant where the source's varies). A precision step
    that broke them is repaired by keeping layers in float (`precision_search = "auto"`, `ortbuild test
    --explain`), which is how the search recognizes this failure."""


class ArtifactError(OrtbuildError):
    exit_code = 7
    label = "artifact error"


class Tampered(ArtifactError):
    """A published file differs from its signed manifest, or the manifest's signature does not verify with the
    trusted public key. Nothing is replaced: `--repair` (or `ortbuild clean`) rebuilds on purpose."""

    label = "TAMPERED"


class RolledBack(ArtifactError):
    """A validly signed artifact older (a lower epoch) than the minimum the reader pins."""

    label = "rolled back"


class KeyMissing(OrtbuildError):
    """No usable encryption or signing key. Messages name the source, never the key."""

    exit_code = 8
    label = "key error"


class WrongKey(KeyMissing):
    """The artifact is encrypted under another key (e.g. the old one, after `ortbuild rekey`)."""

    label = "wrong key"


class GateFailed(OrtbuildError):
    """`ortbuild test`: an artifact failed a release gate. The report names target, model, gate and numbers."""

    exit_code = 9
    label = "release gate failed"


class Busy(OrtbuildError):
    exit_code = 10
    label = "busy"


class RegistryError(OrtbuildError):
    """An OCI registry: unreachable, refusing a push or pull, or holding no ortbuild release at a reference."""

    exit_code = 11
    label = "registry error"


# The exit codes no error class carries.
INTERRUPTED = 130     # Ctrl-C: 128 + SIGINT, as a shell reports a process the signal ended
BROKEN_PIPE = 141     # the reader of stdout closed the pipe: 128 + SIGPIPE, quietly, as other tools in a pipeline
SUMMARY_FAILED = 1    # `ortbuild summary build`: a recorded build failed (the build itself exited with its code)
ORPHANED = 1          # a build worker whose parent died before it could be told to: it exits at once


def from_loader(e: Exception, where: str) -> OrtbuildError:
    """The ortbuild error for a generated loader's LoaderError (its stable `code`, docs/container.md)."""
    code = getattr(e, "code", "loader_error")
    text = f"{where}: the generated loader refused it ({code}): {e}"
    if code in ("tampered", "bad_signature"):
        return Tampered(text, "the artifact differs from what was built and signed: `ortbuild build --repair` "
                              "rebuilds it on purpose")
    if code == "wrong_key":
        return WrongKey(text, "give the key it was built or re-keyed with (after `ortbuild rekey`, the new one)")
    if code == "key_missing":
        return KeyMissing(text, "set ORTBUILD_KEY_FILE or pass --key-file")
    if code == "rolled_back":
        return RolledBack(text, "an older artifact replaced the current one: rebuild or restore it")
    if code == "provider_unavailable":
        return MissingProvider(text)
    return ArtifactError(text)


def _restore(cls: type[OrtbuildError], message: str, state: dict[str, object]) -> OrtbuildError:
    e = cls.__new__(cls)
    Exception.__init__(e, message)
    e.__dict__.update(state)
    return e


def first_line(exc: BaseException, limit: int = 400) -> str:
    """The first line of an exception's message (tools raise multi-line or empty ones)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__
