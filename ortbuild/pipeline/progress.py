"""The build's progress display: typed events (ortbuild.status) from the pipeline and its worker processes.

Plain lines (`[target/model] step`) in CI and pipes; on a terminal, a live table of the running jobs (rich)
above which finished jobs scroll. A job leaves the table on its JobFinished event.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from ortbuild.status import Event, JobFinished, Message


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
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

        table = Table(box=None, show_header=False, pad_edge=False)
        now = time.monotonic()
        for job, (step, since) in sorted(self._rows.items()):
            table.add_row(f"[bold]{job}[/]", step, f"{now - since:5.1f}s")
        return table

    def __call__(self, job: str, event: Event | str) -> None:
        """An event about a job; a plain string is a Message (the gates' and diagnosis' lines)."""
        if self.quiet:
            return
        if isinstance(event, str):
            event = Message(event)
        if self._display is None:
            print(f"[{job}] {event.text()}", file=self.stream, flush=True)
            return
        if isinstance(event, JobFinished):
            self._rows.pop(job, None)
            self._display.console.print(f"[{job}] {event.text()}", highlight=False, markup=False)
        else:
            self._rows[job] = (event.text(), self._rows.get(job, ("", time.monotonic()))[1])
