"""The live progress line while recording (on stderr, so stdout stays clean)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from qmpprof.record.sampler import RecordStats


class RecordProgress:
    """A rich progress bar fed with RecordStats; a context manager."""

    def __init__(self, console: Console, duration_s: float | None) -> None:
        self._progress = Progress(
            TextColumn("recording"),
            BarColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("record", total=duration_s, detail="")

    def __enter__(self) -> RecordProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, stats: RecordStats) -> None:
        detail = f"{stats.ticks} samples, {stats.rate_hz:.0f} Hz, {stats.failed} failed"
        self._progress.update(self._task, completed=stats.elapsed_s, detail=detail)
