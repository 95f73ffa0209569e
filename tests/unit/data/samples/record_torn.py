"""Record the nonblocking ticks tests/unit/test_retakes.py replays: `python -m
tests.unit.data.samples.record_torn` (from the repository root, after `make guest`).

It boots the example guest as the QMP recordings do (tests/unit/data/qmp/guest_setup.py:
the fp build's user workload on two vCPUs, TCG) with its RAM in a file, and takes
nonblocking ticks with qmpprof's own Capturer (direct memory, the VM never paused, one
page of stack), each examined with the kernel and user ELFs. Each tick in which a
vCPU's stack is torn (Analyzer.is_torn: a return address that follows no call) is taken
twice more at once, as sampler.retake_torn would, and the three ticks are kept: first
a group whose torn vCPU came back whole in the next tick, then one where it did not,
if the guest shows one within the ticks allowed; and one tick with nothing torn.
Everything is saved as torn_ticks.qmpcap beside this file, memory kept (the samples of
one tick share their time). Re-record when the example guest changes.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.model import CapturedSample, Recording
from qmpprof.record.capture import Capturer
from qmpprof.record.qmpcap import CaptureWriter
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession
from tests.guest_vm import running_guest, scratch_ram_file
from tests.unit.data.qmp.guest_setup import BOOT_ARGS, CAPTURE, built_guest, guest_analyzer

HERE = Path(__file__).parent
FIXTURE = HERE / "torn_ticks.qmpcap"
#: Ticks tried before giving up on a group of each kind.
MAX_TICKS = 20_000
PERIOD_S = 0.005


def torn_vcpus(analyzer: Analyzer, tick: list[CapturedSample]) -> set[int]:
    return {sample.raw.vcpu for sample in tick if analyzer.is_torn(sample)}


async def record(guest_qmp: str, ram: str) -> list[list[CapturedSample]]:
    session = await QmpSession.connect(guest_qmp)
    memory = await open_memory(session, "direct", ram)
    analyzer = guest_analyzer()
    capturer = Capturer(session, memory, analyzer, CAPTURE)
    kept: list[list[CapturedSample]] = []
    recovered = persisting = whole = False
    try:
        for _ in range(MAX_TICKS):
            tick = await capturer.capture()
            torn = torn_vcpus(analyzer, tick)
            if not torn and not whole:
                kept.append(tick)
                whole = True
            if torn and not (recovered and persisting):
                again = [await capturer.capture(), await capturer.capture()]
                still = torn & torn_vcpus(analyzer, again[0])
                if (not still and not recovered) or (still and not persisting):
                    kept += [tick, *again]
                    recovered, persisting = recovered or not still, persisting or bool(still)
            if recovered and persisting and whole:
                break
            await asyncio.sleep(PERIOD_S)
    finally:
        await memory.close()
        await session.close()
    print(f"kept {len(kept)} ticks: recovered {recovered}, persisting {persisting}")
    return kept


def main() -> None:
    built_guest()
    with (
        tempfile.TemporaryDirectory(prefix="qmptorn-") as work,
        scratch_ram_file() as ram,
        running_guest(Path(work), *BOOT_ARGS, "--memory-backend", ram) as guest,
    ):
        ticks = asyncio.run(record(guest.qmp, ram))
    recording = Recording(started=time.time(), duration_s=0.0, period_s=PERIOD_S)
    with CaptureWriter(FIXTURE, recording, keep_memory=True) as writer:
        for tick in ticks:
            for sample in tick:
                writer.add(sample)
    print(f"saved {sum(map(len, ticks))} samples in {FIXTURE}")


if __name__ == "__main__":
    main()
