"""The timing documents of the gates, as types: the latency and startup sections of a test result
(ortbuild.gating.records.ResultDoc) and `ortbuild profile`'s profile.json. Types only, stdlib only, as
ortbuild.gating.records (which says how to read them)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

# ------------------------------------------------------------------------------------------- latency

class PercentileVerdictDoc(TypedDict):
    """percentiles.PercentileVerdict as JSON."""

    percentile: float
    budget: float
    observed: float
    upper: float | None
    lower: float | None
    exceeding: int
    samples: int
    confidence: float
    verdict: str
    more_samples: int | None
    note: str
    upper_confidence: float | None
    lower_confidence: float | None


class BudgetVerdictDoc(PercentileVerdictDoc):
    kind: str                        # p50, p90, p99


class SeriesSummary(TypedDict):
    """latency.Series.summary(): one artifact's timings in ms."""

    samples: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    cov: float
    session_ms: float
    first_run_ms: float


class AttemptDoc(TypedDict):
    samples: int
    seconds: float
    looks: int
    stopped_early: bool
    load: float | None
    unstable: list[str]
    p50_ms: float
    p90_ms: float
    verdicts: dict[str, str]


class WaitDoc(TypedDict):
    """latency.wait_for_quiet: whether the load fell, the last average, seconds waited."""

    quiet: bool
    load: float
    waited_s: float


class RetryDoc(WaitDoc):
    why: str


class RelativeDoc(TypedDict, total=False):
    """A `faster_than` budget's verdict (or why it could not be judged: target, ratio, verdict, note)."""

    target: str
    ratio: float
    observed_ratio: float
    reference: SeriesSummary
    percentile: float
    budget: float
    observed: float
    upper: float | None
    lower: float | None
    exceeding: int
    samples: int
    confidence: float
    verdict: str
    more_samples: int | None
    note: str
    upper_confidence: float | None
    lower_confidence: float | None


class MismatchDoc(TypedDict):
    """One output of one timed request that differed from the accuracy run's (compliance.Checker)."""

    request: int                     # the request's index in issue order, from 0, over the data set's attempts
    data_set: str
    output: str
    difference: list[str]            # compare.describe_failure's lines


class ComplianceDoc(TypedDict):
    """Outputs under load (ortbuild.gating.measure.compliance): a sample of the timed requests' outputs against the
    accuracy run's."""

    checked: int                     # outputs compared
    requests: int                    # timed requests seen
    every: int                       # 1 request in `every` is checked ...
    seed: int                        # ... from an offset drawn from this seed
    mismatches: list[MismatchDoc]    # the first compliance.MAX_REPORTED
    mismatched: int                  # how many there were
    verdict: str                     # PASS, FAIL, SKIPPED (nothing checked)


class DataSetLatency(TypedDict, total=False):
    """One golden data set's timings and verdicts (gates.data_set_entry); the report's HTML adds `threads`."""

    name: str
    samples: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    cov: float
    session_ms: float
    first_run_ms: float
    samples_ms: list[float]
    unstable: list[str]
    load: float | None
    looks: int
    stopped_early: bool
    verdicts: list[BudgetVerdictDoc]
    retry: RetryDoc
    attempts: list[AttemptDoc]
    relative: RelativeDoc
    compliance: ComplianceDoc
    note: str
    verdict: str
    threads: int | str | None


class LatencyDoc(DataSetLatency, total=False):
    """TestResult.latency: the first data set's entry (as reports have always read it, less `name`), with every
    data set's in `data_sets`."""

    data_set: str
    data_sets: list[DataSetLatency]
    confidence: float
    quick: bool


class SpeedDoc(TypedDict):
    """One speed claim found false (ortbuild.gating.measure.speed): this artifact measured slower than `than`, the
    artifact of the same model it derives from (fp32 for a reduced precision; fusion off for a fusion), in the
    same run; a result's `speed` lists them."""

    kind: str                        # "precision" or "fusion"
    what: str                        # what should have made it faster: "int8-static", "fusion bert"
    than: str                        # target/model of the artifact it was measured against
    data_set: str
    speed_ratio: float               # than's p50 / this p50 (below 1: slower)
    p50_ms: float
    than_p50_ms: float
    lower_ms: float                  # this p50's lower confidence bound (above than_upper_ms: slower)
    than_upper_ms: float             # than's p50 upper confidence bound
    confidence: float
    faster_than: str                 # this target's latency.faster_than verdict against `than` ("": none asked)
    unstable: list[str]              # "target/model: why" for either measured under load or drift
    message: str                     # the summary's warning, after "[target/model] warning: "


# ------------------------------------------------------------------------------------------- startup

class StartupStats(TypedDict, total=False):
    p50: float
    min: float
    max: float


class StartupPlan(TypedDict):
    first_look: int
    max_processes: int
    max_seconds: float
    runs_after_first: int


class StartupVerdictDoc(TypedDict, total=False):
    """A startup budget's verdict: BudgetVerdictDoc's keys, or kind, unit, budget, verdict and note where a
    process failed."""

    kind: str
    unit: str
    percentile: float
    budget: float
    observed: float
    upper: float | None
    lower: float | None
    exceeding: int
    samples: int
    confidence: float
    verdict: str
    more_samples: int | None
    note: str
    upper_confidence: float | None
    lower_confidence: float | None


class StartupDoc(TypedDict, total=False):
    """TestResult.startup: cold start and peak memory over fresh processes (startup.summary)."""

    processes: int
    looks: int
    stopped: str
    seconds: float
    plan: StartupPlan
    cold_start_ms: StartupStats
    import_ms: StartupStats
    session_ms: StartupStats
    first_run_ms: StartupStats
    peak_rss_mb: StartupStats
    verdicts: list[StartupVerdictDoc]
    error: str
    note: str


# ------------------------------------------------------------------------------------------- profiles

class TraceEvent(TypedDict, total=False):
    """The keys read of an ONNX Runtime profiler event (Chrome trace format)."""

    cat: str
    name: str
    ts: int
    dur: int
    args: dict[str, str]


class OperatorDoc(TypedDict):
    op_type: str
    node: str
    provider: str
    calls: int
    total_us: int
    share: NotRequired[float]


class NodesTime(TypedDict):
    nodes: int
    total_us: int


class FallbackDoc(TypedDict):
    node: str
    op_type: str
    share: float


class ProfileDoc(TypedDict, total=False):
    """profile.json (a SKIPPED one: build_key, status, reason, created), with `target` and `model` where collected
    (profile.collect) and `trace` its path under dist/ in the report."""

    target: str
    model: str
    build_key: str
    artifact_sha256: str
    trace: str
    created: str
    data_sets: int
    status: str
    reason: str
    runs: int
    warmup_runs: int
    run_ms: float
    kernel_share: float
    planned_providers: list[str]
    providers: dict[str, NodesTime]
    op_types: dict[str, NodesTime]
    operators: list[OperatorDoc]
    cpu_fallback: list[FallbackDoc]
