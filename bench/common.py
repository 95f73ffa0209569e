"""Shared by the benchmarks: boot the example guest, capture raw samples from it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.model import RawSample
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession, paused
from tests.guest_vm import Guest, boot_guest, stop_guest


@contextmanager
def booted_guest(*boot_args: str) -> Iterator[Guest]:
    """The example guest running in QEMU for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory:
        guest = boot_guest(Path(directory), *boot_args)
        try:
            yield guest
        finally:
            stop_guest(guest)


async def capture_samples(
    qmp: str, count: int, stack_bytes: int, analyzer: Analyzer
) -> list[RawSample]:
    """`count` raw samples taken back to back (the VM paused for each)."""
    session = await QmpSession.connect(qmp)
    memory = await open_memory(session, "auto")
    capturer = Capturer(session, memory, analyzer, CaptureConfig(stack_bytes=stack_bytes))
    samples: list[RawSample] = []
    try:
        while len(samples) < count:
            async with paused(session):
                samples += await capturer.capture()
    finally:
        await memory.close()
        await session.close()
    return samples
