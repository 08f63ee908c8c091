"""The size gate: an artifact's bytes against its target's budgets (a ratio to its source, and MiB), with the
targets.toml option that would make it smaller when it fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortbuild.gating.protocol import BOTH, Context, Gate, Judged
from ortbuild.gating.records import SizeDoc
from ortbuild.project.precisions import fp16_upcast_hint
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.artifact import manifest_types
    from ortbuild.project.plan import Job

SIZE_SLACK = 4096  # bytes a ratio budget allows on top: the container header, tags and graph metadata


def _fp16_growth(m: manifest_types.Manifest) -> float | None:
    """The artifact's size over its fp16 model's (the source with the weights the precision step converted, as
    it recorded them); None without that record."""
    changed: manifest_types.Changed | dict[str, int] = m.precision.changed or {}
    if "bytes_before" not in changed or "bytes_after" not in changed:
        return None
    fp16_model = m.source.size - int(changed["bytes_before"]) + int(changed["bytes_after"])
    return m.artifact.size / max(1, fp16_model)


def _upcast(job: Job, m: manifest_types.Manifest, where: str = "") -> str | None:
    """The build's advice when the CPU provider's optimization stored an fp16 artifact's weights as fp32 again."""
    return fp16_upcast_hint(job.settings.rule.quantizer, m.optimization.applied, m.optimization.optimized_with,
                            _fp16_growth(m), where)


def fix(job: Job, m: manifest_types.Manifest) -> str:
    """The targets.toml option that makes this artifact smaller, from what its build recorded."""
    where = f"[targets.{job.target.name}]"
    inf, changed, s = m.optimization.inflation, m.precision.changed, job.settings
    upcast = _upcast(job, m, where)
    if upcast:  # the level, not the budget: the same advice as the build's note
        return upcast
    if inf and "disabled" not in inf.get("action", ""):
        if s.constant_folding == "on":
            return f'constant_folding = "auto" (the default) or "off" in {where}: the build optimizes without it'
        return (f'constant folding was not the cause (disabling it did not help): raise size.max_ratio in {where} '
                "if this size is expected")
    if changed is not None and changed.get("converted", 1.0) < 0.5:
        return (f"the precision step converted only {changed['converted']:.0%} of the float weights (the build's "
                f"note says which ops hold the rest): name them in quantization.op_types in {where}")
    return f"raise size.max_ratio or size.max_mb in {where} if this size is expected"


def judge(job: Job, m: manifest_types.Manifest) -> tuple[SizeDoc, list[str]]:
    """The size record of the job's artifact, and the failure report's lines (none when it passes)."""
    gates = job.settings.gates
    assert gates is not None
    size, src = m.artifact.size, m.source.size
    ratio = size / src
    max_ratio, max_mb = gates.max_ratio(job.settings.precision), gates.size.max_mb
    record: SizeDoc = {"bytes": size, "source_bytes": src, "ratio": ratio, "max_ratio": max_ratio,
                       "max_mb": max_mb, "inflation": m.optimization.inflation}
    problems = []
    if size > max_ratio * src + SIZE_SLACK:
        problems.append(f"artifact {size / 1024:.1f} KB is {ratio:.2f}x its source ({src / 1024:.1f} KB), "
                        f"above max_ratio {max_ratio} (+ {SIZE_SLACK // 1024} KB)")
    if max_mb is not None and size > max_mb * (1 << 20):
        problems.append(f"artifact {size / (1 << 20):.2f} MiB is above max_mb {max_mb}")
    if not problems:
        return record, []
    lines = [f"size: {job.name} {'; '.join(problems)}"]
    inf = m.optimization.inflation
    if inf:
        grew = "the weights grew" if _upcast(job, m) else "constant folding grew the weights"
        lines.append(f"  {grew} {inf['growth']}x ({inf.get('action', '')}): "
                     + ", ".join(f"{x['initializer']} ({x['dtype']}, {x['bytes'] / 1024:.0f} KB, from "
                                 f"{x['pattern']})" for x in inf["grown"][:3]))
    lines.append(f"  hint: {fix(job, m)}")
    return record, lines


def run(ctx: Context) -> Judged:
    doc, lines = judge(ctx.job, ctx.manifest)
    return Judged(Verdict.FAIL if lines else Verdict.PASS, dict(doc), lines)


GATE = Gate("size", "the artifact's size against the source's and a cap", run, lambda g: True, kinds=BOTH)
