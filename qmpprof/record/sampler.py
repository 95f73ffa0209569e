"""The sampling loop: one tick per slot of the schedule, until the duration or a stop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from qmpprof.errors import MonitorStuck, ResumeFailed, TargetGone, TickOverrun
from qmpprof.model import CapturedSample, Ending, EndReason, RecordStats
from qmpprof.record.capture import Capturer, Taken
from qmpprof.record.schedule import Schedule
from qmpprof.target.pause import PauseHold
from qmpprof.target.qmp import QmpSession

#: This many failed ticks in a row means QEMU is stuck, not unlucky.
MAX_CONSECUTIVE_FAILURES = 5
#: asyncio's epoll selector sleeps in whole milliseconds, rounded up.
EPOLL_RESOLUTION_S = 0.001
#: QEMU needs about this long to read a primed request (QmpSession.prime). With less
#: time left before a tick, a request half read when the tick comes is slower than one
#: sent whole, and a late loop would never catch up.
PRIME_LEAD_S = 0.0005
#: A tick may take this long, or this many periods if longer, before it is abandoned
#: (the VM resumed): a monitor that slow would otherwise hold the VM paused for it.
TICK_BUDGET_S = 1.0
TICK_BUDGET_PERIODS = 4
#: Nonblocking: a vCPU sample that tore while it was read (a return address that follows
#: no call, Analyzer.is_torn, or a task switched under it, switched_task) is taken again
#: at once, at most this many times; each retake is one more `info registers -a` round
#: trip, the VM running all along. A retake tears more often than a first take (about
#: 0.3 against 0.15-0.2 of samples on the busy Linux guest, a loaded host): after two,
#: about 1 % of samples stayed torn there, after three 0.2-0.3 %, for 0.01-0.02 more
#: register reads a tick (bench/linux_perturbation.py).
MAX_RETAKES = 3


@dataclass(frozen=True)
class LoopConfig:
    period_s: float
    duration_s: float | None
    jitter: float = 0.1
    #: Sample without pausing the VM (registers and memory read while it runs).
    nonblocking: bool = False
    #: Nonblocking: how often a torn sample is taken again (0: published as it is).
    retakes: int = MAX_RETAKES


SampleSink = Callable[[list[CapturedSample]], None]
ProgressSink = Callable[[RecordStats], None]
#: Called with the time the next tick is due: work that may wait should stop before it.
IdleWork = Callable[[float], None]


async def sample_loop(
    session: QmpSession,
    capturer: Capturer,
    config: LoopConfig,
    stop: asyncio.Event,
    on_samples: SampleSink,
    on_progress: ProgressSink | None = None,
    on_idle: IdleWork | None = None,
) -> RecordStats:
    """Sample until `config.duration_s` passes, `stop` is set or QEMU goes away.

    Never raises for QEMU exiting or failing commands: the stats say how it ended.
    Samples reach `on_samples` after the VM has been resumed; `on_idle` gets the time
    left before each tick (for analysis that must not delay sampling).
    """
    stats = RecordStats()
    start = time.monotonic()
    schedule = Schedule(start, config.period_s, config.jitter)
    failures = 0
    while stats.ended_by is None:
        slot = schedule.next_slot(time.monotonic())
        # Slots given up are requested and missed alike, even when the loop ends here.
        stats.missed += slot.missed
        stats.requested += slot.missed
        if slot.deadline - time.monotonic() >= PRIME_LEAD_S:
            _prime_tick(session, capturer, config)
        if on_idle is not None:
            on_idle(slot.deadline)
        if _past_end(config, start, slot.deadline) or await _wait_until(slot.deadline, stop):
            break
        stats.requested += 1
        stats.late += schedule.is_late(slot.deadline, time.monotonic())
        failures = await _one_tick(session, capturer, config, stats, on_samples, failures)
        stats.elapsed_s = time.monotonic() - start
        if on_progress is not None:
            on_progress(stats)
    stats.elapsed_s = time.monotonic() - start
    return stats


async def _one_tick(
    session: QmpSession,
    capturer: Capturer,
    config: LoopConfig,
    stats: RecordStats,
    on_samples: SampleSink,
    failures: int,
) -> int:
    """Take one tick; returns the updated count of consecutive failures."""
    budget_s = tick_budget(config.period_s)
    try:
        if config.nonblocking:
            samples = await running_capture(session, capturer, stats, budget_s, config.retakes)
        else:
            samples = await paused_capture(session, capturer, stats, budget_s)
    except TargetGone:
        stats.ended_by = Ending(EndReason.QEMU_EXITED)
        return failures
    except (ResumeFailed, MonitorStuck) as err:
        stats.failed += 1
        stats.last_error = str(err)
        lost = EndReason.RESUME_FAILED if isinstance(err, ResumeFailed) else EndReason.MONITOR_STUCK
        stats.ended_by = Ending(lost, str(err))
        return failures + 1
    except TickOverrun as err:
        stats.abandoned += 1
        stats.last_error = str(err)
        if failures + 1 >= MAX_CONSECUTIVE_FAILURES:
            stats.ended_by = Ending(EndReason.TICKS_OVERRAN, count=MAX_CONSECUTIVE_FAILURES)
        return failures + 1
    except Exception as err:
        # A failed command, or a bug while analysing one sample's memory needs: the tick
        # is lost, the recording and everything collected so far are not.
        stats.failed += 1
        stats.last_error = str(err)
        if failures + 1 >= MAX_CONSECUTIVE_FAILURES:
            stats.ended_by = Ending(EndReason.TICKS_FAILED, str(err), MAX_CONSECUTIVE_FAILURES)
        return failures + 1
    if samples is not None:
        stats.ticks += 1
        stats.samples += len(samples)
        on_samples(samples)
    return 0


def tick_budget(period_s: float) -> float:
    """How long one tick may take before it is abandoned."""
    return max(TICK_BUDGET_S, TICK_BUDGET_PERIODS * period_s)


async def paused_capture(
    session: QmpSession,
    capturer: Capturer,
    stats: RecordStats,
    budget_s: float | None = TICK_BUDGET_S,
) -> list[CapturedSample] | None:
    """The tick's samples taken with the VM paused; None when someone else holds it
    paused (the user, GDB, another QMP client), which we leave as it is. Where guest RAM
    is read on this host, the copied stacks are unwound after the VM runs again
    (Capturer.take), once QEMU has answered our `cont`: unwound while QEMU answers,
    they held a host core its threads wait for (16 vCPUs on 2 cores: 1.2x the ticks a
    second unthrottled, 3 ms less a tick at 99 Hz; 2 vCPUs: no worse). Raises
    TickOverrun after `budget_s`, the VM resumed."""
    taken = await paused_take(session, capturer, stats, budget_s)
    return None if taken is None else await capturer.finish(taken)


async def paused_take(
    session: QmpSession,
    capturer: Capturer,
    stats: RecordStats,
    budget_s: float | None = TICK_BUDGET_S,
) -> Taken | None:
    """`paused_capture`'s part with the VM paused, up to its resuming.

    `stop` goes out with the register request (one round trip) and `cont` is primed
    while the memory is read; the VM is resumed on every way out, if our `stop` paused
    it (target.pause)."""
    if not await session.is_running():
        stats.skipped_paused += 1
        return None
    started = time.monotonic()
    session.take_last_pause()  # forget pauses before this tick (someone else's)
    async with PauseHold(session, budget_s) as hold:
        taken = await capturer.take(first="stop", then="cont")
        if not hold.ours():  # another client paused it first: a paused VM's stacks
            stats.skipped_paused += 1
            return None
    # QEMU's STOP and RESUME timestamps say when the VM really stopped and resumed; the
    # round trips around them are not pause. Without the events, the tick is an upper bound.
    pause = session.take_last_pause()
    stats.paused_s += pause if pause is not None else time.monotonic() - started
    return taken


async def running_capture(
    session: QmpSession,
    capturer: Capturer,
    stats: RecordStats,
    budget_s: float | None = TICK_BUDGET_S,
    retakes: int = MAX_RETAKES,
) -> list[CapturedSample] | None:
    """The tick's samples taken while the VM runs; None when it is paused (by anyone).
    A vCPU whose stack tore is taken again, up to `retakes` times (`retake_torn`).
    Raises TickOverrun after `budget_s` (retakes included)."""
    if not await session.is_running():
        stats.skipped_paused += 1
        return None
    if budget_s is not None:
        session.deadline = asyncio.get_running_loop().time() + budget_s
    try:
        take = _running_take(capturer)
        samples = await take(None)
        return await retake_torn(samples, take, _torn_check(capturer), stats, retakes)
    finally:
        session.deadline = None


#: Takes every vCPU's registers, and copies and unwinds those in the collection (all: None).
Take = Callable[[Collection[int] | None], Awaitable[Sequence[CapturedSample]]]


async def retake_torn(
    samples: Sequence[CapturedSample],
    take: Take,
    torn: Callable[[CapturedSample], bool],
    stats: RecordStats,
    retakes: int = MAX_RETAKES,
) -> list[CapturedSample]:
    """`samples` (one tick, one per vCPU, taken while the VM ran) with each vCPU whose
    stack is `torn` taken again by `take`, up to `retakes` times, until it is not.

    A torn stack was read half before and half after a call or return; dropping it
    would leave call-heavy code under-counted, so the vCPU's next state is published
    in its place. `take` reads every vCPU's registers (one `info registers -a` round
    trip) and is asked to copy and unwind the torn ones only. Counts in `stats`: `retaken`
    (samples taken again), `retakes` (the extra takes), `still_torn` (published torn
    after the last retake, or with `retakes` 0)."""
    published = list(samples)
    pending = {i for i, sample in enumerate(published) if torn(sample)}
    if pending and retakes > 0:
        stats.retaken += len(pending)
    for _ in range(retakes):
        if not pending:
            break
        stats.retakes += 1
        wanted = {published[i].raw.vcpu for i in pending}
        again = {sample.raw.vcpu: sample for sample in await take(wanted)}
        for i in sorted(pending):
            sample = again.get(published[i].raw.vcpu)
            if sample is None:
                continue  # not in this take: keep the torn one, try again
            published[i] = sample
            if not torn(sample):
                pending.discard(i)
    stats.still_torn += len(pending)
    return published


def _running_take(capturer: Capturer) -> Take:
    """One nonblocking take of every vCPU: where guest RAM is read on this host, each
    vCPU's stack and task memory are copied right after the registers and unwound after
    (Capturer.take, as in stop mode), so the last vCPU's memory is not read only after
    the first ones are unwound: less time for the guest to move on, fewer tears (about a
    fifth fewer task switches under a sample on the busy Linux guest), and a retake
    copies and unwinds only the vCPUs it is for. Elsewhere, and with --unwind-paused, each vCPU is
    unwound as it is read (Capturer.capture)."""

    async def take(vcpus: Collection[int] | None) -> list[CapturedSample]:
        taken = await capturer.take(only=vcpus or ())
        return await capturer.finish(taken)

    return take


def switched_task(sample: CapturedSample) -> bool:
    """Whether the task read from memory is not the one whose page tables the registers
    hold: its process's file mappings came back empty because its mm's pgd is not CR3
    (ProcessMaps.maps_for). A paused vCPU shows that only inside a context switch; read
    while it runs, it mostly means the vCPU switched tasks between the register read and
    the memory read, and the sample would put one task's registers under another's name.
    Never where no maps are read (not Linux, or no direct-map base known)."""
    process = sample.process
    return sample.raw.file_maps == () and process is not None and process.pid is not None


def _torn_check(capturer: Capturer) -> Callable[[CapturedSample], bool]:
    """A nonblocking sample that tore while it was read: a return address that follows
    no call (the check symbolization makes, Sample.torn) or a task switched under it."""
    is_torn = capturer.analyzer.is_torn
    return lambda sample: switched_task(sample) or is_torn(sample)


def _prime_tick(session: QmpSession, capturer: Capturer, config: LoopConfig) -> None:
    """Have QEMU read the tick's first request while we analyse and wait (QmpSession.prime:
    if the tick does not send it, it is cancelled, so a primed `stop` never pauses the VM)."""
    if config.nonblocking:
        capturer.prime()
    else:
        session.prime("stop")


def _past_end(config: LoopConfig, start: float, deadline: float) -> bool:
    return config.duration_s is not None and deadline - start >= config.duration_s


async def _wait_until(deadline: float, stop: asyncio.Event) -> bool:
    """Sleep until `deadline` unless `stop` is set first; returns whether it was.

    The event loop's epoll waits whole milliseconds, rounded up: at hundreds of Hz
    that alone makes ticks late. So the loop sleeps until a millisecond before the
    deadline and a plain sleep (nanosecond timer) covers the rest.
    """
    coarse = deadline - time.monotonic() - EPOLL_RESOLUTION_S
    if coarse > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), coarse)
    fine = deadline - time.monotonic()
    if fine > 0 and not stop.is_set():
        time.sleep(fine)  # QMP events and Ctrl-C wait at most this millisecond
    return stop.is_set()


def why_nothing_sampled(stats: RecordStats) -> str | None:
    """Why a recording that ticked took no sample, as one line; None when it took one,
    or never ticked (a signal, `q` in top or QEMU exiting before the first tick)."""
    interrupted = stats.ended_by is not None and stats.ended_by.reason is EndReason.INTERRUPTED
    failed = stats.failed + stats.abandoned
    tried = stats.ticks + stats.skipped_paused + failed
    if stats.samples or tried == 0:
        return None
    ended = "" if stats.ended_by is None or interrupted else f"; {stats.ended_by}"
    if stats.skipped_paused and not failed:
        return (
            "no sample taken: the VM was paused by someone else throughout "
            f"({stats.skipped_paused} ticks skipped; it is left paused){ended}"
        )
    return (
        f"no sample taken in {tried} ticks ({stats.skipped_paused} skipped while the VM was "
        f"paused by others, {failed} failed){ended}"
    )
