"""The server gate: latency percentiles under Poisson arrivals at a rate (MLPerf Server), and with --find-peak the
highest rate that meets them (ortbuild.gating.measure.server measures, judges and draws its part of report.html)."""

from __future__ import annotations

from ortbuild.gating.protocol import Context, Gate, Judged


def run(ctx: Context) -> Judged:
    from ortbuild.gating.measure import server

    return Judged(*server.gate(ctx))


def html(section: dict[str, object]) -> list[str]:
    from ortbuild.gating.measure import server

    return server.html(section)


GATE = Gate("server", "latency percentiles under Poisson arrivals at a rate (MLPerf Server), --find-peak", run,
            lambda g: g.latency.declares("server"), timed=True, html=html)
