"""A lightly loaded Linux guest (4 vCPUs, one CPU-bound program): most samples are of
halted vCPUs, and most of those halted in the same place with the same registers as at
their vCPU's last sample. Such a sample is that last one again (Capturer._unchanged):
here it must be what reading and unwinding that vCPU anew gives at the same moment
(the tick's `take` of every vCPU again, as a retake reads them: nothing reused), over
ticks between which the guest ran, and symbolized the same."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import CapturedSample
from qmpprof.target.qmp import paused
from tests.linux_vm import LinuxGuest, running_linux

TICKS = 60


@pytest.fixture(scope="module")
def idle_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    arguments = ("--smp", "4", "--workloads", "crunch")
    with running_linux(tmp_path_factory.mktemp("idle"), *arguments) as guest:
        yield guest


def what_was_found(sample: CapturedSample) -> tuple[object, ...]:
    return sample.raw.registers, sample.stack, sample.process, sample.raw.error


async def test_a_halted_vcpu_unchanged_since_its_last_sample_is_that_sample_again(
    idle_guest: LinuxGuest,
) -> None:
    options = TargetOptions(idle_guest.qmp, None, memory="direct")
    analyzer = build_analyzer(options)
    async with connected(options, analyzer) as (session, _, capturer):
        for _ in range(TICKS):
            async with paused(session) as ours:
                assert ours
                ticked = await capturer.finish(await capturer.take())
                vcpus = {sample.raw.vcpu for sample in ticked}
                anew = await capturer.finish(await capturer.take(only=vcpus))
            assert [what_was_found(s) for s in ticked] == [what_was_found(s) for s in anew]
            # A replayed sample is not symbolized again (Analyzer.symbolize): the same Sample
            symbolized = [replace(analyzer.symbolize(s), time=0.0) for s in ticked]
            assert symbolized == [replace(analyzer.symbolize(s), time=0.0) for s in anew]
            assert len({sample.raw.time for sample in ticked}) == 1, "a time not the tick's"
    assert capturer.unchanged_halted > 0, "idle vCPUs were read and unwound every tick"
