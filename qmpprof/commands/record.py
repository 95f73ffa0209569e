"""`qmpprof record` (the default command): sample for a while, write a profile, summarize."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import (
    CaptureOutput,
    Collector,
    Written,
    check_writable,
    raise_for_failures,
    show_written,
)
from qmpprof.commands.common import (
    TargetOptions,
    build_analyzer,
    cfi_problems,
    file_problems,
)
from qmpprof.commands.connect import choose_nonblocking, connected, describe_memory
from qmpprof.commands.host import HostOptions, HostRun, host_recording
from qmpprof.console import Console, say
from qmpprof.console.progress import RecordProgress
from qmpprof.console.summary import kernel_line, render_summary
from qmpprof.defaults import DEFAULT_RATE_HZ
from qmpprof.errors import HostProfileFailed, KernelMismatch, NothingSampled, UsageError
from qmpprof.model import CapturedSample, Ending, EndReason, Recording, RecordStats
from qmpprof.output.writers import Format
from qmpprof.profile import Grouping, Profile, Scope
from qmpprof.record.backlog import Backlog
from qmpprof.record.process_maps import MapsStats
from qmpprof.record.sampler import LoopConfig, ProgressSink, sample_loop, why_nothing_sampled
from qmpprof.target.qmp import QmpSession
from qmpprof.visible import visible


@dataclass(frozen=True)
class RecordOptions:
    target: TargetOptions
    outputs: tuple[tuple[Path, Format], ...] = ((Path("profile.folded"), Format.FOLDED),)
    duration_s: float | None = 10.0
    period_s: float = 1 / DEFAULT_RATE_HZ
    include_idle: bool = False
    scope: Scope = Scope.ALL
    grouping: Grouping = Grouping.THREAD
    capture_memory: bool = False
    nonblocking: bool = False
    #: --stop: stop mode even where it is chosen against by default (through libvirt).
    force_stop: bool = False
    verbose: bool = False
    #: `--host`: perf on the QEMU process too, merged into one profile.
    host: HostOptions | None = None


async def run_record(options: RecordOptions, out: Console, err: Console) -> None:
    """Record, then write the profile and the summary, whatever ended the recording.

    Raises QmpprofError for setup failures; after writing, OutputError when an output
    could not be written, else KernelMismatch.
    """
    check_writable([path for path, _ in options.outputs])
    if options.host is not None and options.scope is not Scope.ALL:
        raise UsageError("--host profiles whole stacks: not with --kernel-only or --user-only")
    stop = asyncio.Event()
    # From here to the last output written, a signal ends the recording, never the process.
    with stop_on_signals(stop) as received:
        analyzer = build_analyzer(options.target)
        started = time.time()
        collector = Collector(
            analyzer, Profile(options.include_idle, options.scope, options.grouping)
        )
        with ExitStack() as files:
            stats, host = await _record(options, collector, files, started, stop, err)
        if received and stats.ended_by is None:
            stats.ended_by = Ending(EndReason.INTERRUPTED, received[0].name)
        recording = _recording(options, started, 0.0, analyzer)
        view = collector
        if host is not None and host.error is None:
            view, recording = host.view, replace(recording, period_s=host.period_s)
        written = _write(options, collector, view, stats, recording)
        _finish(options, collector, stats, written, out, host)


def _closed_at_exit(files: ExitStack, capture: CaptureOutput) -> CaptureOutput:
    files.callback(capture.close)
    return capture


async def _record(
    options: RecordOptions,
    collector: Collector,
    files: ExitStack,
    started: float,
    stop: asyncio.Event,
    err: Console,
) -> tuple[RecordStats, HostOutcome | None]:
    """Connect, start perf (`--host`), open the capture files (their header names the
    kernel's bias, known once connected), and sample until the end."""

    def analyse(captured: CapturedSample) -> None:
        collector.add_captured(captured)
        if collector.coverage.mismatched:  # only a --kernel given: fails after writing
            stop.set()

    backlog = Backlog(analyse)

    async with (
        connected(options.target, collector.analyzer) as (session, memory, capturer),
        _host_recording(session, options.host) as host,
    ):
        nonblocking = await choose_nonblocking(
            session, options.nonblocking, options.force_stop, options.period_s
        )
        loop_config = LoopConfig(options.period_s, options.duration_s, nonblocking=nonblocking)
        recording = _recording(options, started, 0.0, collector.analyzer)
        for path, fmt in options.outputs:
            if fmt is Format.QMPCAP:
                capture = CaptureOutput.open(path, recording, options.capture_memory)
                collector.keep_in(_closed_at_exit(files, capture))
        with contextlib.suppress(OSError):  # a terminal closed during setup (SIGHUP)
            _announce(options, collector, describe_memory(memory), err)
        collector.maps_stats = capturer.maps.stats if capturer.maps is not None else None
        with _progress(err, options.duration_s) as progress:
            stats = await sample_loop(
                session,
                capturer,
                loop_config,
                stop,
                backlog.add,
                progress,
                backlog.work_until,
            )
        backlog.work_until(None)
        outcome = await _merged(host, collector, options) if host is not None else None
    return stats, outcome


@contextlib.asynccontextmanager
async def _host_recording(
    session: QmpSession, options: HostOptions | None
) -> AsyncIterator[HostRun | None]:
    if options is None:
        yield None
        return
    async with host_recording(session, options) as host:
        yield host


@dataclass
class HostOutcome:
    """`--host`'s profile (`view`: the merged samples, written instead of the guest's)
    and the summary's line; or why perf's part is missing."""

    view: Collector
    line: str
    #: perf's sampling period: each merged sample's weight.
    period_s: float = 0.0
    error: HostProfileFailed | None = None


async def _merged(host: HostRun, collector: Collector, options: RecordOptions) -> HostOutcome:
    """The merged profile; the guest's alone, with the error kept, when perf's part
    cannot be read (the recording is not lost for it)."""
    guest = collector.profile
    view = Collector(collector.analyzer, Profile(True, guest.scope, guest.grouping))
    try:
        samples, split = await host.merged(collector.samples, options.period_s)
    except HostProfileFailed as error:
        return HostOutcome(collector, f"host: {error}", error=error)
    for sample in samples:
        view.add(sample)
    return HostOutcome(view, split.describe(), host.period_ns / 1e9)


@contextmanager
def _progress(err: Console, duration_s: float | None) -> Iterator[ProgressSink]:
    """The progress display, which must not end a recording: after SIGHUP its terminal
    is gone and every write to it fails."""
    progress = RecordProgress(err, duration_s)
    with contextlib.suppress(OSError):
        progress.__enter__()

    def update(stats: RecordStats) -> None:
        with contextlib.suppress(OSError):
            progress.update(stats)

    try:
        yield update
    finally:
        with contextlib.suppress(OSError):
            progress.__exit__(None, None, None)


def _announce(options: RecordOptions, collector: Collector, memory: str, err: Console) -> None:
    analyzer = collector.analyzer
    if analyzer.kernel_source is not None:
        say(err, analyzer.kernel_source)
    elif not analyzer.has_kernel_symbols:
        say(err, "warning: no kernel symbols (--kernel): frames will be raw addresses")
    if options.verbose:
        users = ", ".join(sorted(analyzer.users)) or "none"
        say(
            err,
            f"memory backend: {memory}; OS adapter: {analyzer.adapter.name}; "
            f"user binaries: {users}",
        )
        if analyzer.kernel is not None and analyzer.kernel_source is None:
            say(err, kernel_line(analyzer.kernel.path, analyzer.kernel_bias))
        for line in cfi_problems(analyzer, compile_all=True):
            say(err, f"warning: {visible(line)}")
    say(err, _start_line(options))


def _write(
    options: RecordOptions,
    collector: Collector,
    view: Collector,
    stats: RecordStats,
    recording: Recording,
) -> list[Written]:
    """Every output, in the order given: profiles written now from `view` (the
    collector's, or `--host`'s merged one), captures as recorded."""
    finished = replace(recording, duration_s=stats.elapsed_s)
    by_path = {capture.path: capture.result() for capture in collector.captures}
    by_path.update((w.path, w) for w in view.write_outputs(options.outputs, finished))
    return [by_path[path] for path, _ in options.outputs]


def _finish(
    options: RecordOptions,
    collector: Collector,
    stats: RecordStats,
    written: list[Written],
    out: Console,
    host: HostOutcome | None = None,
) -> None:
    """Say what was written and summarize (the files are already safe: a terminal closed
    by SIGHUP may refuse this), then raise for what went wrong."""
    with contextlib.suppress(OSError):
        show_written(written, out)
        render_summary(
            collector.profile,
            stats,
            out,
            [
                *cfi_problems(collector.analyzer, False),
                *file_problems(collector.analyzer),
                *maps_problems(collector.maps_stats),
                *collector.symbol_problems(),
            ],
            kernel=_placement(collector.analyzer),
            host=host.line if host is not None else None,
        )
    raise_for_failures(written)
    if host is not None and host.error is not None:
        raise HostProfileFailed(f"{host.error} (the profile written is the guest's alone)")
    if collector.coverage.mismatched:
        raise KernelMismatch(collector.coverage.describe(str(options.target.kernel)))
    if (why := why_nothing_sampled(stats)) is not None:
        raise NothingSampled(why)


def maps_problems(stats: MapsStats | None) -> list[str]:
    """A line when reading the guest's process maps, or its files with no host copy,
    failed (their user frames then read FILE+offset or stay unnamed)."""
    if stats is None or not (stats.failed or stats.images_failed):
        return []
    said = []
    if stats.failed:
        said.append(f"{stats.failed} of {stats.walks} walks of a process's maps failed")
    if stats.images_failed:
        said.append(
            f"{stats.images_failed} of {stats.images} reads of files with no host copy "
            "found nothing in the guest"
        )
    return ["process maps: " + "; ".join(said)]


def _placement(analyzer: Analyzer) -> str | None:
    """The summary's kernel line: only for a kernel that was moved (a KASLR slide)."""
    kernel = analyzer.kernel
    if analyzer.kernel_source is not None:
        return analyzer.kernel_source
    if kernel is None or not analyzer.kernel_bias:
        return None
    return kernel_line(kernel.path, analyzer.kernel_bias)


def _recording(
    options: RecordOptions, started: float, elapsed: float, analyzer: Analyzer
) -> Recording:
    kernel = options.target.kernel
    return Recording(
        started=started,
        duration_s=elapsed,
        period_s=options.period_s,
        qmp_socket=options.target.qmp_socket,
        kernel=str(kernel.resolve()) if kernel is not None else None,
        command_line=" ".join(["qmpprof", *sys.argv[1:]]),
        kernel_bias=analyzer.kernel_bias,
        kernel_modules=analyzer.kernel_modules,
        kernel_release=analyzer.kernel_release,
    )


def _start_line(options: RecordOptions) -> str:
    length = f"{options.duration_s:g} s" if options.duration_s else "until Ctrl-C"
    rate = 1 / options.period_s
    return (
        f"recording {options.target.qmp_socket} at {rate:.0f} Hz for {length}; Ctrl-C stops early"
    )


#: Each ends a recording (or `top`) at the next tick boundary, never mid-tick: the VM is
#: resumed and the profile written. SIGHUP is the terminal closing (tmux kill-session,
#: ssh dropping); SIGQUIT is Ctrl-\ (a core dump otherwise).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[list[signal.Signals]]:
    """Set `stop` on any of STOP_SIGNALS instead of dying; yields the signals received."""
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        stop.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield received
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
