"""Progress while recording, on stderr so stdout stays clean.

On a terminal: a rich progress bar. Otherwise (logs, pipes, tests): one plain line
about once a second, so a reader can follow a long recording.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from qmpprof.model import RecordStats

PLAIN_EVERY_S = 1.0


class RecordProgress:
    """Shows RecordStats as they change; a context manager."""

    def __init__(self, console: Console, duration_s: float | None) -> None:
        self._console = console
        self._last_plain = time.monotonic()
        self._progress: Progress | None = None
        if console.is_terminal:
            self._progress = Progress(
                TextColumn("recording"),
                BarColumn(),
                TextColumn("{task.fields[detail]}", markup=False),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task("record", total=duration_s, detail="")

    def __enter__(self) -> RecordProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, stats: RecordStats) -> None:
        detail = f"{stats.ticks} samples, {stats.rate_hz:.0f} Hz, {stats.failed} failed"
        if self._progress is not None:
            self._progress.update(self._task, completed=stats.elapsed_s, detail=detail)
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            self._console.print(
                f"progress: {detail}, {stats.elapsed_s:.0f} s", markup=False, soft_wrap=True
            )
