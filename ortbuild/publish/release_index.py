"""What a release's index (release.json, the bundle's first member and its OCI config blob) holds, as typed dicts:
written by ortbuild.publish.release, read by verify, the registry push and `ortbuild release`. The keys are those
of the format ortbuild-release-v1 (docs/release.md); the in-toto provenance's resolved dependencies too."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ortbuild.artifact.manifest import ProviderEntry
from ortbuild.gating.records import Rule


class FileEntry(TypedDict):
    sha256: str
    size: int


class ProjectEntry(TypedDict):
    name: str
    version: str


class SigningEntry(TypedDict):
    algorithm: str                   # Ed25519
    public_key_id: str
    development_key: bool


class OperatorsEntry(TypedDict):
    """format = "ort": the target's one reduced-build operator config, merged over its models."""
    config: str
    sha256: str
    type_reduction: bool
    models: list[str]


class LatencyBudget(TypedDict):
    kind: str
    budget_ms: float | None


class StartupBudget(TypedDict):
    kind: str
    budget: float | None


class Verdicts(TypedDict):
    """What the bundle records of a model's tests: verdicts and rules, never timings (equal inputs give equal
    bundles)."""
    status: str                      # PASS | FAIL | ... | UNTESTED
    accuracy: str
    worst: str
    latency: str
    latency_budgets: list[LatencyBudget]
    size: str
    rules: dict[str, Rule]           # output -> the accuracy rule it was judged by (verify judges by it)
    golden_digest: str
    cold_start: NotRequired[str]     # the cold-start and memory gates, where a budget was set
    memory: NotRequired[str]
    startup_budgets: NotRequired[list[StartupBudget]]
    forced: NotRequired[str]         # released with --force: why it was refused


class ReleaseIndex(TypedDict):
    format: str                      # ortbuild-release-v1
    name: str                        # <project>-<version>-<target>
    target: str
    description: str
    project: ProjectEntry
    runtime: str                     # the target's runtime requirement(s), as targets.toml gives them
    providers: list[ProviderEntry]
    models: list[str]
    created: str
    files: dict[str, FileEntry]      # every member of the bundle but the index, by its path in the bundle
    tests: dict[str, Verdicts]       # by model
    forced: list[str]                # what --force released anyway
    signing: SigningEntry
    ortbuild: str
    operators: NotRequired[OperatorsEntry]


class Material(TypedDict):
    """One resolved dependency of the provenance: a file the release was built from (in-toto ResourceDescriptor)."""
    name: str
    uri: str
    digest: dict[str, str]           # {"sha256": ...}
    annotations: dict[str, str]      # role, and for external data its location and model


class Subject(TypedDict):
    name: str                        # a released file: the bundle or the index
    digest: dict[str, str]


class ProvenanceStatement(TypedDict):
    """The in-toto v1 statement the provenance envelope signs."""
    _type: str
    predicateType: str
    predicate: dict[str, object]     # SLSA v1 provenance, checked against its schema when it is made
    subject: list[Subject]
