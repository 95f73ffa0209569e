"""Direct guest memory against a real QEMU: our page walk must give QEMU's own
translation (HMP `gva2gpa`), and the bytes we read must be the bytes QMP `memsave` and
`pmemsave` return, through an mmap of the RAM file and through /proc/PID/mem.

The parsers are also checked on `info mtree -f` / `info ramblock` saved from QEMU 7.2
(tests/unit/data), for layouts the example guest does not have (RAM above 4 GiB, KVM).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.errors import DirectMemoryUnavailable, MemoryFault
from qmpprof.model import RegisterSet
from qmpprof.target.direct import (
    DirectMemory,
    SegmentedMemory,
    _connect_for_pid,
    open_direct,
    qemu_pid,
)
from qmpprof.target.memory import MemsaveMemory, as_qmp_int64
from qmpprof.target.paging import PagingMode, PagingState
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.integration.conftest import Guest, running_guest, scratch_ram_file

SYMBOLS = ("kernel_main", "workload_progress", "cpu_current")
#: Addresses the example guest maps nowhere: the user half's top, and the kernel half
#: beyond its 1 GiB mapping at 0xffffffff80000000.
UNMAPPED = (0x0000_7FFF_FFFF_F000, 0xFFFF_FFFF_C000_0000)
_GPA = re.compile(r"gpa: 0x([0-9a-f]+)")


@pytest.fixture(params=["mmap", "proc"])
def booted(request: pytest.FixtureRequest, workdir: Path) -> Iterator[tuple[Guest, str | None]]:
    """The example guest with 2 vCPUs; for "mmap" its RAM in a file under /dev/shm."""
    extra = ["--accel", os.environ.get("ACCEL", "tcg"), "--smp", "2"]
    if request.param == "proc":
        with running_guest(workdir, *extra) as guest:
            yield guest, None
        return
    with (
        scratch_ram_file() as mem_path,
        running_guest(workdir, *extra, "--memory-backend", mem_path) as guest,
    ):
        yield guest, mem_path


async def test_direct_memory_agrees_with_qemu(
    booted: tuple[Guest, str | None], workdir: Path
) -> None:
    guest, mem_path = booted
    session = await QmpSession.connect(guest.qmp)
    try:
        assert qemu_pid(session) == guest.pid
        assert _connect_for_pid(guest.qmp) == guest.pid  # while QEMU serves our session
        direct = await open_direct(session, mem_path)
        await session.stop()
        try:
            await _check_paused_guest(session, direct, guest, workdir)
        finally:
            await session.cont()
            await direct.close()
        assert await session.is_running()
    finally:
        await session.close()
    assert guest.status() == "running"  # QEMU got over the connection that never spoke


async def _check_paused_guest(
    session: QmpSession, direct: DirectMemory, guest: Guest, workdir: Path
) -> None:
    registers = parse_all(await session.hmp("info registers -a"))
    direct.set_registers(registers)
    symbols = _symbols(guest.kernel)
    memsave = MemsaveMemory(session)
    try:
        mapped = [
            await _check_vcpu(session, direct, memsave, r, symbols, workdir) for r in registers
        ]
    finally:
        await memsave.close()
    assert max(mapped) == 2 + len(SYMBOLS)  # the kernel's vCPU: its stack and every symbol


async def _check_vcpu(
    session: QmpSession,
    direct: DirectMemory,
    memsave: MemsaveMemory,
    regs: RegisterSet,
    symbols: list[int],
    workdir: Path,
) -> int:
    """Checks one vCPU; returns how many of the addresses QEMU and we found mapped."""
    addresses = [regs.rsp, regs.rsp - 8, *symbols, *UNMAPPED]
    mapped = 0
    for address in addresses:
        physical = await _qemu_translation(session, regs.vcpu, address)
        if not _formable(regs, address):
            physical = None  # QEMU truncates or masks it; no such vCPU can form it: we fault
        assert _our_translation(direct, regs.vcpu, address) == physical, hex(address)
        ours = await direct.read_window(regs.vcpu, address, 64)
        assert ours == await memsave.read_window(regs.vcpu, address, 64), hex(address)
        if physical is not None and ours:
            mapped += 1
            assert direct.physical.read_physical(physical, 64) == ours
            read_word = getattr(direct.physical, "read_word", None)
            if read_word is not None:  # the RAM file's: how a walk reads a table entry
                assert read_word(physical, 8) == int.from_bytes(ours[:8], "little")
            assert await _pmemsave(session, physical, 64, workdir) == ours
    if regs.bits == 64:  # the capture step's stack window, across several pages
        window = (regs.vcpu, regs.rsp - 128, 16384 + 128)
        ours = await direct.read_window(*window)
        assert ours and ours == await memsave.read_window(*window)
    assert all([await direct.read_window(regs.vcpu, a, 64) == b"" for a in UNMAPPED])
    return mapped


async def _qemu_translation(session: QmpSession, cpu: int, address: int) -> int | None:
    text = await session.hmp(f"gva2gpa {address:#x}", cpu=cpu)
    match = _GPA.search(text)
    if match is None:
        assert "Unmapped" in text, text
        return None
    return int(match.group(1), 16)


def _formable(regs: RegisterSet, address: int) -> bool:
    """Whether the vCPU can form this linear address: outside long mode, not past 4 GiB."""
    long_mode = PagingState.from_registers(regs).mode in (PagingMode.LONG4, PagingMode.LONG5)
    return long_mode or address < 1 << 32


def _our_translation(direct: DirectMemory, cpu: int, address: int) -> int | None:
    try:
        return direct.reader(cpu).translate(address)
    except MemoryFault:
        return None


async def _pmemsave(session: QmpSession, address: int, size: int, workdir: Path) -> bytes:
    path = workdir / "pmemsave.bin"
    arguments = {"val": as_qmp_int64(address), "size": size, "filename": str(path)}
    await session.execute("pmemsave", arguments)
    return path.read_bytes()


def _symbols(kernel: Path) -> list[int]:
    listing = subprocess.run(["nm", str(kernel)], capture_output=True, text=True, check=True)
    found = {
        name: int(value, 16)
        for value, _, name in (line.split() for line in listing.stdout.splitlines())
        if name in SYMBOLS
    }
    assert sorted(found) == sorted(SYMBOLS)
    return [found[name] for name in SYMBOLS]


async def test_a_file_qemu_does_not_use_is_refused(guest: Guest) -> None:
    with scratch_ram_file() as other:
        Path(other).write_bytes(bytes(4096))
        session = await QmpSession.connect(guest.qmp)
        try:
            with pytest.raises(DirectMemoryUnavailable, match="no memory-backend-file"):
                await open_direct(session, other)
        finally:
            await session.close()


async def test_direct_memory_needs_the_ticks_registers() -> None:
    direct = DirectMemory(SegmentedMemory([]))
    with pytest.raises(LookupError, match="vCPU 0"):
        await direct.read_window(0, 0x1000, 64)
    regs = RegisterSet(0, {"rip": 0, "rsp": 0, "rbp": 0}, 0, 0, False, 16)
    direct.set_registers([regs])
    assert await direct.read_window(0, 0x1000, 64) == b""  # no RAM at all: nothing readable
