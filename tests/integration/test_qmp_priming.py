"""QmpSession.prime against a real QEMU: a command sent but for its closing brace waits
in QEMU's parser, answers when completed, is cancelled unrun (its refusal dropped) when
another command comes first, and is forgotten when the connection closes. A command
sent with another (`hmp(..., first=...)`) runs just before it. The sampler primes
`stop` before each stop-mode tick and sends it with the register request, primes `cont`
while a paused VM's memory is read directly, and primes `info registers -a` in
nonblocking mode; none may leave a reply out of step or the VM paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from qmpprof.analysis import Analyzer
from qmpprof.errors import CommandFailed
from qmpprof.model import CapturedSample
from qmpprof.modules import load_module
from qmpprof.record.capture import REGISTERS, CaptureConfig, Capturer
from qmpprof.record.sampler import LoopConfig, sample_loop
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.integration.conftest import Guest, running_guest, scratch_ram_file


@pytest.fixture
async def session(guest: Guest) -> AsyncIterator[QmpSession]:
    connected = await QmpSession.connect(guest.qmp)
    try:
        yield connected
    finally:
        await connected.close()


async def test_a_primed_request_answers_when_executed(session: QmpSession) -> None:
    session.hmp_prime(REGISTERS)
    session.hmp_prime(REGISTERS)  # priming twice sends nothing more
    assert [cpu.vcpu for cpu in parse_all(await session.hmp(REGISTERS))] == [0]


async def test_another_command_cancels_the_primed_one_unrun(session: QmpSession) -> None:
    session.prime("stop")
    assert (await session.execute("query-status"))["status"] == "running"
    session.prime("stop")
    session.prime("query-status")  # priming another command cancels the primed one too
    assert (await session.execute("query-status"))["status"] == "running"
    session.prime("stop")
    await session.execute("stop")
    assert (await session.execute("query-status"))["status"] == "paused"
    await session.execute("cont")


async def test_replies_stay_in_step_around_primed_commands(session: QmpSession) -> None:
    session.hmp_prime(REGISTERS)
    status = await session.execute("query-status")
    assert status["status"] == "running"
    version = await session.hmp("info version")
    assert "RAX=" not in version and version.strip()[0].isdigit()
    session.hmp_prime(REGISTERS)
    session.hmp_prime("info version")  # a different command replaces the primed one
    assert (await session.hmp("info version")).strip() == version.strip()
    assert parse_all(await session.hmp(REGISTERS))


async def test_a_primed_command_never_completed_is_forgotten_with_the_connection(
    guest: Guest,
) -> None:
    first = await QmpSession.connect(guest.qmp)
    first.prime("stop")
    await first.close()
    second = await QmpSession.connect(guest.qmp)
    try:
        assert (await second.execute("query-status"))["status"] == "running"
    finally:
        await second.close()


async def test_a_command_sent_first_runs_before_the_hmp_command_in_one_round_trip(
    session: QmpSession,
) -> None:
    session.prime("stop")  # as the sampler does: completed by the pipelined `stop`
    assert "paused" in await session.hmp("info status", first="stop")
    await session.execute("cont")
    assert "running" in await session.hmp("info status")


async def test_a_failing_first_command_raises_and_replies_stay_in_step(
    session: QmpSession,
) -> None:
    with pytest.raises(CommandFailed, match="no-such-command"):
        await session.hmp("info version", first="no-such-command")
    assert (await session.execute("query-status"))["status"] == "running"
    assert parse_all(await session.hmp(REGISTERS))


@pytest.fixture
def guest_with_ram_file(workdir: Path) -> Iterator[tuple[Guest, str]]:
    with (
        scratch_ram_file() as ram,
        running_guest(workdir, "--accel", "tcg", "--memory-backend", ram) as booted,
    ):
        yield booted, ram


@pytest.mark.parametrize("nonblocking", [False, True], ids=["stop", "nonblocking"])
async def test_sampling_with_primed_commands_leaves_the_vm_running_and_replies_in_step(
    guest_with_ram_file: tuple[Guest, str], nonblocking: bool
) -> None:
    guest, ram = guest_with_ram_file
    session = await QmpSession.connect(guest.qmp)
    memory = await open_memory(session, "direct", ram)
    try:
        analyzer = Analyzer(load_module(guest.kernel))
        capturer = Capturer(session, memory, analyzer, CaptureConfig())
        taken: list[CapturedSample] = []
        config = LoopConfig(1 / 200, 0.5, nonblocking=nonblocking)
        stats = await sample_loop(session, capturer, config, asyncio.Event(), taken.extend)
        assert stats.ticks > 1 and stats.failed == 0, stats.last_error
        assert (stats.paused_s > 0) != nonblocking
        assert all(one.raw.error is None for one in taken)
        assert all(len(analyzer.symbolize(one).frames) > 1 for one in taken)
        assert (await session.execute("query-status"))["status"] == "running"
        assert parse_all(await session.hmp(REGISTERS))
    finally:
        await memory.close()
        await session.close()
