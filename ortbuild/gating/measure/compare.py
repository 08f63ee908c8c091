"""Compare an artifact's outputs with the golden ones, per output, under a named rule.

Float tensors: elementwise `|actual - expected| <= atol + rtol * |expected|` (with an allowed mismatch
fraction), cosine similarity, top-1 / top-5 agreement over the last axis, plus error statistics (max,
mean, median, p99 of absolute and relative error) and NaN/Inf checks. Integer, boolean and string tensors
match exactly. Sequence and map outputs (classic-ML models: ZipMap) match exactly in structure, keys and
non-float values; their float values are compared as one flattened float tensor under the same rule.
Shapes and dtypes are always checked. A failed check carries what a user needs to act: observed vs
allowed, how many elements broke it, the worst element, and the smallest tolerance that would have passed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, cast

import numpy as np

from ortbuild.gating.records import CheckDoc, OutputDoc, OutputStats, Rule


@dataclass(frozen=True)
class Check:
    metric: str      # elementwise | cosine | top1 | top5 | exact | shape | dtype | nonfinite | structure
    passed: bool
    observed: str
    allowed: str

    def as_json(self) -> CheckDoc:
        return {"metric": self.metric, "passed": self.passed, "observed": self.observed, "allowed": self.allowed}


@dataclass
class OutputResult:
    output: str
    dataset: str
    rule: Rule                       # the rule applied (after precision defaults and overrides)
    checks: list[Check] = field(default_factory=list)
    stats: OutputStats = field(default_factory=OutputStats)   # error statistics, mismatches, worst element
    ignored: bool = False

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def as_json(self) -> OutputDoc:
        # asdict: every field in order, a deep copy (nothing shared with this result); OutputDoc names the same
        return cast(OutputDoc, {**asdict(self), "passed": self.passed})


def _item(x: object) -> object:
    """A numpy scalar as the Python value it holds."""
    return x.item() if hasattr(x, "item") else x


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# top-k agreement: k, the rule's key, the statistic
TOP_K: tuple[tuple[int, str, Literal["top1_agreement", "top5_agreement"]], ...] = (
    (1, "top1", "top1_agreement"), (5, "top5", "top5_agreement"))


def _float_checks(res: OutputResult, a: np.ndarray, e: np.ndarray) -> None:
    """The float rule on arrays of equal shape (float64 inside)."""
    with np.errstate(invalid="ignore"):  # Inf - Inf: those elements are judged by the NaN/Inf check
        _float_rule(res, a, e)


def _float_rule(res: OutputResult, a: np.ndarray, e: np.ndarray) -> None:
    rule = res.rule
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    fin_a, fin_e = np.isfinite(a64), np.isfinite(e64)
    inf = np.isinf(a64) | np.isinf(e64)
    bad = int(((np.isnan(a64) != np.isnan(e64)) | (inf & (a64 != e64))).sum())
    res.checks.append(Check("nonfinite", bad == 0, f"{bad} NaN/Inf element(s) not in the expected output",
                            "NaN/Inf exactly where expected"))
    both = fin_a & fin_e
    diff = np.abs(a64 - e64)[both]
    mag = np.abs(e64)[both]
    rel = np.divide(diff, mag, out=np.where(diff > 0, np.inf, 0.0), where=mag > 0)
    if diff.size:
        res.stats.update({
            "max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "median_abs": float(np.median(diff)),
            "p99_abs": float(np.percentile(diff, 99)), "max_rel": float(rel.max()), "mean_rel": float(rel.mean()),
            "median_rel": float(np.median(rel)), "p99_rel": float(np.percentile(rel, 99))})
    n = a.size
    rtol, atol = rule.get("rtol"), rule.get("atol")
    if (rtol is not None or atol is not None) and n:
        rtol, atol = float(rtol or 0.0), float(atol or 0.0)
        full_diff = np.where(both, np.abs(a64 - e64), 0.0)
        tol = atol + rtol * np.abs(e64)
        excess = np.where(both, full_diff - tol, -np.inf)
        mism = int((excess > 0).sum())
        frac, allowed_frac = mism / n, float(rule.get("mismatch_fraction") or 0.0)
        worst = np.unravel_index(int(np.argmax(excess)), a.shape) if a.ndim else ()
        keep = 1.0 - allowed_frac  # the fraction of elements that must hold
        d, m = full_diff[both], np.abs(e64)[both]
        need_atol = float(np.quantile(np.maximum(d - rtol * m, 0.0), keep)) if d.size else 0.0
        need_rtol = float(np.quantile(np.divide(np.maximum(d - atol, 0.0), m, out=np.where(d > atol, np.inf, 0.0),
                                                where=m > 0), keep)) if d.size else 0.0
        res.stats.update({
            "mismatches": mism, "elements": n, "mismatch_fraction": frac,
            "worst": {"index": [int(i) for i in worst], "expected": float(e64[worst]), "actual": float(a64[worst]),
                      "abs_diff": float(abs(a64[worst] - e64[worst])), "tolerance": float(tol[worst])},
            "passing_tolerance": {"atol": need_atol, "with_rtol": rtol, "rtol": need_rtol, "with_atol": atol}})
        res.checks.append(Check(
            "elementwise", frac <= allowed_frac,
            f"{mism} of {n} elements ({frac:.2%}) break it",
            f"|actual - expected| <= {_fmt(atol)} + {_fmt(rtol)} * |expected| for all but {allowed_frac:.2%}"))
    cos_min = rule.get("cosine")
    if cos_min is not None and n:
        va, ve = np.where(both, a64, 0.0).ravel(), np.where(both, e64, 0.0).ravel()
        na, ne = float(np.linalg.norm(va)), float(np.linalg.norm(ve))
        cos = 1.0 if na == ne == 0 else (float(va @ ve) / (na * ne) if na and ne else 0.0)
        res.stats["cosine"] = cos
        res.checks.append(Check("cosine", cos >= cos_min, _fmt(cos), f">= {_fmt(cos_min)}"))
    for k, key, stat in TOP_K:
        limit = rule.get(key)
        if limit is None or a.ndim < 1 or a.shape[-1] <= k:
            continue
        rows_a, rows_e = a64.reshape(-1, a.shape[-1]), e64.reshape(-1, a.shape[-1])
        want = rows_e.argmax(axis=1)
        top = np.argsort(-rows_a, axis=1, kind="stable")[:, :k]
        agree = float((top == want[:, None]).any(axis=1).mean()) if len(rows_a) else 1.0
        res.stats[stat] = agree
        res.checks.append(Check(key, agree >= limit, f"{agree:.2%} of {len(rows_a)} row(s) agree",
                                f">= {limit:.2%}"))


def _flatten(value: object, path: str, floats: list[float], exact: list[tuple[str, object]]) -> object:
    """The structure of a sequence/map value (keys, lengths, types), collecting float leaves and others."""
    if isinstance(value, dict):
        return {"map": sorted((repr(k), _flatten(value[k], f"{path}[{k!r}]", floats, exact))
                              for k in sorted(value, key=repr))}
    if isinstance(value, list | tuple):
        return {"seq": [_flatten(v, f"{path}[{i}]", floats, exact) for i, v in enumerate(value)]}
    arr = np.asarray(value)
    if arr.dtype.kind in "fc":
        floats.extend(arr.astype(np.float64).ravel().tolist())
        return ("float", arr.shape)
    exact.append((path, arr.tolist()))
    return (str(arr.dtype.kind), arr.shape)


def compare(output: str, dataset: str, expected: object, actual: object, rule: Rule) -> OutputResult:
    """One output of one data set under `rule` (rtol, atol, mismatch_fraction, cosine, top1, top5, ignore)."""
    res = OutputResult(output, dataset, {k: v for k, v in rule.items() if v is not None})
    if rule.get("ignore"):
        res.ignored = True
        return res
    if isinstance(expected, list | dict) or isinstance(actual, list | dict):
        fe: list[float] = []
        fa: list[float] = []
        xe: list[tuple[str, object]] = []
        xa: list[tuple[str, object]] = []
        se, sa = _flatten(expected, output, fe, xe), _flatten(actual, output, fa, xa)
        same = se == sa
        res.checks.append(Check("structure", same, "same keys, lengths and types" if same else
                                "keys, lengths or element types differ", "identical structure and keys"))
        if not same:
            return res
        wrong = [(p, e, a) for (p, e), (_, a) in zip(xe, xa, strict=True) if e != a]
        res.checks.append(Check("exact", not wrong, f"{len(wrong)} of {len(xe)} non-float value(s) differ"
                                + (f"; first at {wrong[0][0]}: expected {wrong[0][1]!r}, actual {wrong[0][2]!r}"
                                   if wrong else ""), "equal"))
        if fe:
            _float_checks(res, np.asarray(fa), np.asarray(fe))
        return res
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        res.checks.append(Check("shape", False, str(list(a.shape)), f"{list(e.shape)} (the golden output's)"))
        return res
    float_a, float_e = a.dtype.kind in "fc", e.dtype.kind in "fc"
    if float_a != float_e or (not float_a and a.dtype.kind != e.dtype.kind and {a.dtype.kind, e.dtype.kind} != {
            "U", "O"}):
        res.checks.append(Check("dtype", False, str(a.dtype), f"{e.dtype} (the golden output's kind)"))
        return res
    if not float_a:
        eq = np.asarray(a == e) if a.dtype.kind not in "OU" else np.asarray(
            [x == y for x, y in zip(a.ravel().tolist(), e.ravel().tolist(), strict=True)]).reshape(a.shape)
        mism = int((~eq).sum())
        obs = f"{mism} of {a.size} elements differ"
        if mism:
            idx = np.unravel_index(int(np.argmin(eq)), a.shape) if a.ndim else ()
            res.stats["worst"] = {"index": [int(i) for i in idx], "expected": _item(e[idx]), "actual": _item(a[idx])}
            res.stats.update({"mismatches": mism, "elements": int(a.size), "mismatch_fraction": mism / max(1, a.size)})
            obs += f"; first at {list(map(int, idx))}: expected {_item(e[idx])!r}, actual {_item(a[idx])!r}"
        res.checks.append(Check("exact", mism == 0, obs, f"equal ({a.dtype} outputs match exactly)"))
        return res
    _float_checks(res, a, e)
    return res


def describe_failure(res: OutputResult) -> list[str]:
    """The lines of a failure report for one output (what failed, how far off, what would have passed)."""
    lines = [f"output '{res.output}' ({res.dataset}): " + "; ".join(
        f"{c.metric} {c.observed}, allowed {c.allowed}" for c in res.failed_checks)]
    s = res.stats
    if "worst" in s:
        w = s["worst"]
        beyond = f", |diff| {_fmt(w['abs_diff'])} > tolerance {_fmt(w['tolerance'])}" if "abs_diff" in w else ""
        lines.append(f"  worst element at {w['index']}: expected {w['expected']!r}, actual {w['actual']!r}{beyond}")
    if "mismatches" in s:
        lines.append(f"  {s['mismatches']} of {s['elements']} elements ({s['mismatch_fraction']:.2%}) mismatch")
    if "max_abs" in s:
        lines.append(f"  abs error max {_fmt(s['max_abs'])} mean {_fmt(s['mean_abs'])} median {_fmt(s['median_abs'])} "
                     f"p99 {_fmt(s['p99_abs'])}; rel error max {_fmt(s['max_rel'])} p99 {_fmt(s['p99_rel'])}")
    if "passing_tolerance" in s:
        t = s["passing_tolerance"]
        r = "inf" if math.isinf(t["rtol"]) else _fmt(t["rtol"])
        lines.append(f"  smallest tolerance that would pass: atol {_fmt(t['atol'])} (with rtol {_fmt(t['with_rtol'])}) "
                     f"or rtol {r} (with atol {_fmt(t['with_atol'])})")
    return lines


def worst_metric(results: list[OutputResult]) -> str:
    """A one-line summary for the table: the first failing check, else the tightest task metric."""
    for r in results:
        for c in r.failed_checks:
            return f"{r.output}: {c.metric} {c.observed}"
    shown = [r for r in results if not r.ignored]
    cos = [(r.stats["cosine"], r.output) for r in shown if "cosine" in r.stats]
    if cos:
        v, o = min(cos)
        return f"{o}: cosine {v:.6f}"
    err = [(r.stats["max_abs"], r.output) for r in shown if "max_abs" in r.stats]
    if err:
        v, o = max(err)
        return f"{o}: max abs err {v:.2g}"
    return "exact" if shown else "-"
