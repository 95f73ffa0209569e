"""Stop mode unwinds a copy: with guest RAM read on this host, a tick copies the memory
its unwind will read while the VM is paused and unwinds that copy once the VM runs again
(Capturer.take, Capturer.finish), as perf copies a user stack. The oracle is the exact
examination: at each pause both run, the copy and, still paused, the live examination
that reads whatever it needs from the guest (Capturer.capture, what `dump` does), and
every sample of the busy Linux guest (CPU-bound, system-call and threaded workloads,
KASLR on) must come out the same from both, frame for frame and task for task."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import CapturedSample, RawSample
from qmpprof.target.pause import paused
from tests.linux_vm import BUILD, LinuxGuest, running_linux

WORKLOADS = tuple(BUILD / name for name in ("crunch", "crunchnofp", "sysloop", "pinned", "sleeper"))
PAUSES = 150


@pytest.fixture(scope="module")
def busy_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("copied"), "--smp", "2") as guest:
        yield guest


Pair = tuple[CapturedSample, CapturedSample]


async def copied_and_exact(guest: LinuxGuest) -> list[Pair]:
    """Per vCPU and pause: (the copy's sample, the live examination's sample)."""
    options = TargetOptions(guest.qmp, guest.kernel, user_files=WORKLOADS, memory="direct")
    analyzer = build_analyzer(options)
    pairs: list[Pair] = []
    copies = 0
    async with connected(options, analyzer) as (session, _, capturer):
        for _ in range(PAUSES):
            async with paused(session) as ours:
                assert ours, "someone else paused the guest"
                taken = await capturer.take()
                copies += sum(isinstance(item, RawSample) for item in taken)
                copied = await capturer.finish(taken)
                exact = await capturer.capture()
            pairs += zip(copied, exact, strict=True)
    assert copies > len(pairs) * 0.9, f"only {copies} of {len(pairs)} samples were copies"
    return pairs


def summary(sample: CapturedSample) -> tuple[object, ...]:
    return sample.process, tuple(frame.address for frame in sample.stack.frames)


def test_the_copy_unwinds_as_the_paused_guest_does(busy_guest: LinuxGuest) -> None:
    pairs = asyncio.run(copied_and_exact(busy_guest))
    different = [(c, e) for c, e in pairs if summary(c) != summary(e)]
    kernel = sum(e.raw.registers.cpl == 0 for _, e in pairs)
    assert kernel and kernel < len(pairs), "no kernel or no user samples to compare"
    assert not different, [
        (summary(c), summary(e), c.stack.stop, e.stack.stop) for c, e in different[:3]
    ]
