"""The build's progress display: typed events (ortbuild.status) from the pipeline and its worker processes.

In CI and pipes, one line per job when it finishes, a line when a long phase starts (a build, a gate run, a
search rebuild, a set-up: PhaseStarted), and a heartbeat, `[job] ... still <phase>, 25s`, whenever nothing was
printed for `heartbeat` seconds (5: a native call holding the GIL for a few seconds still leaves the stream under
10 s without a line); `-v`: a line per step and message too. On a terminal, a live table of the running jobs
(rich) above which finished jobs scroll; it refreshes itself, so no heartbeat. A job leaves the table on its
JobFinished event. Lines go to a duplicate of the terminal's descriptor (ortbuild.logs.terminal), so they reach
it while a job's third-party output is captured into its log.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from ortbuild import logs
from ortbuild.status import Event, JobFinished, Message, PhaseStarted

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table

HEARTBEAT_S = 5.0  # seconds without a line before a plain stream gets "... still <phase>"


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False, live: bool | None = None,
                 verbose: bool = False, heartbeat: float | None = HEARTBEAT_S, what: str = "working") -> None:
        self.stream = logs.terminal(stream or sys.stderr) if not quiet else (stream or sys.stderr)
        self.quiet = quiet
        self.verbose = verbose
        self.live = (not quiet and self.stream.isatty() and os.environ.get("TERM") != "dumb"
                     and "CI" not in os.environ) if live is None else live
        # a plain display's heartbeat (inside `with` only); quiet (--json) and the live table have none
        self.heartbeat = None if quiet or self.live else heartbeat
        self.what = what  # the heartbeat's phase while no job runs
        self._rows: dict[str, tuple[str, float]] = {}  # running job -> (its current step, since)
        self._phases: dict[str, tuple[str, float]] = {}  # plain: running job -> (its current phase, since)
        self._display: Live | None = None
        self._lock = threading.Lock()
        self._last = self._began = time.monotonic()  # the last line written
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.live:  # rich only where a terminal shows it
            from rich.console import Console
            from rich.live import Live

            self._display = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4,
                                 transient=True, get_renderable=self._table)
            self._display.__enter__()
        elif self.heartbeat is not None:
            self._last = self._began = time.monotonic()
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, name="ortbuild-heartbeat", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.__exit__(None, None, None)
            self._display = None
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._beat = None

    def _table(self) -> Table:
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, show_header=False, pad_edge=False)
        now = time.monotonic()
        for job, (step, since) in sorted(self._rows.items()):
            # Text, not markup: a step or job name with brackets must show as it is
            table.add_row(Text(job, style="bold"), Text(step), Text(f"{now - since:5.1f}s"))
        return table

    def _say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.stream, flush=True)
            self._last = time.monotonic()

    def _heartbeat(self) -> None:
        """Until __exit__: a line per running job (or one for the command) each time `heartbeat` seconds went by
        without a line."""
        assert self.heartbeat is not None
        while not self._stop.wait(max(0.05, self._last + self.heartbeat - time.monotonic())):
            with self._lock:
                now = time.monotonic()
                if now - self._last < self.heartbeat:  # a line came meanwhile
                    continue
                running = sorted(self._phases.items()) or [("", (self.what, self._began))]
                try:
                    for job, (phase, since) in running:
                        print(f"[{job}] " * bool(job) + f"... still {phase}, {now - since:.0f}s", file=self.stream,
                              flush=True)
                except (OSError, ValueError):  # the reader went away (a closed pipe): the command says so itself
                    return
                self._last = now

    def __call__(self, job: str, event: Event | str) -> None:
        """An event about a job; a plain string is a Message (the gates' and diagnosis' lines)."""
        if self.quiet:
            return
        if isinstance(event, str):
            event = Message(event)
        if self._display is None:
            with self._lock:  # what the heartbeat names: the job's latest step, phase or message
                if isinstance(event, JobFinished):
                    self._phases.pop(job, None)
                else:
                    self._phases[job] = (event.text(), time.monotonic())
            if self.verbose or isinstance(event, JobFinished | PhaseStarted):
                self._say(f"[{job}] {event.text()}")
            return
        if isinstance(event, JobFinished):
            self._rows.pop(job, None)
            self._display.console.print(f"[{job}] {event.text()}", highlight=False, markup=False)
        else:
            self._rows[job] = (event.text(), self._rows.get(job, ("", time.monotonic()))[1])
