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


KERNEL_VIRTUAL_BASE = 0xFFFFFFFF80000000


def symbol_address(elf: Path, name: str) -> int:
    """A data symbol's address, from the ELF's .symtab."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with elf.open("rb") as stream:
        table = ELFFile(stream).get_section_by_name(".symtab")
        assert isinstance(table, SymbolTableSection)
        return int(next(s for s in table.iter_symbols() if s.name == name)["st_value"])


class ProgressCounter:
    """The guest's `workload_progress`, read from the RAM file QEMU shares with us
    (boot with --memory-backend), so it can be read while qmpprof holds the QMP socket."""

    def __init__(self, ram_file: Path, kernel: Path) -> None:
        import mmap

        physical = symbol_address(kernel, "workload_progress") - KERNEL_VIRTUAL_BASE
        self._offset = physical
        self._file = ram_file.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, prot=mmap.PROT_READ)

    def read(self) -> int:
        return int.from_bytes(self._map[self._offset : self._offset + 8], "little")

    def close(self) -> None:
        self._map.close()
        self._file.close()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@contextmanager
def booted_with_ram_file(*boot_args: str) -> Iterator[tuple[Guest, Path]]:
    """The example guest with its RAM in a file under /dev/shm that we can map."""
    with (
        tempfile.NamedTemporaryFile(prefix="qmpprof-bench-", suffix=".ram", dir="/dev/shm") as ram,
        booted_guest("--memory-backend", ram.name, *boot_args) as guest,
    ):
        yield guest, Path(ram.name)
