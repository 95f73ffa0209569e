"""Shared by the benchmarks: boot the example guest, capture raw samples from it."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.defaults import DEFAULT_STACK_BYTES
from qmpprof.guest.adapter import GenericAdapter
from qmpprof.guest.registry import choose_adapter
from qmpprof.model import CapturedSample, RawSample, RecordStats
from qmpprof.modules import load_module
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.record.sampler import LoopConfig, sample_loop
from qmpprof.record.schedule import Schedule
from qmpprof.target.memory import open_memory
from qmpprof.target.qmp import QmpSession, paused
from tests.guest_vm import BareQmp, Guest, running_guest, scratch_ram_file


@contextmanager
def booted_guest(*boot_args: str) -> Iterator[Guest]:
    """The example guest running in QEMU for the duration of the block."""
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory,
        running_guest(Path(directory), *boot_args) as guest,
    ):
        yield guest


@asynccontextmanager
async def sampling_session(
    guest: Guest,
    memory: str = "direct",
    mem_path: Path | None = None,
    stack_bytes: int = DEFAULT_STACK_BYTES,
    with_adapter: bool = False,
) -> AsyncIterator[tuple[QmpSession, Analyzer, Capturer]]:
    """A QMP session, an analyzer with the guest's kernel and a capturer over them;
    `with_adapter`: the guest's OS adapter too (names processes, and gives an AArch64
    guest's page-table roots for direct memory)."""
    session = await QmpSession.connect(guest.qmp)
    adapter = choose_adapter(guest.kernel) if with_adapter else GenericAdapter()
    path = str(mem_path) if mem_path else None
    backend = await open_memory(session, memory, path, user_roots=adapter.gives_user_roots)
    analyzer = Analyzer(load_module(guest.kernel), adapter=adapter)
    try:
        yield session, analyzer, Capturer(session, backend, analyzer, CaptureConfig(stack_bytes))
    finally:
        await backend.close()
        await session.close()


#: Runs one sampling method at `hz` for `seconds` over an open connection.
RunAt = Callable[[float, float], Awaitable[RecordStats]]


@asynccontextmanager
async def sampling_method(guest: Guest, ram: Path, method: str) -> AsyncIterator[RunAt]:
    """A way to sample the guest, connected once and run as often as needed.

    `stop` and `nonblocking` are qmpprof's sampling loop with every sample analysed;
    `floor_stop` and `floor_nonblocking` are their floors (see `floor_loop`).
    """
    if method.startswith("floor_"):
        qmp = BareQmp(guest.qmp)
        try:
            yield lambda hz, seconds: floor_loop(qmp, hz, method.removeprefix("floor_"), seconds)
        finally:
            qmp.close()
        return
    async with sampling_session(guest, mem_path=ram) as (session, analyzer, capturer):

        def analyse_all(captured: list[CapturedSample]) -> None:
            for one in captured:
                analyzer.symbolize(one)

        async def run(hz: float, seconds: float) -> RecordStats:
            config = LoopConfig(1 / hz, seconds, nonblocking=method == "nonblocking")
            return await sample_loop(session, capturer, config, asyncio.Event(), analyse_all)

        yield run


async def capture_samples(guest: Guest, count: int, stack_bytes: int) -> list[RawSample]:
    """`count` raw samples taken back to back (the VM paused for each)."""
    samples: list[RawSample] = []
    async with sampling_session(guest, "auto", stack_bytes=stack_bytes) as (session, _, capturer):
        while len(samples) < count:
            async with paused(session):
                samples += [captured.raw for captured in await capturer.capture()]
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
    with scratch_ram_file() as ram, booted_guest("--memory-backend", ram, *boot_args) as guest:
        yield guest, Path(ram)


#: The HMP command that gives every vCPU's registers, as QMP arguments.
REGISTERS: dict[str, object] = {"command-line": "info registers -a"}


def floor_tick(qmp: BareQmp, mode: str) -> None:
    """What one sample needs from QEMU in `mode`, and nothing else."""
    if mode == "nonblocking":
        qmp.call("human-monitor-command", REGISTERS)
        return
    qmp.call("stop")
    qmp.call("human-monitor-command", REGISTERS)
    qmp.call("cont")


async def floor_loop(qmp: BareQmp, hz: float, mode: str, seconds: float) -> RecordStats:
    """The floor of qmpprof's loop: the same schedule and QMP commands from a bare socket,
    no memory reads, no unwinding. What QEMU on this machine allows at best.

    Blocks the event loop while it runs: nothing else is meant to run meanwhile."""
    stats = RecordStats()
    start = time.monotonic()
    schedule = Schedule(start, 1 / hz)
    while True:
        slot = schedule.next_slot(time.monotonic())
        if slot.deadline - start >= seconds:
            break
        time.sleep(max(slot.deadline - time.monotonic(), 0))
        stats.requested += slot.missed + 1
        stats.late += schedule.is_late(slot.deadline, time.monotonic())
        floor_tick(qmp, mode)
        stats.ticks += 1
    stats.elapsed_s = time.monotonic() - start
    return stats
