"""Speed claims checked (docs/testing.md, "Speed claims"): in one `ortbuild test` run, a reduced precision
(fp16, int8, int4) measured slower than the fp32 artifact of the same model on the same providers, or a fusion
measured slower than the same model, precision and providers without it, is a warning in the test summary and a
`speed` record in the slower artifact's test report.

Slower means the two medians' confidence intervals do not overlap: this artifact's lower bound on its p50 is
above the other's upper bound, each at the targets' latency confidence, from the binomial order statistics the
latency gate decides its budgets with (ortbuild.gating.measure.percentiles). Sampling noise does not warn. The two were
timed one after the other, not interleaved: where either was measured under load or drifting (its data set's
`unstable` notes) the warning says so, since the load alone could make one slower. A warning fails nothing;
`latency.faster_than` (paired, interleaved samples) is what fails a target that is slower than it should be,
and the warning says whether the target asks for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortbuild.gating.measure import percentiles
from ortbuild.gating.timing_records import DataSetLatency, LatencyDoc, SpeedDoc
from ortbuild.project import precisions
from ortbuild.project.plan import Job

P50 = 0.5
# settings that make two artifacts of one model differ besides the one compared: the reference is the candidate
# that differs from the artifact in the fewest of them (then the first in the run's order)
ALIKE = ("optimization", "format", "session", "constant_folding", "disabled_optimizers", "fusion", "quantization")


@dataclass(frozen=True)
class Interval:
    """A median and its confidence bounds, in ms (each bound one-sided at `confidence`)."""

    p50: float
    lower: float
    upper: float
    confidence: float


def interval(samples: Sequence[float], confidence: float) -> Interval | None:
    """The p50 of `samples` and its bounds at `confidence`; None when there are too few samples to bound it."""
    xs = sorted(samples)
    n = len(xs)
    lo, up = percentiles.lower_rank(n, P50, confidence), percentiles.upper_rank(n, P50, confidence)
    if not n or lo is None or up is None:
        return None
    return Interval(percentiles.nearest_rank(xs, P50), xs[lo - 1], xs[up - 1], confidence)


def slower(mine: Interval, other: Interval) -> bool:
    """Whether `mine` is slower than `other` beyond noise: the intervals do not overlap, mine above."""
    return mine.lower > other.upper


@dataclass(frozen=True)
class Claim:
    """An artifact that should be faster than another of the same model (`kind`: precision or fusion)."""

    kind: str
    what: str
    mine: Job
    than: Job


def _differences(a: Job, b: Job, skip: str) -> int:
    return sum(getattr(a.settings, k) != getattr(b.settings, k) for k in ALIKE if k != skip)


def _reference(job: Job, jobs: Sequence[Job], kind: str) -> Job | None:
    """The artifact of this run that `job`'s precision (kind "precision") or fusion (kind "fusion") derives from."""
    s = job.settings

    def candidate(o: Job) -> bool:
        t = o.settings
        if o is job or o.model.name != job.model.name or t.providers != s.providers or \
                o.target.platform != job.target.platform:
            return False
        if kind == "precision":
            return t.precision == precisions.FP32
        return t.precision == s.precision and not t.fusion.enabled

    found = [o for o in jobs if candidate(o)]
    return min(found, key=lambda o: _differences(job, o, "quantization" if kind == "precision" else "fusion"),
               default=None)


def claims(jobs: Sequence[Job]) -> list[Claim]:
    """Each reduced precision against its fp32 artifact and each fusion against the artifact without it, where
    `jobs` (one run's) hold both."""
    out = []
    for job in jobs:
        s = job.settings
        if s.precision != precisions.FP32 and (ref := _reference(job, jobs, "precision")) is not None:
            out.append(Claim("precision", str(s.precision), job, ref))
        if s.fusion.enabled and (ref := _reference(job, jobs, "fusion")) is not None:
            out.append(Claim("fusion", f"fusion {s.fusion.model_type}", job, ref))
    return out


def _data_sets(lat: LatencyDoc) -> list[DataSetLatency]:
    return lat.get("data_sets") or []


def faster_than_note(claim: Claim, entry: DataSetLatency) -> tuple[str, str]:
    """The verdict of the target's own `latency.faster_than` against the reference ("" when it asks none), and
    what the warning says about it."""
    ft = claim.mine.settings.gates.latency.faster_than if claim.mine.settings.gates else None
    rel = entry.get("relative") or {}
    if ft is not None and ft.target == claim.than.target.name:
        verdict = str(rel.get("verdict", "-"))
        return verdict, (f"its latency.faster_than (ratio {ft.ratio:g} against {ft.target}) judged it {verdict}")
    return "", (f"it fails where the target asks, with latency.faster_than = {{ target = "
                f"\"{claim.than.target.name}\", ratio = 1 }} in [targets.{claim.mine.target.name}] (or its "
                f"[[overrides]] for {claim.mine.model.name})")


def judge(claim: Claim, mine: DataSetLatency, than: DataSetLatency, confidence: float) -> SpeedDoc | None:
    """The warning when `claim`'s artifact was slower than its reference on one data set (both timed), else None."""
    a, b = interval(mine.get("samples_ms") or [], confidence), interval(than.get("samples_ms") or [], confidence)
    if a is None or b is None or not slower(a, b):
        return None
    ratio = b.p50 / a.p50
    verdict, note = faster_than_note(claim, mine)
    name = mine.get("name", "")
    on = f" on {name}" if name and name != "test_data_set_0" else ""
    unstable = [f"{who}: {why}" for who, entry in ((claim.mine.name, mine), (claim.than.name, than))
                for why in entry.get("unstable") or []]
    loaded = f"; measured under load or drift, which alone can slow one: {'; '.join(unstable)}" if unstable else ""
    message = (f"{claim.what} is {ratio:.2f}x the speed of {claim.than.name}{on} (p50 {a.p50:.3f} ms vs "
               f"{b.p50:.3f} ms; at {confidence:.0%} confidence at least {a.lower:.3f} ms vs at most {b.upper:.3f} "
               f"ms{loaded}); {note}")
    return {"kind": claim.kind, "what": claim.what, "than": claim.than.name, "data_set": name,
            "speed_ratio": round(ratio, 4), "p50_ms": a.p50, "than_p50_ms": b.p50, "lower_ms": a.lower,
            "than_upper_ms": b.upper, "confidence": confidence, "faster_than": verdict, "unstable": unstable,
            "message": message}


def check(measured: Sequence[tuple[Job, LatencyDoc]]) -> list[list[SpeedDoc]]:
    """Each job's false speed claims (in `measured`'s order), from the latency of every job of one run (an
    empty LatencyDoc: not timed), judged per data set that both timed, at the lower of the two confidences."""
    jobs = [j for j, _ in measured]
    latency = {j.name: lat for j, lat in measured}
    found: dict[str, list[SpeedDoc]] = {}
    for claim in claims(jobs):
        mine, than = latency[claim.mine.name], latency[claim.than.name]
        theirs = {d.get("name"): d for d in _data_sets(than)}
        confidence = min(float(mine.get("confidence", 0.99)), float(than.get("confidence", 0.99)))
        for entry in _data_sets(mine):
            other = theirs.get(entry.get("name"))
            doc = None if other is None else judge(claim, entry, other, confidence)
            if doc is not None:
                found.setdefault(claim.mine.name, []).append(doc)
    return [found.get(j.name, []) for j in jobs]
