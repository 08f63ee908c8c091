"""What a release's index (release.json, the bundle's first member and its OCI config blob) holds, as typed dicts
written by ortbuild.publish.release, read by verify, the registry push and `ortbuild release`. The keys are those
of the format ortbuild-release-v1 (docs/release.md); the in-toto provenance's resolved dependencies too; and
`verdicts`, what the index records of a model's test record."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ortbuild.artifact.manifest_types import ProviderEntry
from ortbuild.gating.record import TestResult
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


class GateVerdict(TypedDict):
    """A newer gate's verdict and budget (its section's `budget`: what the target asked for), never its figures."""
    verdict: str
    budget: object


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
    gates: NotRequired[dict[str, GateVerdict]]  # the newer gates (ortbuild.gating.gates.registry) that ran, by name
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


def verdicts(r: TestResult | None, refusal: str | None) -> Verdicts:
    """What the bundle records of a model's tests (`r`: its test record, None when never tested; `refusal`: why
    `--force` released it): the verdicts and the rules, never the timings (those change from run to run; they are
    in the provenance), so equal inputs give equal bundles."""
    rec = r if r is not None else TestResult("", "", "")  # (a failed record is falsy)
    rules: dict[str, Rule] = {}
    for o in rec.outputs:
        rules.setdefault(o["output"], o["rule"])
    budgets: list[LatencyBudget] = [{"kind": v["kind"], "budget_ms": v.get("budget")}
                                    for v in rec.latency.get("verdicts", [])]
    out: Verdicts = {"status": str(rec.status) if r is not None else "UNTESTED", "accuracy": str(rec.accuracy),
                     "worst": rec.worst, "latency": str(rec.latency_verdict), "latency_budgets": budgets,
                     "size": str(rec.size_verdict), "rules": rules, "golden_digest": rec.golden.get("digest", "")}
    # the cold-start and memory gates, where a budget was set (their verdicts and budgets, not their figures)
    if rec.cold_start_verdict != "-":
        out["cold_start"] = str(rec.cold_start_verdict)
    if rec.memory_verdict != "-":
        out["memory"] = str(rec.memory_verdict)
    if "cold_start" in out or "memory" in out:
        out["startup_budgets"] = [{"kind": v["kind"], "budget": v.get("budget")}
                                  for v in rec.startup.get("verdicts", [])]
    # the newer gates (ortbuild.gating.gates.registry): each one's verdict and budget, never its figures
    gates: dict[str, GateVerdict] = {name: {"verdict": str(s.get("verdict", "-")), "budget": s.get("budget", {})}
                                     for name, s in rec.sections.items()}
    if gates:
        out["gates"] = gates
    if refusal:
        out["forced"] = refusal
    return out
