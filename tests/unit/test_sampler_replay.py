"""record/sampler.py against stop-mode ticks recorded from the example guest and replayed
byte for byte (tests/unit/data/qmp/record_capture.py made them): another client's
pause left alone, failing ticks counted until the loop gives up, QEMU quitting.

The values checked are QEMU's, read from the recordings (its event timestamps, its
answer to a misspelt command), or follow from the schedule of events they hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

import qmpprof.record.capture as capture
import qmpprof.record.sampler as sampler
from qmpprof.model import CapturedSample, EndReason, RecordStats
from qmpprof.record.capture import Capturer
from qmpprof.record.sampler import LoopConfig, paused_capture, sample_loop
from qmpprof.target import qmp
from qmpprof.target.memory import HmpMemory
from qmpprof.target.qmp import QmpSession
from tests.unit.data.qmp.guest_setup import MISSPELT_REGISTERS, TICK, tick_analyzer
from tests.unit.qmp_replay import Chunk, Replay, recorded
from tests.unit.test_capture_replay import replay_session
from tests.unit.test_qmp_replay import PATIENT_S, spoke_as_recorded

#: The loop's period: any works (priming a `stop` sends the same bytes, in two writes).
PERIOD_S = 0.002
MAX_TICKS = 50


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tick is abandoned, and no reply given up on, because this host was busy: the
    fake QEMU answers at once."""
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", PATIENT_S)
    monkeypatch.setattr(sampler, "TICK_BUDGET_S", PATIENT_S)


def run_state_events(chunks: list[Chunk]) -> list[tuple[str, int]]:
    """QEMU's STOP and RESUME events in a recording: (name, timestamp in microseconds)."""
    lines = b"".join(data for who, data in chunks if who == "qemu").splitlines()
    events = [json.loads(line) for line in lines if b'"event"' in line]
    return [
        (e["event"], e["timestamp"]["seconds"] * 1_000_000 + e["timestamp"]["microseconds"])
        for e in events
        if e["event"] in ("STOP", "RESUME")
    ]


class RecordedWallClock:
    """The `time` module as the QMP session sees it, but for a real-time clock stopped
    when the recording's first event came: whether a pause is ours is decided by
    comparing QEMU's event timestamps with the time our `stop` was sent (target/pause.py),
    and a recording's timestamps would all be older than a `stop` sent today."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self._ns = run_state_events(chunks)[0][1] * 1000

    def time_ns(self) -> int:
        return self._ns

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def replayed_ticks(name: str, monkeypatch: pytest.MonkeyPatch, hang_up: bool = False) -> Replay:
    chunks = recorded(name)
    monkeypatch.setattr(qmp, "time", RecordedWallClock(chunks))
    return Replay(chunks, hang_up)


def tick_capturer(session: QmpSession) -> Capturer:
    return Capturer(session, HmpMemory(session), tick_analyzer(), TICK)


async def looped(
    session: QmpSession, until_skipped: bool = False
) -> tuple[RecordStats, list[CapturedSample]]:
    """The sampling loop until it ends itself (or, `until_skipped`, has skipped a tick)."""
    stop = asyncio.Event()
    samples: list[CapturedSample] = []

    def progress(stats: RecordStats) -> None:
        # A bound on ticks, not a time: the recordings hold a few; a loop that should
        # have ended fails its test rather than hangs it.
        if (until_skipped and stats.skipped_paused) or stats.requested >= MAX_TICKS:
            stop.set()

    assert await session.is_running()  # as recorded: query-status before the first tick
    config = LoopConfig(period_s=PERIOD_S, duration_s=None)
    stats = await sample_loop(
        session, tick_capturer(session), config, stop, samples.extend, progress
    )
    return stats, samples


async def test_a_vm_paused_by_another_client_is_skipped_and_left_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our tick, then another client's STOP: the next tick neither samples nor resumes
    (the replay would see any `cont`)."""
    replay = replayed_ticks("tick_then_paused_by_other", monkeypatch)
    async with replay_session(replay) as session:
        capturer, stats = tick_capturer(session), RecordStats()
        assert await session.is_running()
        samples = await paused_capture(session, capturer, stats, None)
        assert samples is not None and [s.raw.vcpu for s in samples] == [0, 1]
        (_, stopped), (_, resumed), _ = run_state_events(replay.chunks)  # ours, the other's
        assert stats.paused_s == pytest.approx((resumed - stopped) / 1e6, abs=1e-6)
        assert await paused_capture(session, capturer, stats, None) is None
        assert stats.skipped_paused == 1
        assert not await session.is_running()
    spoke_as_recorded(replay)


async def test_the_loop_counts_a_tick_skipped_for_another_clients_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replay = replayed_ticks("tick_then_paused_by_other", monkeypatch)
    async with replay_session(replay) as session:
        stats, samples = await looped(session, until_skipped=True)
    spoke_as_recorded(replay)
    assert (stats.ticks, stats.samples, stats.skipped_paused, stats.failed) == (1, 2, 1, 0)
    assert len(samples) == 2 and stats.ended_by is None


async def test_five_failed_ticks_in_a_row_end_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tick's register request is answered with HMP's usage text: each tick fails,
    is counted, and resumes the VM it paused; the fifth ends the loop."""
    monkeypatch.setattr(capture, "REGISTERS", MISSPELT_REGISTERS)
    replay = replayed_ticks("failing_ticks", monkeypatch)
    async with replay_session(replay) as session:
        stats, samples = await looped(session)
        assert await session.is_running()  # QEMU's RESUME after every failed tick
    spoke_as_recorded(replay)
    assert stats.failed == sampler.MAX_CONSECUTIVE_FAILURES == 5
    assert (stats.ticks, samples) == (0, [])
    assert stats.ended_by is not None and stats.ended_by.reason is EndReason.TICKS_FAILED
    assert str(stats.ended_by) == (
        "5 failed samples in a row (no 'CPU#n' block in 'info registers -a' output)"
    )


async def test_qemu_quitting_ends_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick, then QEMU quits (SHUTDOWN, then it hangs up): the next tick finds it gone."""
    replay = replayed_ticks("tick_then_quit", monkeypatch, hang_up=True)
    async with replay_session(replay) as session:
        stats, samples = await looped(session)
    spoke_as_recorded(replay)
    assert (stats.ticks, stats.failed, len(samples)) == (1, 0, 2)
    assert stats.ended_by is not None and stats.ended_by.reason is EndReason.QEMU_EXITED
