"""The accuracy gate: each golden data set's outputs through the artifact against the source's, by the precision's
rule (ortbuild.gating.measure.compare), with the override that would accept a failure where one would
(ortbuild.gating.gates.accept)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortbuild.errors import ConfigError
from ortbuild.gating.protocol import Context, Gate, Judged
from ortbuild.status import Verdict

if TYPE_CHECKING:
    from ortbuild.gating.measure.compare import OutputResult
    from ortbuild.project.plan import Job


def target_outputs(ctx: Context, job: Job) -> list[str]:
    """The output names of every model of the job's target (read once per target and run)."""
    import onnx

    key = f"outputs:{job.target.name}"
    if key not in ctx.tester.cache:
        names: list[str] = []
        for m in job.target.models:
            graph = onnx.load(str(ctx.project.models[m].path), load_external_data=False).graph
            names += [o.name for o in graph.output if o.name not in names]
        ctx.tester.cache[key] = names
    found = ctx.tester.cache[key]
    assert isinstance(found, list)
    return found


def run(ctx: Context) -> Judged:
    from ortbuild.gating.gates import accept
    from ortbuild.gating.measure import compare
    from ortbuild.project.checker import did_you_mean

    job, outputs, g, m, gates = ctx.job, ctx.outputs, ctx.golden, ctx.manifest, ctx.gates
    names: list[str] = [o["name"] for o in m.io["outputs"]]
    known = target_outputs(ctx, job)
    for name in gates.accuracy.get("outputs", {}):  # a table may name another model's output, not a typo
        if name not in known:
            raise ConfigError(str(ctx.project.file), f"targets.{job.target.name}.accuracy.outputs.{name}",
                              f"no model of this target has an output '{name}'{did_you_mean(name, known)}",
                              f"the outputs are: {', '.join(known)}")
    compared: list[tuple[OutputResult, object, object]] = []  # each result, with expected and actual
    for ds, got in zip(g.sets, outputs, strict=True):
        for name in names:
            rule = gates.accuracy_rule(job.settings.precision, name)
            compared.append((compare.compare(name, ds.name, ds.expected[name], got[name], rule),
                             ds.expected[name], got[name]))
    results = [r for r, _, _ in compared]
    failed = [r for r in results if not r.passed]
    lines = [f"accuracy: {job.name} " + line if i == 0 else line
             for r in failed for i, line in enumerate(compare.describe_failure(r))]
    if failed and (advice := accept.advice(ctx.project, job, names, compared, g)):
        lines += advice
    section: dict[str, object] = {"outputs": [r.as_json() for r in results], "worst": compare.worst_metric(results)}
    return Judged(Verdict.FAIL if failed else Verdict.PASS, section, lines)


GATE = Gate("accuracy", "golden outputs against the source's, by the precision's rule", run, lambda g: True)
