"""The build's progress display: typed events (ortbuild.status) from the pipeline and its worker processes.

In CI and pipes, one line per job, when it finishes (`-v`: a line per step and message too); on a terminal, a
live table of the running jobs (rich) above which finished jobs scroll. A job leaves the table on its
JobFinished event. Lines go to a duplicate of the terminal's descriptor (ortbuild.logs.terminal), so they reach
it while a job's third-party output is captured into its log.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from ortbuild import logs
from ortbuild.status import Event, JobFinished, Message


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False, live: bool | None = None,
                 verbose: bool = False) -> None:
        self.stream = logs.terminal(stream or sys.stderr) if not quiet else (stream or sys.stderr)
        self.quiet = quiet
        self.verbose = verbose
        self.live = (not quiet and self.stream.isatty() and os.environ.get("TERM") != "dumb"
                     and "CI" not in os.environ) if live is None else live
        self._rows: dict[str, tuple[str, float]] = {}  # running job -> (its current step, since)
        self._display: Any = None

    def __enter__(self) -> Progress:
        if self.live:  # rich only where a terminal shows it
            from rich.console import Console
            from rich.live import Live

            self._display = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4,
                                 transient=True, get_renderable=self._table)
            self._display.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.__exit__(None, None, None)
            self._display = None

    def _table(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, show_header=False, pad_edge=False)
        now = time.monotonic()
        for job, (step, since) in sorted(self._rows.items()):
            # Text, not markup: a step or job name with brackets must show as it is
            table.add_row(Text(job, style="bold"), Text(step), Text(f"{now - since:5.1f}s"))
        return table

    def __call__(self, job: str, event: Event | str) -> None:
        """An event about a job; a plain string is a Message (the gates' and diagnosis' lines)."""
        if self.quiet:
            return
        if isinstance(event, str):
            event = Message(event)
        if self._display is None:
            if self.verbose or isinstance(event, JobFinished):
                print(f"[{job}] {event.text()}", file=self.stream, flush=True)
            return
        if isinstance(event, JobFinished):
            self._rows.pop(job, None)
            self._display.console.print(f"[{job}] {event.text()}", highlight=False, markup=False)
        else:
            self._rows[job] = (event.text(), self._rows.get(job, ("", time.monotonic()))[1])
