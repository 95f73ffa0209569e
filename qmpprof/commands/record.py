"""`qmpprof record` (the default command): sample for a while, write a profile, summarize."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer, connected
from qmpprof.errors import KernelMismatch
from qmpprof.model import RawSample
from qmpprof.output.folded import write_folded
from qmpprof.output.progress import RecordProgress
from qmpprof.output.summary import render_summary
from qmpprof.profile import Profile, Scope
from qmpprof.record.sampler import LoopConfig, RecordStats, sample_loop
from qmpprof.symbols.coverage import KernelCoverage


@dataclass(frozen=True)
class RecordOptions:
    target: TargetOptions
    output: Path
    duration_s: float | None = 10.0
    period_s: float = 1 / 99
    include_idle: bool = False
    scope: Scope = Scope.ALL
    verbose: bool = False


class _Collector:
    """Turns each tick's raw samples into the profile; notices a wrong kernel early."""

    def __init__(self, analyzer: Analyzer, profile: Profile, stop: asyncio.Event) -> None:
        self.analyzer = analyzer
        self.profile = profile
        self.coverage = KernelCoverage()
        self._stop = stop

    def __call__(self, raws: list[RawSample]) -> None:
        for raw in raws:
            sample = self.analyzer.analyze(raw)
            self.profile.add(sample)
            self.coverage.add(sample)
        if self.coverage.mismatched:
            self._stop.set()


async def run_record(options: RecordOptions, out: Console, err: Console) -> None:
    """Record, then write the profile and the summary, whatever ended the recording.

    Raises QmpprofError for setup failures, and KernelMismatch after writing.
    """
    analyzer = build_analyzer(options.target)
    stop = asyncio.Event()
    profile = Profile(include_idle=options.include_idle, scope=options.scope)
    collector = _Collector(analyzer, profile, stop)
    loop_config = LoopConfig(period_s=options.period_s, duration_s=options.duration_s)
    async with connected(options.target, analyzer) as (session, memory, capturer):
        if not analyzer.has_symbols:
            err.print(
                "warning: no kernel symbols (--kernel): frames will be raw addresses",
                soft_wrap=True,
            )
        if options.verbose:
            err.print(
                f"memory backend: {memory.name}; OS adapter: {analyzer.adapter.name}; "
                f"user binaries: {', '.join(sorted(analyzer.users)) or 'none'}"
            )
        err.print(_start_line(options), soft_wrap=True, markup=False)
        with _stop_on_signals(stop), RecordProgress(err, options.duration_s) as progress:
            stats = await sample_loop(
                session, capturer, loop_config, stop, collector, progress.update
            )
    if stop.is_set() and not collector.coverage.mismatched:
        stats.ended_by = "interrupted"
    _finish(options, collector, stats, out, err)


def _finish(
    options: RecordOptions, collector: _Collector, stats: RecordStats, out: Console, err: Console
) -> None:
    write_folded(collector.profile, options.output)
    render_summary(collector.profile, stats, out)
    written = f"wrote {len(collector.profile.stacks)} distinct stacks to {options.output}"
    out.print(written, soft_wrap=True, markup=False)
    if collector.coverage.mismatched and options.target.kernel is not None:
        raise KernelMismatch(collector.coverage.describe(str(options.target.kernel)))


def _start_line(options: RecordOptions) -> str:
    length = f"{options.duration_s:g} s" if options.duration_s else "until Ctrl-C"
    rate = 1 / options.period_s
    return (
        f"recording {options.target.qmp_socket} at {rate:.0f} Hz for {length}; Ctrl-C stops early"
    )


@contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM end the recording at the next tick boundary, never mid-tick."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        yield
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
