"""The `eval` gate: task accuracy on labelled data. The artifact (through its generated Python loader) and the fp32
source model (onnxruntime on the CPU provider, with the job's custom-op libraries) run on the same samples of the
model's evaluation set ([models.NAME.eval]), read lazily a batch at a time; what the metric needs is kept per
sample (ortbuild.gating.measure.taskmetrics), and the drop of the metric from the source to the artifact is bounded
at the target's confidence (ortbuild.gating.measure.taskstats: exact for accuracy, a paired bootstrap otherwise).
PASS when the drop's upper bound is within `[targets.NAME.eval] max_drop`, FAIL when its lower bound is above
it, else INCONCLUSIVE with about how many samples would decide. docs/testing.md, "Task accuracy on labelled data".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ortbuild import runtime
from ortbuild.artifact.manifest_types import Manifest
from ortbuild.errors import ConfigError
from ortbuild.gating.measure import emulated, taskmetrics, taskstats
from ortbuild.gating.measure.labelled import EvalData
from ortbuild.project import data
from ortbuild.project.checker import did_you_mean
from ortbuild.project.plan import Job
from ortbuild.project.settings import EvalSet
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.protocol import Context

NAME = "eval"
DEFAULT_BATCH = 16
PROGRESS_EVERY = 50                  # batches between progress lines
MAX_LISTED = 8                       # samples named where the artifact's output is NaN or infinite
Result = tuple[Verdict | Literal["-"], dict[str, object], list[str]]


def gate(ctx: Context) -> Result:
    """The eval gate of one job: (verdict, report section, failure lines); "-" and {} where the target sets no
    `eval.max_drop` for this model."""
    job = ctx.job
    assert job.settings.gates is not None
    budget, ev = job.settings.gates.eval, job.model.eval
    if budget.max_drop is None or ev is None:
        return "-", {}, []
    if emulated.emulated(job.target):
        return Verdict.SKIPPED, {"note": f"not judged on {job.target.platform} under emulation: the eval gate runs "
                                         "the artifact on every sample, on a runner of that platform"}, []
    config, where = str(ctx.project.file), f"models.{job.model.name}.eval"
    metric = taskmetrics.resolve(ev.metric, ctx.project.root, config, where)
    evalset = EvalData(ev, config, where)
    source = _source(job)
    output = _output(ev, [o.name for o in source.get_outputs()], config, where)
    batch, pad_to = _batch(ev, ctx.manifest)
    labels = np.asarray(evalset.labels[:evalset.samples])
    if metric.name in ("accuracy", "f1"):
        labels = taskmetrics.class_labels(labels, config, where)
    ctx.progress(job.name, f"eval: {metric.name} of the artifact and the fp32 source on {evalset.samples} labelled "
                           f"samples, {batch} per run")
    artifact = ctx.open()
    kept: dict[str, list[np.ndarray]] = {"source": [], "artifact": []}
    for i, b in enumerate(evalset.batches(batch, pad_to)):
        if i == 0:
            data.check_feed(b.feed, ctx.manifest.io, str(evalset.files[0]), config=config, key=f"{where}.inputs")
        got = {"source": source.run([output], b.feed)[0], "artifact": artifact.run(b.feed)[output]}
        for who, out in got.items():
            try:
                kept[who].append(metric.keep(np.asarray(out)[:b.count], labels[b.start:b.start + b.count], output))
            except ValueError as e:
                raise ConfigError(config, where, str(e)) from None
        if i and i % PROGRESS_EVERY == 0:
            ctx.progress(job.name, f"eval: {b.start + b.count} of {evalset.samples} samples")
    src, art = (np.concatenate(kept[w]) for w in ("source", "artifact"))
    check_source(metric, src, labels, config, where, output)
    return judge(job.name, metric, src, art, labels, budget.max_drop, budget.confidence,
                 {"output": output, "batch": batch, "inputs": str(ev.inputs), "labels": str(ev.labels)})


def judge(job: str, metric: taskmetrics.Metric, src: np.ndarray, art: np.ndarray, labels: np.ndarray,
          max_drop: float, confidence: float, extra: dict[str, object] | None = None) -> Result:
    """The verdict, section and failure lines of what was kept per sample for the source and the artifact."""
    n = len(labels)
    if (broken := non_finite(art) & ~non_finite(src)).any():
        return _broken(job, metric, np.flatnonzero(broken), n, max_drop, confidence, extra)
    score_src, score_art = metric.score(src, labels), metric.score(art, labels)
    counts: tuple[int, int] | None = None
    if metric.name == "accuracy" and metric.custom is None:
        right_src, right_art = src == labels, art == labels
        counts = (int(np.sum(right_src & ~right_art)), int(np.sum(~right_src & right_art)))
        bounds = taskstats.accuracy_bounds(*counts, n, confidence)
        method = ("exact paired: one-sided Clopper-Pearson bounds of b/n and c/n at 1 - (1 - confidence) / 2 each, "
                  "combined (Bonferroni): hi = U(b) - L(c), lo = L(b) - U(c)")
    else:
        sign = 1.0 if metric.higher_is_better else -1.0

        def drop_of(idx: np.ndarray) -> float:
            return sign * (metric.score(src[idx], labels[idx]) - metric.score(art[idx], labels[idx]))

        bounds = taskstats.bootstrap_bounds(drop_of, n, confidence)
        method = (f"paired percentile bootstrap: {taskstats.RESAMPLES} resamples of the samples (seed "
                  f"{taskstats.SEED}), the same indices for the source and the artifact")
    verdict = bounds.verdict(max_drop)
    note = ""
    if counts is None and n < taskstats.MIN_BOOTSTRAP and verdict != Verdict.INCONCLUSIVE:
        verdict = Verdict.INCONCLUSIVE
        note = (f"{n} samples are too few for a bootstrap interval (at least {taskstats.MIN_BOOTSTRAP}); give more "
                "samples")
    elif verdict == Verdict.INCONCLUSIVE:
        note = _undecided(bounds, n, max_drop, counts)
    section: dict[str, object] = {
        "summary": f"{metric.name} {score_src:.4g} -> {score_art:.4g}, drop {bounds.drop + 0.0:.3g} "
                   f"[{bounds.lo + 0.0:.3g}, {bounds.hi + 0.0:.3g}] / {max_drop:g} on {n}",  # (+ 0.0: no "-0")
        "budget": {"metric": metric.name, "max_drop": max_drop, "confidence": confidence},
        "metric": metric.name, "higher_is_better": metric.higher_is_better, "samples": n,
        "source": score_src, "artifact": score_art, "drop": bounds.drop, "interval": [bounds.lo, bounds.hi],
        "confidence": confidence, "max_drop": max_drop, "method": method, **(extra or {}), "verdict": verdict}
    if counts is not None:
        section["discordant"] = {"source_right_artifact_wrong": counts[0], "artifact_right_source_wrong": counts[1],
                                 "mcnemar_p": taskstats.mcnemar_p(*counts)}
    if note:
        section["note"] = note
    lines = []
    if verdict == Verdict.FAIL:
        lines = [f"eval: {job} {metric.name} dropped {bounds.drop:.4g} from the fp32 source ({score_src:.4g} -> "
                 f"{score_art:.4g} on {n} samples): at least {bounds.lo:.4g} with {confidence:.0%} confidence "
                 f"(interval [{bounds.lo:.4g}, {bounds.hi:.4g}]) > max_drop {max_drop:g}",
                 "  the artifact loses task accuracy: keep the sensitive nodes in float (`ortbuild test --explain`), "
                 "calibrate on realistic data, or use a higher precision"]
    return verdict, section, lines


def check_source(metric: taskmetrics.Metric, src: np.ndarray, labels: np.ndarray, config: str, where: str,
                 output: str) -> None:
    """mae: a NaN or infinite label, or fp32 source error, is the evaluation set's fault (no drop can be measured
    from it): a ConfigError naming the key and the samples."""
    if metric.name != "mae" or metric.custom is not None:
        return
    for key, bad, said in (("labels", np.flatnonzero(~np.isfinite(labels.reshape(len(labels), -1)).all(axis=1)),
                            "labels are NaN or infinite"),
                           ("inputs", np.flatnonzero(non_finite(src)),
                            f"the fp32 source's output '{output}' is NaN or infinite")):
        if len(bad):
            shown = ", ".join(str(int(i)) for i in bad[:MAX_LISTED]) + (", ..." if len(bad) > MAX_LISTED else "")
            raise ConfigError(config, f"{where}.{key}", f"{said} on {len(bad)} of {len(labels)} samples ({shown})",
                              "mae needs finite labels and samples the source model computes a finite output for: "
                              "leave those samples out")


def non_finite(kept: np.ndarray) -> np.ndarray:
    """Per sample, whether what was kept of it (an error, or a custom metric's output rows) holds a NaN or an
    infinity (never for a predicted class)."""
    if kept.dtype.kind not in "fc":
        return np.zeros(len(kept), dtype=bool)
    return np.asarray(~np.isfinite(kept.reshape(len(kept), -1)).all(axis=1))


def _broken(job: str, metric: taskmetrics.Metric, bad: np.ndarray, n: int, max_drop: float, confidence: float,
            extra: dict[str, object] | None) -> Result:
    """FAIL: the artifact's output is NaN or infinite where the source's is finite (no score, no interval)."""
    first = [int(i) for i in bad[:MAX_LISTED]]
    shown = ", ".join(map(str, first)) + (", ..." if len(bad) > MAX_LISTED else "")
    said = f"the artifact's output is NaN or infinite on {len(bad)} of {n} samples ({shown})"
    section: dict[str, object] = {
        "summary": f"{metric.name}: {len(bad)} of {n} outputs NaN/inf", "budget": {
            "metric": metric.name, "max_drop": max_drop, "confidence": confidence},
        "metric": metric.name, "higher_is_better": metric.higher_is_better, "samples": n, "confidence": confidence,
        "max_drop": max_drop, "non_finite": {"samples": len(bad), "first": first}, **(extra or {}),
        "verdict": Verdict.FAIL}
    return Verdict.FAIL, section, [f"eval: {job}: {said}, where the fp32 source's is finite",
                                   "  the artifact is numerically broken there: an overflow in a reduced precision "
                                   "(keep the node in float: `ortbuild test --explain`), or a wrong calibration"]


def _undecided(bounds: taskstats.Bounds, n: int, max_drop: float, counts: tuple[int, int] | None) -> str:
    found = (f"{NAME}: drop {bounds.drop:.4g}, interval [{bounds.lo:.4g}, {bounds.hi:.4g}] at "
             f"{bounds.confidence:.0%} holds max_drop {max_drop:g}")
    more = taskstats.needed(bounds, n, max_drop, counts)
    if more is None:
        return f"{found}: the drop sits on max_drop, no number of samples would decide"
    if more > taskstats.MOST_SAMPLES:
        return f"{found}: more than {taskstats.MOST_SAMPLES:,} samples would be needed to decide"
    return f"{found}: about {more:,} samples (of {n} now) would probably decide it"


def _source(job: Job) -> Any:
    """The fp32 source model on the CPU provider, with the job's custom-op libraries."""
    ort = runtime.import_ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    runtime.register_custom_ops(so, job.settings.custom_ops)
    return ort.InferenceSession(str(job.model.path), so, providers=["CPUExecutionProvider"])


def _output(ev: EvalSet, names: list[str], config: str, where: str) -> str:
    if not ev.output:
        return names[0]
    if ev.output not in names:
        raise ConfigError(config, f"{where}.output", f"the model has no output '{ev.output}'"
                                                     f"{did_you_mean(ev.output, names)}",
                          f"its outputs are: {', '.join(names)}")
    return ev.output


def _batch(ev: EvalSet, m: Manifest) -> tuple[int, int | None]:
    """Samples per run, and the fixed batch size the artifact needs (None: its first dimensions are free)."""
    firsts = {i["shape"][0] for i in m.io["inputs"] if i["shape"]}
    pinned = [m.free_dimensions[d] if isinstance(d, str) else d for d in firsts if d in m.free_dimensions or
              (isinstance(d, int) and d > 0)]  # a named dimension the target pins (free_dimensions) is fixed too
    fixed = pinned[0] if pinned else None
    if fixed is not None:
        return fixed, fixed
    return ev.batch or DEFAULT_BATCH, None
