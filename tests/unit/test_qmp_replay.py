"""QmpSession against exchanges recorded from a real QEMU 7 and replayed byte for byte
(tests/unit/qmp_replay.py; re-record with tests/unit/data/qmp/record.py).

Every replay also checks that qmpprof sent exactly the recorded bytes. The expected
values below are QEMU's, read from the recordings.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from qmpprof.errors import (
    BadQmpMessage,
    CommandFailed,
    ConnectionFailed,
    TargetGone,
    TickOverrun,
)
from qmpprof.target import qmp
from qmpprof.target.qmp import QmpSession, RunEvent
from tests.unit.qmp_replay import Chunk, Replay, recorded, serve, until

#: For waits that must expire (nothing is coming): short, not to slow the tests.
SHORT_S = 0.05
#: A deadline that stop's reply, already queued by the fake server, must beat: long
#: enough for a loaded host to deliver it, short enough for a unit test.
REPLY_DEADLINE_S = 0.5
#: For waits that must not expire: the fake QEMU answers at once, but a loaded host may
#: not run this process for a while.
PATIENT_S = 60.0


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="qmprep-") as name:  # unix paths are short
        yield Path(name) / "qmp.sock"


async def replayed(path: Path, replay: Replay, timeout: float = PATIENT_S) -> QmpSession:
    """A session connected to a fake QEMU replaying `replay`."""
    server = await serve(path, replay)
    _SERVERS.append(server)
    return await QmpSession.connect(str(path), timeout=timeout)


_SERVERS: list[asyncio.Server] = []


@pytest.fixture(autouse=True)
async def close_servers() -> AsyncIterator[None]:
    yield
    while _SERVERS:
        _SERVERS.pop().close()


def spoke_as_recorded(replay: Replay) -> None:
    assert not replay.mismatches
    assert not replay.client_left_early


async def test_the_handshake_negotiates_capabilities(socket_path: Path) -> None:
    replay = Replay(recorded("handshake"))
    session = await replayed(socket_path, replay)
    await session.close()
    spoke_as_recorded(replay)


async def test_commands_return_qemus_values_and_errors(socket_path: Path) -> None:
    replay = Replay(recorded("commands"))
    session = await replayed(socket_path, replay)
    status = await session.execute("query-status")
    assert status == {"status": "running", "singlestep": False, "running": True}
    text = await session.hmp("info registers", cpu=1)
    assert text.startswith("\r\nCPU#1\r\nEAX=000f49f6 ")
    with pytest.raises(CommandFailed, match="The command no-such-command has not been found"):
        await session.execute("no-such-command")
    await session.close()
    spoke_as_recorded(replay)


async def test_events_among_replies_are_followed(socket_path: Path) -> None:
    """QEMU sent the STOP event before stop's reply, and RESUME before cont's."""
    replay = Replay(recorded("stop_and_cont"))
    session = await replayed(socket_path, replay)
    assert await session.is_running()  # asked with query-status: no event yet
    mark = session.run_event_count
    registers = await session.hmp("info registers -a", first="stop")
    assert "CPU#0" in registers and "CPU#1" in registers
    assert session.run_events_since(mark) == [RunEvent(False, 1795457596806986)]
    assert session.stop_sent_us is not None
    await session.cont()
    assert session.run_events_since(mark) == [
        RunEvent(False, 1795457596806986),
        RunEvent(True, 1795457596808258),
    ]
    assert session.take_last_pause() == pytest.approx(0.001272, abs=1e-6)  # QEMU's stamps
    assert session.take_last_pause() is None  # once
    assert (await session.execute("query-status"))["running"]
    await session.close()
    spoke_as_recorded(replay)


async def test_primed_commands_run_once_or_are_cancelled_unrun(socket_path: Path) -> None:
    """A primed command completes with its last byte; one replaced by another command, or
    cancelled, is ended with a member QEMU refuses, and its refusal is dropped."""
    replay = Replay(recorded("priming"))
    session = await replayed(socket_path, replay)
    session.prime("query-status")
    session.prime("query-status")  # the same again: nothing more is sent
    assert (await session.execute("query-status"))["running"]
    session.hmp_prime("info registers -a")
    assert await session.execute("query-name") == {"name": "qmpprof-guest"}
    session.prime("stop")
    session.cancel_primed()
    session.cancel_primed()  # nothing primed: nothing sent
    assert (await session.execute("query-status"))["running"]
    await session.close()
    spoke_as_recorded(replay)


async def test_a_silent_socket_times_out_as_asked(socket_path: Path) -> None:
    replay = Replay([])
    with pytest.raises(ConnectionFailed, match=r"no QMP greeting within 0\.05 s"):
        await replayed(socket_path, replay, timeout=SHORT_S)


async def test_a_command_qemu_never_answers_times_out(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", SHORT_S)
    chunks = recorded("commands")
    replay = Replay(until(chunks, b'"running": true'))  # query-status is read, never answered
    session = await replayed(socket_path, replay)
    with pytest.raises(CommandFailed, match=r"'query-status'.*no answer within 0\.05 s"):
        await session.execute("query-status")
    assert session.timed_out
    await session.close()
    spoke_as_recorded(replay)


async def test_a_tick_past_its_deadline_sends_nothing(socket_path: Path) -> None:
    chunks = recorded("stop_and_cont")
    replay = Replay(until(chunks, b'"execute":"stop"'))
    session = await replayed(socket_path, replay)
    assert await session.is_running()
    session.deadline = asyncio.get_running_loop().time()
    with pytest.raises(TickOverrun, match="before 'stop'"):
        await session.hmp("info registers -a", first="stop")
    await session.close()
    spoke_as_recorded(replay)


async def test_a_reply_that_outlives_the_deadline_is_a_tick_overrun(socket_path: Path) -> None:
    """stop is answered, the registers never come: the tick ends at its deadline."""
    chunks = recorded("stop_and_cont")
    replay = Replay(until(chunks, b"CPU#0"))
    session = await replayed(socket_path, replay)
    assert await session.is_running()
    session.deadline = asyncio.get_running_loop().time() + REPLY_DEADLINE_S
    with pytest.raises(TickOverrun, match="in 'human-monitor-command'"):
        await session.hmp("info registers -a", first="stop")
    assert not await session.is_running()  # the STOP event came before stop's reply
    await session.close()
    spoke_as_recorded(replay)


def cut_in_reply(chunks: list[Chunk], marker: bytes) -> list[Chunk]:
    """The chunks up to the reply holding `marker`, and the first half of that reply."""
    kept = until(chunks, marker)
    reply = chunks[len(kept)][1]
    return [*kept, ("qemu", reply[: len(reply) // 2])]


async def test_qemu_gone_mid_reply_is_target_gone(socket_path: Path) -> None:
    replay = Replay(cut_in_reply(recorded("commands"), b"CPU#1"), hang_up=True)
    session = await replayed(socket_path, replay)
    await session.execute("query-status")
    with pytest.raises(TargetGone, match="during 'human-monitor-command'"):
        await session.hmp("info registers", cpu=1)
    with pytest.raises(TargetGone, match="before 'query-status'"):
        await session.execute("query-status")
    session.prime("query-status")  # a hint: does nothing once QEMU has gone
    await session.close()
    spoke_as_recorded(replay)


async def test_qemu_gone_during_negotiation_fails_the_connection(socket_path: Path) -> None:
    replay = Replay(until(recorded("handshake"), b'{"return"'), hang_up=True)
    with pytest.raises(ConnectionFailed, match="capability negotiation failed"):
        await replayed(socket_path, replay)
    spoke_as_recorded(replay)


def with_reply(chunks: list[Chunk], marker: bytes, line: bytes) -> list[Chunk]:
    """The recording with the reply holding `marker` replaced by `line`."""
    kept = until(chunks, marker)
    return [*kept, ("qemu", line), *chunks[len(kept) + 1 :]]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"return": {"status": "running"\r\n', r"not JSON: Expecting ',' delimiter"),
        (b"[1, 2]\r\n", "JSON list, not an object"),
        (b'"running"\r\n', "JSON str, not an object"),
        (b"\xff\x1b[2J\r\n", "not JSON: 'utf-8' codec can't decode byte 0xff"),
        (b'{"return": "' + b"x" * 100, "a line longer than 64 bytes"),
    ],
    ids=["cut", "array", "string", "binary", "endless"],
)
async def test_a_malformed_line_is_its_own_error_and_ends_the_session(
    socket_path: Path, monkeypatch: pytest.MonkeyPatch, line: bytes, reason: str
) -> None:
    """Not "QEMU closed the connection": QEMU is there, but what it said cannot be trusted
    to match the commands, so the session ends and a VM it paused is resumed afresh."""
    monkeypatch.setattr(qmp, "MAX_LINE", 64)
    replay = Replay(with_reply(recorded("commands"), b'"running": true', line))
    session = await replayed(socket_path, replay)
    with pytest.raises(BadQmpMessage) as raised:
        await session.execute("query-status")
    message = str(raised.value)
    assert message.startswith("QEMU's monitor sent a malformed line during 'query-status' (")
    assert re.search(reason, message) and "\n" not in message and "\x1b" not in message
    assert session.timed_out  # target.pause resumes on a fresh connection
    with pytest.raises(BadQmpMessage, match="malformed line before 'human-monitor-command'"):
        await session.hmp("info registers", cpu=1)
    await session.close()


async def test_a_malformed_greeting_is_not_qmp(socket_path: Path) -> None:
    replay = Replay(with_reply(recorded("handshake"), b'"QMP"', b"{QMP\r\n"))
    with pytest.raises(ConnectionFailed, match="not a QMP socket"):
        await replayed(socket_path, replay)
