"""The eval gate: a task metric on the model's labelled data through the artifact against the fp32 source's on the
same samples, within `eval.max_drop` (ortbuild.gating.measure.task_eval: the measurement and its paired bounds)."""

from __future__ import annotations

from ortbuild.gating.protocol import Context, Gate, Judged


def run(ctx: Context) -> Judged:
    from ortbuild.gating.measure import task_eval

    return Judged(*task_eval.gate(ctx))


GATE = Gate("eval", "a task metric on labelled data against the fp32 source's, within max_drop", run,
            lambda g: g.eval.max_drop is not None, timed=True)
