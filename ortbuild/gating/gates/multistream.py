"""The multi_stream gate: latency of queries of N concurrent samples (MLPerf MultiStream;
ortbuild.gating.measure.multistream measures and judges)."""

from __future__ import annotations

from ortbuild.gating.protocol import Context, Gate, Judged


def run(ctx: Context) -> Judged:
    from ortbuild.gating.measure import multistream

    return Judged(*multistream.gate(ctx))


GATE = Gate("multi_stream", "latency of queries of N concurrent samples (MLPerf MultiStream)", run,
            lambda g: g.latency.declares("multi_stream"), timed=True)
