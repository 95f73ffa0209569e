"""QmpSession.prime against a real QEMU: a command sent but for its closing brace waits
in QEMU's parser, answers when completed, is cancelled unrun (its refusal dropped) when
another command comes first, and is forgotten when the connection closes. A command
sent with another (`hmp(..., first=...)`) runs just before it. The sampler primes
`stop` before each stop-mode tick and sends it with the register request, primes `cont`
while a paused VM's memory is read directly, and primes `info registers -a` in
nonblocking mode; none may leave a reply out of step or the VM paused. A nonblocking
sample whose stack tore is taken again, with the VM running all along.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.console.summary import render_summary
from qmpprof.errors import CommandFailed
from qmpprof.model import CapturedSample
from qmpprof.modules import load_module
from qmpprof.profile import Profile
from qmpprof.record.capture import REGISTERS, CaptureConfig, Capturer
from qmpprof.record.sampler import MAX_RETAKES, LoopConfig, sample_loop
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.integration.conftest import Guest, running_guest, scratch_ram_file
from tests.seeds import seeded


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
        unwound = [len(analyzer.symbolize(one).frames) > 1 for one in taken]
        # A stack read while its vCPU runs may still be torn after the retakes
        # (RecordStats.still_torn), and a torn read can end at its first frame.
        assert all(unwound) if not nonblocking else any(unwound)
        assert (await session.execute("query-status"))["status"] == "running"
        assert parse_all(await session.hmp(REGISTERS))
    finally:
        await memory.close()
        await session.close()


#: The share of samples the test below calls torn besides those that are.
FORCED_TORN = 0.3


async def test_nonblocking_takes_torn_samples_again_with_the_vm_running(
    guest_with_ram_file: tuple[Guest, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torn stacks are rare and come when they will, so the torn check is told, besides
    the stacks that are torn, that the first sample and a seeded share of the others
    are: each retake is a real register read of the running VM, its sample the one
    published, and every published stack that is torn is counted as still torn."""
    guest, ram = guest_with_ram_file
    session = await QmpSession.connect(guest.qmp)
    memory = await open_memory(session, "direct", ram)
    try:
        analyzer = Analyzer(load_module(guest.kernel))
        capturer = Capturer(session, memory, analyzer, CaptureConfig())
        really_torn, draws = analyzer.is_torn, seeded("forced torn")
        judged: list[CapturedSample] = []

        def told_torn(sample: CapturedSample) -> bool:
            judged.append(sample)
            return really_torn(sample) or len(judged) == 1 or draws.random() < FORCED_TORN

        monkeypatch.setattr(analyzer, "is_torn", told_torn)
        published: list[CapturedSample] = []
        run_events = session.run_event_count
        config = LoopConfig(1 / 200, 0.5, nonblocking=True)
        stats = await sample_loop(session, capturer, config, asyncio.Event(), published.extend)
        assert stats.failed == 0, stats.last_error
        assert session.run_event_count == run_events  # no STOP, no RESUME: never paused
        assert published[0].raw.time > judged[0].raw.time  # the retake's sample
        # One retake takes again every vCPU that tore in its tick: two torn in one tick
        # cost one register read, so samples retaken may outnumber the retakes.
        assert stats.retaken >= 1 and 1 <= stats.retakes <= MAX_RETAKES * stats.retaken
        assert stats.still_torn <= stats.retaken
        assert sum(analyzer.symbolize(s).torn for s in published) <= stats.still_torn
        console = Console(record=True, width=300)
        render_summary(Profile(), stats, console)
        summary = console.export_text()
        assert f"torn stacks retaken: {stats.retaken} vCPU samples" in summary
        assert f"in {stats.retakes} more register read" in summary
        assert (await session.execute("query-status"))["status"] == "running"
    finally:
        await memory.close()
        await session.close()
