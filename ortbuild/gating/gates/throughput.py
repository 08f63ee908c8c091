"""The throughput gate: samples per second at a batch, from as many concurrent calls as the target allows (MLPerf
Offline; ortbuild.gating.measure.offline measures and judges)."""

from __future__ import annotations

from ortbuild.gating.protocol import Context, Gate, Judged


def run(ctx: Context) -> Judged:
    from ortbuild.gating.measure import offline

    return Judged(*offline.gate(ctx))


GATE = Gate("throughput", "samples per second at a batch (MLPerf Offline)", run,
            lambda g: g.latency.declares("offline"), timed=True)
