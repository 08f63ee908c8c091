"""The bounded search of `ortbuild test --explain` (steps 4 and 5): candidate sets kept in float, each a rebuild and
a re-test, and the `[[targets.X.overrides]]` table that gives the answer.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ortbuild.gating.records import SkippedSet, TrialDoc
from ortbuild.gating.search.base import Clock
from ortbuild.gating.search.layerwise import Layer, Prediction
from ortbuild.project import config, lockfile
from ortbuild.project.plan import Job
from ortbuild.project.precisions import SearchKnob
from ortbuild.status import Event, PhaseStarted, Verdict


def settings_with(settings: config.Settings, knob: SearchKnob, nodes: Sequence[str], op_types: Sequence[str]) \
        -> config.Settings:
    """The settings with `nodes` (and `op_types`) kept in float, added to the target's own lists."""
    opts = getattr(settings, knob.table)
    changes: dict[str, tuple[str, ...]] = {knob.nodes: tuple(dict.fromkeys([*getattr(opts, knob.nodes), *nodes]))}
    if knob.op_types is not None and op_types:
        changes[knob.op_types] = tuple(dict.fromkeys([*getattr(opts, knob.op_types), *op_types]))
    return dataclasses.replace(settings, **{knob.table: dataclasses.replace(opts, **changes)})


def changed_lists(base: config.Settings, knob: SearchKnob, settings: config.Settings) -> dict[str, list[str]]:
    """The knob's lists that `settings` changes from `base`, each whole (an override's list replaces the one below
    it, so the entries of `base` are repeated)."""
    opts, was = getattr(settings, knob.table), getattr(base, knob.table)
    return {k: list(getattr(opts, k)) for k in (knob.op_types, knob.nodes)
            if k is not None and getattr(opts, k) != getattr(was, k)}


def override_toml(job: Job, knob: SearchKnob, settings: config.Settings) -> str:
    """The `[[targets.X.overrides]]` table that gives the job `settings`' knob lists (the job's own entries, the
    target's and its earlier overrides', repeated)."""
    items = ", ".join(f"{k} = {json.dumps(v)}" for k, v in changed_lists(job.settings, knob, settings).items())
    return (f"[[targets.{config.toml_key(job.target.name)}.overrides]]\nmodels = {json.dumps([job.model.name])}\n"
            f"{knob.table} = {{ {items} }}\n")


def check_override(project: config.Project, job: Job, text: str, expected: config.Settings) -> None:
    """Parse targets.toml with `text` appended: the model's settings must be those that were tested, its gates
    (budgets and accuracy rule, outside the settings' equality) those it had."""
    parsed = config.load_pasted(project.file, text).targets[job.target.name].settings[job.model.name]
    if job.locked is not None and lockfile.variant(job.locked.applies):  # a candidate the lock lays over
        knob = expected.rule.knob
        assert knob is not None
        parsed = dataclasses.replace(expected, **{knob.table: dataclasses.replace(
            getattr(expected, knob.table), **changed_lists(expected, knob, parsed))})
    if parsed != expected or parsed.gates != expected.gates:
        raise AssertionError(f"the printed override does not yield the tested settings: {parsed} != {expected}")


def describe_set(nodes: Sequence[str], op_types: Sequence[str]) -> str:
    return (f"op types {', '.join(op_types)}" if op_types else
            f"{len(nodes)} node(s) {', '.join(nodes[:6])}{' ...' if len(nodes) > 6 else ''}")


@dataclass
class Trial:
    nodes: list[str]
    op_types: list[str]
    passed: bool
    worst: str
    seconds: float

    def as_json(self) -> TrialDoc:
        return {"nodes": list(self.nodes), "op_types": list(self.op_types), "passed": self.passed,
                "worst": self.worst, "seconds": self.seconds}

    def describe(self) -> str:
        verdict = Verdict.PASS if self.passed else Verdict.FAIL
        return f"{describe_set(self.nodes, self.op_types)}: {verdict} ({self.worst})"


