"""The JSON documents of the gates, as types: what `ortbuild test` writes (dist/<target>/<model>/test-report.json,
dist/report.json) and `ortbuild profile` writes (profile.json), and what the reports, the summary, the release index
and the noxfile read back.

Types only: the documents stay plain JSON (TypedDicts are dicts), so their keys, order and values are exactly what
the writers put there. A section a gate fills only when it runs (`latency`, `size`, `startup`, `explain`, ...) is
`total=False`: it is `{}` when the gate did not run, and older reports may lack keys, so readers use `.get`.
A verdict is a string ("PASS", "FAIL", "INCONCLUSIVE", "SKIPPED": ortbuild.status.Verdict, a StrEnum) or "-"
(the gate did not run). Stdlib only: the noxfile reads these documents in nox's own interpreter. The timing
sections (latency, startup) and profile.json are in ortbuild.gating.timing_records.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ortbuild.gating.timing_records import LatencyDoc, ProfileDoc, SpeedDoc, StartupDoc

# ------------------------------------------------------------------------------------------- accuracy

# an output's accuracy rule after defaults and overrides (rtol, atol, mismatch_fraction, cosine, top1, top5,
# ignore); a value None is unset
Rule = dict[str, float | bool | None]


class CheckDoc(TypedDict):
    metric: str
    passed: bool
    observed: str
    allowed: str


class WorstElement(TypedDict, total=False):
    index: list[int]
    expected: object
    actual: object
    abs_diff: float
    tolerance: float


class PassingTolerance(TypedDict):
    atol: float
    with_rtol: float
    rtol: float
    with_atol: float


class OutputStats(TypedDict, total=False):
    """An output's error statistics (float outputs), mismatches and worst element."""

    max_abs: float
    mean_abs: float
    median_abs: float
    p99_abs: float
    max_rel: float
    mean_rel: float
    median_rel: float
    p99_rel: float
    mismatches: int
    elements: int
    mismatch_fraction: float
    worst: WorstElement
    passing_tolerance: PassingTolerance
    cosine: float
    top1_agreement: float
    top5_agreement: float


class OutputDoc(TypedDict):
    """One output of one data set under its rule (compare.OutputResult.as_json)."""

    output: str
    dataset: str
    rule: Rule
    checks: list[CheckDoc]
    stats: OutputStats
    ignored: bool
    passed: bool


class GoldenDoc(TypedDict, total=False):
    made_by: str
    source: str
    digest: str
    data_sets: list[str]
    dir: str
    warnings: list[str]


# ------------------------------------------------------------------------------------------- size

class SizeDoc(TypedDict, total=False):
    bytes: int
    source_bytes: int
    ratio: float
    max_ratio: float
    max_mb: float | None
    inflation: object                # the manifest's record of constant folding growing the weights


# ------------------------------------------------------------------------------------------- explain

class PredictionDoc(TypedDict):
    passed: bool
    error: float | str
    worst: str


class LayerDoc(TypedDict):
    node: str
    op_type: str
    error: float | str
    added: float | str
    weights: int
    alone: NotRequired[PredictionDoc]


class TrialDoc(TypedDict):
    nodes: list[str]
    op_types: list[str]
    passed: bool
    worst: str
    seconds: float


class SkippedSet(TypedDict):
    """A candidate set not rebuilt: its graph is that of an earlier one (`same_as`), whose verdict it takes."""

    nodes: list[str]
    op_types: list[str]
    same_as: str
    passed: bool


class PredictionsDoc(TypedDict, total=False):
    status: str                      # "on" or "off"
    reason: str
    baseline: str
    predicted: int
    candidates: int
    seconds: float


class ExplainBaseline(TypedDict):
    accuracy: str
    worst: str


class ExplainResult(TypedDict):
    """The full gate of the search's answer."""

    accuracy: str
    worst: str
    size: SizeDoc
    size_verdict: str
    latency_verdict: str
    p50_ms: float | None
    p90_ms: float | None
    failures: list[str]


