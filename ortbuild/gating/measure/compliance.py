"""Outputs under load (MLPerf's compliance test TEST01): a sample of the outputs returned while timing is
compared with the artifact's own outputs of the accuracy run for the same input, under the precision's
accuracy rule (ortbuild.gating.measure.compare, so an execution provider that is not bit-for-bit deterministic
but within the rule passes). A session that misbehaves when it runs many times or concurrently (shared state in a
custom op, a stateful operator, threads) returns other outputs there than in its one accuracy run: the latency gate's
`compliance` part FAILs, naming the request and the difference.

The sample: requests are numbered in the order they are issued (from 0, over every attempt of the data set),
and every `every`-th one is kept, from an offset drawn from a fixed seed (the same requests every run). Only a
reference to the outputs is kept, outside the timed region (latency.sample's `seen`; `wrap` for callers that
time around the call themselves), at most MAX_KEPT per checker (reservoir sampling over the chosen requests,
from the same seed); they are compared after timing, so timing is not inflated by the comparison.

`every` for the latency gate (every_for): about 1 request in EVERY (10), and at least AT_LEAST (5) by the
sampling plan's first look (the default first look at 20 samples: every 4th request), so a gate that stops at
its first look still checks a handful.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ortbuild.gating.measure import compare
from ortbuild.gating.records import Rule
from ortbuild.gating.timing_records import ComplianceDoc, DataSetLatency, MismatchDoc
from ortbuild.status import Verdict

EVERY = 10          # about 1 request in 10 is checked ...
AT_LEAST = 5        # ... and at least 5 by the first look
SEED = 1            # which requests: the offset and the reservoir draw from this seed
MAX_KEPT = 100      # outputs kept per checker (memory: 100 references to outputs the session returned)
MAX_REPORTED = 20   # mismatches in the report (the count says how many there were)
MAX_DESCRIBED = 3   # mismatches described in the failure lines
MAX_LISTED = 8      # request indices listed there


def every_for(first_look: int, every: int = EVERY, at_least: int = AT_LEAST) -> int:
    """Check every `every`-th request, more often when the first look would otherwise check fewer than
    `at_least` (a gate may stop there)."""
    return max(1, min(every, first_look // at_least))


@dataclass(frozen=True)
class Kept:
    request: int                     # its index, in issue order
    feed: str                        # the data set it ran on
    outputs: Mapping[str, object]


class Checker:
    """Keeps a sample of the outputs of timed requests and judges them against `expected[feed]`, the accuracy
    run's outputs of each data set, by `rule_of(output name)`. Safe to call from several threads."""

    def __init__(self, expected: Mapping[str, Mapping[str, object]], rule_of: Callable[[str], Rule],
                 every: int = EVERY, seed: int = SEED, max_kept: int = MAX_KEPT) -> None:
        self.expected, self.rule_of = expected, rule_of
        self.every, self.seed, self.max_kept = max(1, every), seed, max_kept
        self._rng = random.Random(seed)
        self.offset = self._rng.randrange(self.every)
        self.requests = 0            # requests numbered so far
        self.chosen = 0              # of them, chosen to be checked (kept, or passed over by the reservoir)
        self.kept: list[Kept] = []
        self._lock = threading.Lock()

    def _feed(self, feed: str | None) -> str:
        if feed is None:
            if len(self.expected) != 1:
                raise ValueError("record(feed=...): this checker has several data sets")
            return next(iter(self.expected))
        return feed

    def number(self) -> int:
        """The index of the next request (call when it is issued)."""
        with self._lock:
            i = self.requests
            self.requests += 1
            return i

    def checks(self, i: int) -> bool:
        """Whether request `i` is one whose outputs are checked."""
        return i % self.every == self.offset

    def record(self, i: int, outputs: Mapping[str, object], feed: str | None = None) -> None:
        """The outputs of request `i` (on data set `feed`; None: the only one), kept when it is a checked one."""
        if not self.checks(i):
            return
        kept = Kept(i, self._feed(feed), outputs)
        with self._lock:
            self.chosen += 1
            if len(self.kept) < self.max_kept:
                self.kept.append(kept)
            elif (j := self._rng.randrange(self.chosen)) < self.max_kept:
                self.kept[j] = kept

    def observer(self, feed: str | None = None) -> Callable[[object], None]:
        """latency.sample's `seen`: numbers each output it is given and keeps the checked ones."""
        def seen(outputs: object) -> None:
            assert isinstance(outputs, Mapping)
            self.record(self.number(), outputs, feed)
        return seen

    def wrap(self, call: Callable[[], Mapping[str, object]], feed: str | None = None) \
            -> Callable[[], Mapping[str, object]]:
        """`call`, numbering each request when it is issued and keeping the checked ones' outputs (for callers
        that time around the call: only a counter, a modulo and, 1 in `every`, an append are added)."""
        def run() -> Mapping[str, object]:
            i = self.number()
            out = call()
            self.record(i, out, feed)
            return out
        return run

    def verdict(self, job: str = "") -> tuple[Verdict, ComplianceDoc, list[str]]:
        """Compare the kept outputs (after timing): PASS when every one is within the rule, FAIL with each
        mismatch (the report's `compliance` and the failure lines, naming `job`), SKIPPED when none was kept."""
        mismatches: list[MismatchDoc] = []
        for k in sorted(self.kept, key=lambda k: k.request):
            for name, want in self.expected[k.feed].items():
                got = k.outputs.get(name)
                r = compare.compare(name, k.feed, want, got, self.rule_of(name))
                if not r.passed:
                    mismatches.append({"request": k.request, "data_set": k.feed, "output": name,
                                       "difference": compare.describe_failure(r)})
        verdict = Verdict.FAIL if mismatches else Verdict.PASS if self.kept else Verdict.SKIPPED
        doc: ComplianceDoc = {"checked": len(self.kept), "requests": self.requests, "every": self.every,
                              "seed": self.seed, "mismatches": mismatches[:MAX_REPORTED],
                              "mismatched": len(mismatches), "verdict": verdict}
        return verdict, doc, failure_lines(job, doc)


    @staticmethod
    def merge(docs: list[ComplianceDoc]) -> ComplianceDoc:
        """Several data sets' sections as one (the report's top-level `latency.compliance`)."""
        found = {d["verdict"] for d in docs}
        verdict = (Verdict.FAIL if Verdict.FAIL in found else Verdict.PASS if Verdict.PASS in found
                   else Verdict.SKIPPED)
        return {"checked": sum(d["checked"] for d in docs), "requests": sum(d["requests"] for d in docs),
                "every": max((d["every"] for d in docs), default=EVERY), "seed": docs[0]["seed"] if docs else SEED,
                "mismatches": [m for d in docs for m in d["mismatches"]][:MAX_REPORTED],
                "mismatched": sum(d["mismatched"] for d in docs), "verdict": verdict}

    @classmethod
    def for_latency(cls, expected: Mapping[str, object], feed: str, rule_of: Callable[[str], Rule],
                    first_look: int) -> Checker:
        """The checker of one data set's latency sampling (`expected`: its accuracy-run outputs)."""
        return cls({feed: expected}, rule_of, every_for(first_look))

    def judge(self, job: str, entry: DataSetLatency, lines: list[str]) -> ComplianceDoc:
        """Judge into a data set's latency entry: its `compliance`, its verdict FAIL on a mismatch, the failure
        lines to `lines`."""
        verdict, doc, failed = self.verdict(job)
        entry["compliance"] = doc
        if verdict is Verdict.FAIL:
            entry["verdict"] = Verdict.FAIL
            lines += failed
        return doc

def failure_lines(job: str, doc: ComplianceDoc) -> list[str]:
    """The failure report's lines of a compliance section (none when nothing mismatched)."""
    if not doc["mismatched"]:
        return []
    requests = sorted({m["request"] for m in doc["mismatches"]})
    shown = ", ".join(map(str, requests[:MAX_LISTED])) + (", ..." if doc["mismatched"] > MAX_LISTED else "")
    lines = [f"compliance: {job} {doc['mismatched']} output(s) of {doc['checked']} checked request(s) differ from "
             f"the accuracy run's beyond the accuracy rule while timing (requests {shown}): the session's outputs "
             "change when it runs again or concurrently (shared state in a custom op, a stateful or random operator, "
             "threads)"]
    for m in doc["mismatches"][:MAX_DESCRIBED]:
        first, *rest = m["difference"]
        lines += [f"  request {m['request']}: {first}", *(f"  {line}" for line in rest)]
    return lines
