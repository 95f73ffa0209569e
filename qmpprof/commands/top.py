"""`qmpprof top`: a live view of where the guest spends its time, until q or Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer, say_on_stderr
from qmpprof.commands.connect import choose_nonblocking, connected
from qmpprof.commands.record import stop_on_signals
from qmpprof.console import Console, say
from qmpprof.console.top import ViewState, live_screen, plain_snapshot, render
from qmpprof.defaults import DEFAULT_RATE_HZ
from qmpprof.errors import KernelMismatch, NothingSampled, QmpprofError
from qmpprof.model import CapturedSample, RecordStats
from qmpprof.record.backlog import Backlog
from qmpprof.record.sampler import LoopConfig, sample_loop, why_nothing_sampled
from qmpprof.symbols.coverage import KernelCoverage
from qmpprof.top_stats import SortKey, TopStats
from qmpprof.visible import visible


@dataclass(frozen=True)
class TopOptions:
    target: TargetOptions
    period_s: float = 1 / DEFAULT_RATE_HZ
    refresh_s: float = 1.0
    process: str | None = None
    include_idle: bool = False
    nonblocking: bool = False
    #: --stop: stop mode even where it is chosen against by default (through libvirt).
    force_stop: bool = False


async def run_top(options: TopOptions, out: Console) -> None:
    """Sample and redraw about once a second until q, a signal, or QEMU exits.

    Once the terminal is restored, says on stderr what no symbols named (no --kernel
    for a guest whose memory gives none), then raises QmpprofError when sampling ended
    on its own (QEMU exited, commands kept failing), or KernelMismatch when the
    --kernel given does not match the guest (which ends the view)."""
    analyzer = build_analyzer(options.target)
    stats = TopStats(process_filter=options.process, show_idle=options.include_idle)
    state = ViewState()
    stop = asyncio.Event()
    record = RecordStats()
    analysis = _Analysis(analyzer, stats, stop)
    # As in record: analysis waits for the time between ticks and never delays one.
    backlog = Backlog(analysis.add)

    def on_samples(captured: list[CapturedSample]) -> None:
        stats.count_tick()
        backlog.add(captured)

    def on_progress(latest: RecordStats) -> None:
        nonlocal record
        record = latest

    title = options.target.qmp_socket
    async with connected(options.target, analyzer) as (session, _, capturer):
        nonblocking = await choose_nonblocking(
            session, options.nonblocking, options.force_stop, options.period_s
        )
        config = LoopConfig(period_s=options.period_s, duration_s=None, nonblocking=nonblocking)
        with stop_on_signals(stop):
            sampler = asyncio.create_task(
                sample_loop(
                    session, capturer, config, stop, on_samples, on_progress, backlog.work_until
                )
            )
            sampler.add_done_callback(lambda _: stop.set())  # QEMU gone: the view ends too
            try:
                with _terminal_may_vanish(), _keys(out, state, stats, stop):
                    await _display(out, options, stats, lambda: record, state, title, stop)
            finally:
                # Whatever ended the display, the sampler ends its tick (resuming the VM)
                # before the session closes.
                stop.set()
                ended = await sampler
    analysis.tell()
    if ended.ended_by is not None:
        raise QmpprofError(f"top stopped: {ended.ended_by} ({ended.ticks} ticks)")
    if analysis.coverage.mismatched:
        raise KernelMismatch(analysis.coverage.describe(str(options.target.kernel)))
    if (why := why_nothing_sampled(ended)) is not None:
        raise NothingSampled(why)


class _Analysis:
    """Symbolizes each sample into the view, counting what the view does not show: the
    kernel-mode PCs no symbol names, and samples that could not be analysed. Sets `stop`
    when a --kernel given does not match the guest (KernelCoverage.mismatched)."""

    def __init__(self, analyzer: Analyzer, stats: TopStats, stop: asyncio.Event) -> None:
        self.analyzer = analyzer
        self.stats = stats
        self.stop = stop
        self.coverage = KernelCoverage.of(analyzer)
        self.unanalysed = 0
        self.last_error = ""

    def add(self, captured: CapturedSample) -> None:
        try:
            sample = self.analyzer.symbolize(captured)
        except Exception as err:  # a bad sample is data: it must not end the view
            self.unanalysed += 1
            self.last_error = f"{type(err).__name__}: {err}"
            return
        self.stats.add(sample)
        self.coverage.add(sample)
        if self.coverage.mismatched:
            self.stop.set()

    def tell(self) -> None:
        """Once the view is gone: one line each on stderr for what it could not show."""
        lines = [self.coverage.unnamed_line()]
        if self.unanalysed:
            error = visible(self.last_error)
            lines.append(f"samples that could not be analysed: {self.unanalysed} (last: {error})")
        for line in lines:
            if line is not None:
                with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                    say_on_stderr(line)


@contextlib.contextmanager
def _terminal_may_vanish() -> Iterator[None]:
    """A terminal closed under us (SIGHUP, tmux kill-session) fails every read and write
    with EIO: that ends the display, not the process, which still has a VM to resume."""
    with contextlib.suppress(OSError):
        yield


async def _display(
    out: Console,
    options: TopOptions,
    stats: TopStats,
    latest: Callable[[], RecordStats],
    state: ViewState,
    title: str,
    stop: asyncio.Event,
) -> None:
    """Redraw until `stop`: live on a terminal, a plain snapshot per refresh otherwise."""
    if not out.is_terminal:
        while not await _wait(stop, options.refresh_s):
            snapshot = plain_snapshot(stats, latest(), state, title)
            say(out, snapshot + "\n")
        return
    with live_screen(out) as show:
        while not await _wait(stop, min(options.refresh_s, 0.2)):
            if not state.paused:
                show(render(stats, latest(), state, title))


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


@contextlib.contextmanager
def _keys(out: Console, state: ViewState, stats: TopStats, stop: asyncio.Event) -> Iterator[None]:
    """Single keys from a terminal's stdin, without echo; nothing when stdin is not one."""
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, lambda: _on_key(_read_key(fd), state, stats, stop))
    try:
        yield
    finally:
        loop.remove_reader(fd)
        with contextlib.suppress(OSError):  # a terminal that is gone keeps no settings
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_key(fd: int) -> str | None:
    """One key (part of a wider character reads as ""); None when the terminal is gone
    (end of file, or EIO after a hang-up)."""
    try:
        byte = os.read(fd, 1)
    except OSError:
        return None
    return byte.decode(errors="ignore") if byte else None


def _on_key(key: str | None, state: ViewState, stats: TopStats, stop: asyncio.Event) -> None:
    sorts = {"o": SortKey.OWN, "t": SortKey.TOTAL, "n": SortKey.NAME}
    if key in sorts:
        state.sort = sorts[key]
    elif key == "k":
        stats.show_kernel = not stats.show_kernel
    elif key == "u":
        stats.show_user = not stats.show_user
    elif key == "i":
        stats.show_idle = not stats.show_idle
    elif key == "p":
        state.listing = state.listing.next()
    elif key == "r":
        stats.reset()
    elif key == " ":
        state.paused = not state.paused
    elif key in ("h", "?"):
        state.help = not state.help
    elif key in ("q", "Q", None):  # None: the terminal is gone, nobody is watching
        stop.set()
