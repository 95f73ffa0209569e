"""Shared by the benchmarks: boot the example guest, capture raw samples from it."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from qmpprof.model import RawSample
from qmpprof.record.capture import CaptureConfig, capture_vcpus
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession, paused

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "examples" / "guest" / "boot.sh"


@dataclass(frozen=True)
class BootedGuest:
    pid: int
    kernel: Path
    qmp: str


@contextmanager
def booted_guest(*boot_args: str) -> Iterator[BootedGuest]:
    """The example guest running in QEMU for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory:
        qmp = str(Path(directory) / "qmp.sock")
        done = subprocess.run(
            [str(BOOT), "--qmp", qmp, *boot_args], check=True, capture_output=True, text=True
        )
        values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        guest = BootedGuest(int(values["pid"]), Path(values["kernel"]), values["qmp"])
        try:
            yield guest
        finally:
            subprocess.run([str(BOOT), "stop", str(guest.pid)], check=False)


async def capture_samples(qmp: str, count: int, stack_bytes: int) -> list[RawSample]:
    """`count` raw samples of vCPU 0 taken back to back (the VM paused for each)."""
    session = await QmpSession.connect(qmp)
    memory = await open_memory(session, "auto")
    config = CaptureConfig(stack_bytes=stack_bytes)
    samples: list[RawSample] = []
    try:
        while len(samples) < count:
            async with paused(session):
                samples += await capture_vcpus(session, memory, config)
    finally:
        await memory.close()
        await session.close()
    return samples
