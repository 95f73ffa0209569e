"""QmpSession against a real QEMU that answers late or never: a command fails after the
timeout instead of waiting forever, and a slow reply does not hold up the event loop.
A reply larger than one read arrives whole, and a pause lasts from QEMU's own STOP
to its RESUME timestamp."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import qmpprof.target.qmp as qmp
from qmpprof.errors import CommandFailed
from qmpprof.target.qmp import QmpSession
from tests.integration.conftest import Guest


async def test_a_command_qemu_never_answers_fails_after_the_timeout(
    guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", 0.5)
    session = await QmpSession.connect(guest.qmp)
    try:
        # An unclosed JSON array: QEMU's parser waits for its end before it runs anything.
        transport = session._protocol.transport
        assert transport is not None
        transport.write(b"[")
        with pytest.raises(CommandFailed, match=r"no answer within 0\.5 s"):
            await session.execute("query-status")
    finally:
        await session.close()


async def test_a_slow_reply_leaves_the_event_loop_to_other_tasks(
    guest: Guest, tmp_path: Path
) -> None:
    # Saving 64 MiB of guest RAM takes QEMU tens of milliseconds: far longer than
    # QmpSession reads the socket directly before it waits through the event loop.
    size = 64 << 20
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    session = await QmpSession.connect(guest.qmp)
    counter = asyncio.create_task(count_turns())
    try:
        saved = tmp_path / "ram"
        await session.execute("pmemsave", {"val": 0, "size": size, "filename": str(saved)})
        turns_during_command = turns
        assert saved.stat().st_size == size
        assert await session.is_running()
    finally:
        counter.cancel()
        await session.close()
    assert turns_during_command > 0


async def test_a_pause_lasts_from_qemus_stop_to_its_resume(guest: Guest) -> None:
    session = await QmpSession.connect(guest.qmp)
    try:
        held = 0.05  # a pause at least this long, whatever the round trips take
        sent_stop = time.monotonic()
        await session.stop()
        await asyncio.sleep(held)
        await session.cont()
        round_trips_and_pause = time.monotonic() - sent_stop
        pause = session.take_last_pause()
        assert pause is not None and held <= pause < round_trips_and_pause
        assert session.take_last_pause() is None  # taken once
    finally:
        await session.close()


async def test_a_reply_larger_than_one_read_arrives_whole(guest: Guest) -> None:
    session = await QmpSession.connect(guest.qmp)
    try:
        words = 16384  # two 8-byte words a line: ~380 KB of text, several reads
        text = await session.hmp(f"xp /{words}gx 0")
        lines = text.splitlines()
        assert len(text) > 4 * qmp._READ_SIZE
        assert len(lines) == words // 2
        assert [int(line.split(":")[0], 16) for line in lines] == list(range(0, 8 * words, 16))
    finally:
        await session.close()
