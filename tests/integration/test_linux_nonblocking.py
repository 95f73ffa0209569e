"""--nonblocking on the busy Linux guest (CPU-bound, system-call and threaded workloads on
two vCPUs, KASLR on): the VM is never paused, a sample that tore while it was read is
taken again (record/sampler.py retake_torn), and every sample published torn all the
same is one the summary counts as still torn.

A sample tears here mostly when its vCPU switches tasks between the register read and
the memory read (sampler.switched_task: the task read does not own CR3's page tables),
a few times in a hundred samples on this host; how often is the guest's business. So
besides the real checks, the torn check is told that the first sample tore, and the
summary must report that retake (the test's only draw; no timing is asserted)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from rich.console import Console

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.console.summary import render_summary
from qmpprof.model import CapturedSample, RecordStats
from qmpprof.profile import Profile
from qmpprof.record.capture import registers_of
from qmpprof.record.sampler import MAX_RETAKES, LoopConfig, sample_loop, switched_task
from qmpprof.target.qmp import QmpSession
from tests.linux_vm import BUILD, LinuxGuest, running_linux

WORKLOADS = tuple(BUILD / name for name in ("crunch", "crunchnofp", "sysloop", "pinned", "sleeper"))
RATE_HZ = 200
SECONDS = 3.0


@pytest.fixture(scope="module")
def busy_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("nonblocking"), "--smp", "2") as guest:
        yield guest


async def sampled(
    guest: LinuxGuest, monkeypatch: pytest.MonkeyPatch
) -> tuple[RecordStats, list[CapturedSample], list[CapturedSample], list[CapturedSample]]:
    """Nonblocking sampling as `record` connects: the stats, the published samples, those
    of them that are torn by either check, and every sample the torn check judged."""
    options = TargetOptions(guest.qmp, guest.kernel, user_files=WORKLOADS, memory="direct")
    analyzer = build_analyzer(options)
    really_torn = analyzer.is_torn
    judged: list[CapturedSample] = []

    def told_torn(sample: CapturedSample) -> bool:
        judged.append(sample)
        return really_torn(sample) or len(judged) == 1

    monkeypatch.setattr(analyzer, "is_torn", told_torn)
    published: list[CapturedSample] = []
    async with connected(options, analyzer) as (session, _, capturer):
        asked = asked_registers(session, monkeypatch)
        run_events = session.run_event_count
        config = LoopConfig(1 / RATE_HZ, SECONDS, nonblocking=True)
        stats = await sample_loop(session, capturer, config, asyncio.Event(), published.extend)
        assert session.run_event_count == run_events, "a STOP or RESUME: the VM was paused"
        assert (await session.execute("query-status"))["status"] == "running"
    torn = [s for s in published if switched_task(s) or analyzer.symbolize(s).torn]
    assert registers_of(judged[0].raw.vcpu) in asked, "the retake did not ask for its vCPU alone"
    return stats, published, torn, judged


def asked_registers(session: QmpSession, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The HMP command lines `session` sends from now on, as they go."""
    asked: list[str] = []
    hmp = session.hmp

    async def recorded(command_line: str, cpu: int | None = None, first: str | None = None) -> str:
        asked.append(command_line)
        return await hmp(command_line, cpu, first)

    monkeypatch.setattr(session, "hmp", recorded)
    return asked


def test_nonblocking_retakes_what_tore_and_counts_what_stayed_torn(
    busy_guest: LinuxGuest, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats, published, torn, judged = asyncio.run(sampled(busy_guest, monkeypatch))
    assert stats.failed == 0, stats.last_error
    assert stats.ticks > 1 and len(published) == stats.samples
    first = next(s for s in published if s.raw.vcpu == judged[0].raw.vcpu)
    assert first.raw.time > judged[0].raw.time, "the first sample was not taken again"
    # One retake takes again every vCPU that tore in its tick: two torn in one tick
    # cost one register read, so samples retaken may outnumber the retakes.
    assert stats.retaken >= 1 and 1 <= stats.retakes <= MAX_RETAKES * stats.retaken
    assert len(torn) <= stats.still_torn <= stats.retaken
    kernel = [s for s in published if s.raw.registers.cpl == 0]
    assert kernel and len(kernel) < len(published), "no kernel or no user samples"
    console = Console(record=True, width=300)
    render_summary(Profile(), stats, console)
    text = console.export_text()
    assert f"torn stacks retaken: {stats.retaken} vCPU samples" in text
    assert f"{stats.still_torn} still torn after the retakes" in text