@dataclass
class Bisection:
    """The bounded search over candidate sets; every trial is a rebuild and a re-test, counted on `clock` (the
    explain search's budget, started once: base.Clock).

    graph: the digest of the precision step's output for a candidate set (graph_digest); a set whose graph was
    tried already (`graphs`, the failing artifact's included as -1) is not rebuilt and takes that verdict.
    predict: judges a set of nodes without a rebuild (Proxy.predict); with it, the first set rebuilt is the
    fewest top-ranked candidates predicted to pass."""

    trial: Callable[[list[str], list[str]], tuple[bool, str]]
    clock: Clock
    progress: Callable[[Event | str], None]  # a rebuild's start is a PhaseStarted, said on every stream
    graph: Callable[[list[str], list[str]], str] | None = None
    predict: Callable[[list[str]], Prediction | None] | None = None
    trials: list[Trial] = field(default_factory=list)
    skipped: list[SkippedSet] = field(default_factory=list)   # sets not rebuilt: the same graph as `same_as`
    graphs: dict[str, int] = field(default_factory=dict)          # digest -> index of its trial (-1: the artifact)
    predicted: dict[frozenset[str], bool] = field(default_factory=dict)
    stopped: str = ""

    def budget_left(self) -> bool:
        if self.clock.out_of_rebuilds():
            self.stopped = f"stopped after {self.clock.budget.rebuilds} rebuilds (--explain-rebuilds)"
        elif self.clock.out_of_time():
            self.stopped = f"stopped after {self.clock.budget.seconds:g} s (--explain-seconds)"
        return not self.stopped

    def _of(self) -> str:
        return "" if self.clock.budget.rebuilds is None else f"/{self.clock.budget.rebuilds}"

    def run(self, nodes: list[str], op_types: list[str]) -> bool:
        for t in self.trials:  # a candidate is never built twice
            if (t.nodes, t.op_types) == (nodes, op_types):
                return t.passed
        for s in self.skipped:
            if (s["nodes"], s["op_types"]) == (nodes, op_types):
                return bool(s["passed"])
        digest = None
        if self.graph is not None:
            try:
                digest = self.graph(nodes, op_types)
            except Exception:  # the precision step failing for this set: the rebuild says how, as its verdict
                digest = None
        if digest is not None and digest in self.graphs:  # every rebuild changes the graph
            k = self.graphs[digest]
            passed = k >= 0 and self.trials[k].passed
            same = "the failing artifact" if k < 0 else f"rebuild {k + 1}"
            self.skipped.append({"nodes": nodes, "op_types": op_types, "same_as": same, "passed": passed})
            self.progress(f"explain: not rebuilt: {describe_set(nodes, op_types)}: the precision step gives the "
                          f"same graph as {same}")
            return passed
        self.progress(PhaseStarted(f"explain: rebuilding {len(self.trials) + 1}{self._of()}: "
                                   f"{describe_set(nodes, op_types)}"))
        t0 = time.monotonic()
        passed, worst = self.trial(nodes, op_types)
        t = Trial(nodes, op_types, passed, worst, round(time.monotonic() - t0, 2))
        self.trials.append(t)
        self.clock.rebuilt()
        if digest is not None:
            self.graphs[digest] = len(self.trials) - 1
        self.progress(f"explain: rebuild {len(self.trials)}{self._of()}: {t.describe()}")
        return passed

    def _predicts_pass(self, nodes: list[str]) -> bool:
        key = frozenset(nodes)
        if key not in self.predicted:
            assert self.predict is not None
            p = self.predict(nodes)
            self.predicted[key] = p is not None and p.passed
        return self.predicted[key]

    def guess(self, order: list[str]) -> list[str] | None:
        """The fewest top-ranked nodes of `order` predicted to pass (prefixes of 1, 2, 4 ... nodes, then halving
        the gap), made smaller one node at a time, the lowest-ranked first; None where no prefix is predicted to
        pass. All of them is no answer (the model in float). Predictions only: no rebuild."""
        top = len(order) - 1
        if top < 1:
            return None
        failing, k = 0, 1
        while True:
            if not self.budget_left():
                return None
            if self._predicts_pass(order[:k]):
                break
            if k >= top:
                return None
            failing, k = k, min(2 * k, top)
        while failing + 1 < k and self.budget_left():
            mid = (failing + k) // 2
            if self._predicts_pass(order[:mid]):
                k = mid
            else:
                failing = mid
        best = order[:k]
        for n in reversed(order[:k]):
            if len(best) <= 1 or not self.budget_left():
                break
            rest = [x for x in best if x != n]
            if self._predicts_pass(rest):
                best = rest
        return best

    def search(self, layers: list[Layer], op_keys: bool) -> tuple[list[str], list[str]] | None:
        """The smallest passing (nodes, op types) found, or None. `layers` in the order of the ranking; those the
        golden inputs do not run (inside an If branch not taken) are not searched."""
        layers = [x for x in layers if x.ran]
        if self.predict is not None:
            guess = self.guess([x.node for x in layers if x.alone is not None])
            if guess is not None and self.budget_left() and self.run(guess, []):
                return guess, []
        position: dict[str, int] = {}
        for i, x in enumerate(layers):
            position.setdefault(x.op_type, i)
        groups = sorted(position, key=position.__getitem__)
        members = {o: [x.node for x in layers if x.op_type == o] for o in groups}

        def try_ops(ops: list[str]) -> bool:
            if op_keys:
                return self.run([], ops)
            return self.run([n for o in ops for n in members[o]], [])

        found: list[str] | None = None
        for o in groups:
            if not self.budget_left():
                break
            if try_ops([o]):
                found = [o]
                break
        if found is None and len(groups) > 1 and self.budget_left() and try_ops(groups):
            lo, hi = 1, len(groups)  # the fewest top-ranked op types that pass together
            while lo + 1 < hi and self.budget_left():
                mid = (lo + hi) // 2
                if try_ops(groups[:mid]):
                    hi = mid
                else:
                    lo = mid
            found = groups[:hi]
        if found is None:
            return None
        order = {x.node: i for i, x in enumerate(layers)}
        best = sorted((n for o in found for n in members[o]), key=order.__getitem__)
        narrowed = False
        while len(best) > 1 and self.budget_left():  # bisect the passing set
            half = len(best) // 2
            if self.run(best[:half], []):
                best, narrowed = best[:half], True
            elif self.budget_left() and self.run(best[half:], []):
                best, narrowed = best[half:], True
            else:
                break
        for n in reversed(list(best)):  # then drop single nodes, the least harmful first
            if len(best) <= 1 or not self.budget_left():
                break
            rest = [x for x in best if x != n]
            if self.run(rest, []):
                best, narrowed = rest, True
        if not narrowed and op_keys:
            return [], found  # the op types themselves: the shorter override
        return best, []
