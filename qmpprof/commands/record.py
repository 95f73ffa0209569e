"""`qmpprof record` (the default command): sample for a while, write a profile, summarize."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from qmpprof.commands.collect import Collector, check_writable
from qmpprof.commands.common import TargetOptions, build_analyzer, connected
from qmpprof.errors import KernelMismatch
from qmpprof.model import RawSample, Recording
from qmpprof.output.progress import RecordProgress
from qmpprof.output.summary import render_summary
from qmpprof.output.writers import Format
from qmpprof.profile import Profile, Scope
from qmpprof.record.backlog import Backlog
from qmpprof.record.capfile import CaptureWriter
from qmpprof.record.sampler import LoopConfig, RecordStats, sample_loop


@dataclass(frozen=True)
class RecordOptions:
    target: TargetOptions
    outputs: tuple[tuple[Path, Format], ...] = ((Path("profile.folded"), Format.FOLDED),)
    duration_s: float | None = 10.0
    period_s: float = 1 / 99
    include_idle: bool = False
    scope: Scope = Scope.ALL
    capture_memory: bool = False
    nonblocking: bool = False
    verbose: bool = False


async def run_record(options: RecordOptions, out: Console, err: Console) -> None:
    """Record, then write the profile and the summary, whatever ended the recording.

    Raises QmpprofError for setup failures, and KernelMismatch after writing.
    """
    check_writable([path for path, _ in options.outputs])
    analyzer = build_analyzer(options.target)
    stop = asyncio.Event()
    recording = _recording(options, time.time(), 0.0)
    with ExitStack() as files:
        captures = [
            files.enter_context(CaptureWriter(path, recording, options.capture_memory))
            for path, fmt in options.outputs
            if fmt is Format.QMPCAP
        ]
        collector = Collector(analyzer, Profile(options.include_idle, options.scope), captures)
        stats = await _record(options, collector, stop, err)
    if stop.is_set() and not collector.coverage.mismatched:
        stats.ended_by = "interrupted"
    _finish(options, collector, stats, _recording(options, recording.started, stats.elapsed_s), out)


async def _record(
    options: RecordOptions,
    collector: Collector,
    stop: asyncio.Event,
    err: Console,
) -> RecordStats:
    def analyse(raw: RawSample) -> None:
        collector.add_raw(raw)
        if collector.coverage.mismatched:
            stop.set()

    backlog = Backlog(analyse)

    loop_config = LoopConfig(
        period_s=options.period_s, duration_s=options.duration_s, nonblocking=options.nonblocking
    )
    async with connected(options.target, collector.analyzer) as (session, memory, capturer):
        _announce(options, collector, _describe(memory), err)
        with stop_on_signals(stop), RecordProgress(err, options.duration_s) as progress:
            stats = await sample_loop(
                session,
                capturer,
                loop_config,
                stop,
                backlog.add,
                progress.update,
                backlog.work_until,
            )
    backlog.work_until(None)
    return stats


def _describe(memory: object) -> str:
    detail = getattr(memory, "detail", None)
    return f"{getattr(memory, 'name', '?')} ({detail})" if detail else getattr(memory, "name", "?")


def _announce(options: RecordOptions, collector: Collector, memory: str, err: Console) -> None:
    analyzer = collector.analyzer
    if not analyzer.has_symbols:
        err.print(
            "warning: no kernel symbols (--kernel): frames will be raw addresses", soft_wrap=True
        )
    if options.verbose:
        users = ", ".join(sorted(analyzer.users)) or "none"
        err.print(
            f"memory backend: {memory}; OS adapter: {analyzer.adapter.name}; "
            f"user binaries: {users}",
            soft_wrap=True,
            markup=False,
        )
    err.print(_start_line(options), soft_wrap=True, markup=False)


def _finish(
    options: RecordOptions,
    collector: Collector,
    stats: RecordStats,
    recording: Recording,
    out: Console,
) -> None:
    for path, fmt in options.outputs:
        collector.write(fmt, recording, path, out)
    render_summary(collector.profile, stats, out)
    if collector.coverage.mismatched and options.target.kernel is not None:
        raise KernelMismatch(collector.coverage.describe(str(options.target.kernel)))


def _recording(options: RecordOptions, started: float, elapsed: float) -> Recording:
    kernel = options.target.kernel
    return Recording(
        started=started,
        duration_s=elapsed,
        period_s=options.period_s,
        qmp_socket=options.target.qmp_socket,
        kernel=str(kernel.resolve()) if kernel is not None else None,
        command_line=" ".join(["qmpprof", *sys.argv[1:]]),
    )


def _start_line(options: RecordOptions) -> str:
    length = f"{options.duration_s:g} s" if options.duration_s else "until Ctrl-C"
    rate = 1 / options.period_s
    return (
        f"recording {options.target.qmp_socket} at {rate:.0f} Hz for {length}; Ctrl-C stops early"
    )


@contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
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
