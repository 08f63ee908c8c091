"""The gates of `ortbuild test`, in the order they run: one line per gate, its module's `Gate`
(ortbuild.gating.protocol). A new gate is its module under gates/, one line here and its docs
(docs/design.md, "Adding a gate").

Stdlib only: the record reads the registry's names where only the stdlib is (the noxfile's summary); each gate
imports its measurement when it runs."""

from __future__ import annotations

from ortbuild.gating.gates import (
    accuracy,
    generation,
    latency,
    multistream,
    server,
    size,
    startup,
    task,
    throughput,
    tokens,
)
from ortbuild.gating.protocol import Gate

GATES: tuple[Gate, ...] = (
    accuracy.GATE,
    size.GATE,
    latency.GATE,
    startup.COLD_START,
    startup.MEMORY,
    task.GATE,
    throughput.GATE,
    server.GATE,
    multistream.GATE,
    tokens.GATE,
    generation.GATE,
)
NAMES = tuple(g.name for g in GATES)
BY_NAME = {g.name: g for g in GATES}