class ExplainDoc(TypedDict, total=False):
    """TestResult.explain: the precision search of `ortbuild test --explain` (status and reason always)."""

    status: str
    reason: str
    precision: str
    table: str
    layers: list[LayerDoc]
    baseline: ExplainBaseline
    analysed: str
    renamed: list[str]
    predictions: PredictionsDoc
    trials: list[TrialDoc]
    rebuilds: int
    skipped: list[SkippedSet]
    seconds: float
    nodes: list[str]
    op_types: list[str]
    override: str
    result: ExplainResult
    stopped: str


# ------------------------------------------------------------------------------------------- builds

class BuildLog(TypedDict, total=False):
    path: str
    lines: int
    warnings: int


class BuildError(TypedDict, total=False):
    exit_code: int
    hint: str | None


class BuildRecord(TypedDict, total=False):
    """The keys the reports and summaries read of a build record (dist/logs/<target>/<model>.build.json:
    JobResult.as_json() of a job's last build)."""

    target: str
    model: str
    status: str
    reason: str
    precision: str
    step: str
    log: BuildLog | None
    error: BuildError | None
    size: int | None
    source_size: int | None
    level: str | None
    converted: float | None
    steps: dict[str, float]
    seconds: float


class BuildDoc(TypedDict, total=False):
    """TestResult.build: the step that failed and its log."""

    status: str
    step: str
    log: str | None


class BuildFailure(TypedDict):
    """What a test result says of a job whose build failed (builds.failure)."""

    status: str
    reason: str
    failures: list[str]
    exit_code: int
    build: BuildDoc


# ------------------------------------------------------------------------------------------- results

class GatesPart(TypedDict):
    """What the gates fill in of a result (record.TestResult's fields; a job no gate ran on has their defaults)."""

    accuracy: str
    worst: str
    outputs: list[OutputDoc]
    golden: GoldenDoc
    latency: LatencyDoc
    latency_verdict: str
    size: SizeDoc
    size_verdict: str
    startup: StartupDoc
    cold_start_verdict: str
    memory_verdict: str
    explain: ExplainDoc
    build_key: str
    artifact_sha256: str
    quick: bool
    judged: list[str]                # the gates this test judged (`--gates`; older reports: none, all of them)
    speed: list[SpeedDoc]            # measured slower than the artifact it derives from (ortbuild.gating.measure.speed)
    platform: dict[str, object]      # an emulated platform's run (ortbuild.emulation)
    gates: dict[str, str]            # each gate's verdict by name (older reports: none)
    failed_gates: list[str]
    gates_key: str                   # a digest of what it judged by (gates.gates_key; older reports: none)
    sections: NotRequired[dict[str, dict[str, object]]]  # the other gates' sections, when one ran
    generative: NotRequired[bool]    # a generative model's record (its gates are its own): only when true


class ResultDoc(GatesPart):
    """One artifact's test result (record.TestResult.as_json), test-report.json's `result`."""

    target: str
    model: str
    precision: str
    status: str
    reason: str
    failures: list[str]
    reproduce: str
    build: BuildDoc
    exit_code: int


class ResultFile(TypedDict):
    """dist/<target>/<model>/test-report.json (`environment`: what the timings depend on; None in the report's
    row of a failed build)."""

    result: ResultDoc
    environment: dict[str, object] | None


class Comparison(TypedDict):
    """The report a report.json's changes are against."""

    kind: str                        # "baseline" or "previous"
    file: str
    created: str | None


class Change(TypedDict):
    before: object                   # the numbers compared, as the reports hold them
    after: object
    change: float
    percent: float | None


class VerdictChange(TypedDict):
    before: str | None
    after: str | None
    changed: bool


class DeltaDoc(TypedDict, total=False):
    """A row's change against the comparison (`new`: the comparison has no such row)."""

    against: Comparison
    new: bool
    verdict: VerdictChange
    p50_ms: Change
    p90_ms: Change
    size_bytes: Change


class RowDoc(ResultDoc, total=False):
    """A row of dist/report.json: a result with its change."""

    delta: DeltaDoc | None


class ReportDoc(TypedDict):
    """dist/report.json."""

    created: str
    counts: dict[str, int]
    comparison: Comparison | None
    results: list[RowDoc]
    environments: dict[str, dict[str, object] | None]
    profiles: list[ProfileDoc]
