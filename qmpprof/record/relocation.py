"""Where the guest runs its kernel, found once per connection and checked (guest/linux/kaslr.py)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from qmpprof.analysis import Analyzer
from qmpprof.errors import BadGuestKernel, KernelMismatch
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.from_memory import linear_bases
from qmpprof.guest.linux.kaslr import (
    gate_handler,
    gate_size,
    kernel_slide,
    linked_string,
    mismatch_banner,
    mismatch_no_slide,
)
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, RegisterSet
from qmpprof.modules import Module
from qmpprof.record.capture import REGISTERS
from qmpprof.record.guest_kernel import guest_vmcoreinfo
from qmpprof.target.direct import DirectMemory
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.pause import paused
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from qmpprof.unwind.orc_mends import filler_spans, mend_return_buffer_fills

#: `info registers` gives each vCPU's IDT as "IDT=     <base> <limit>".
_IDT = re.compile(r"^IDT=\s*([0-9a-f]{1,16}) ", re.MULTILINE)


#: Pauses spent looking for a vCPU in kernel mode through QEMU's monitor (kernel_slide_of).
PLACEMENT_PAUSES = 50


class _Unmapped(enum.Enum):
    """No vCPU could read the kernel: each ran on page tables that do not map it."""

    TOKEN = 0


_UNMAPPED = _Unmapped.TOKEN


@dataclass(frozen=True)
class KernelPlacement:
    """Where a Linux guest runs its kernel, and a vCPU in the kernel's mode (64-bit, or
    32-bit for an i386 kernel) that read it (whose page tables map the kernel's half)."""

    slide: int
    vcpu: int


async def kernel_slide_of(
    session: QmpSession, memory: MemoryBackend, analyzer: Analyzer
) -> KernelPlacement | None:
    """The slide of a Linux guest's kernel (KASLR), read from the divide-error gate of
    the IDT of a vCPU in the kernel's mode (64-bit; 32-bit for an ELF32 kernel) and
    checked against the guest's `linux_banner`;
    None when the kernel is not Linux or no vCPU gives one (a guest still booting).
    Raises KernelMismatch when the guest's kernel is not the --kernel ELF.

    Through QEMU's monitor a read translates with the vCPU's page tables at the time
    of the read: the guest is held paused for it (unless someone else holds it), and,
    while every vCPU runs user code on tables that do not map the kernel (page table
    isolation), paused again, a few times at most, until one is in the kernel's.
    Through this host's memory (direct) the kernel's own tables are walked instead."""
    kernel, adapter = analyzer.kernel, analyzer.adapter
    if kernel is None or not isinstance(adapter, LinuxAdapter):
        return None
    if isinstance(memory, DirectMemory) and memory.aarch64_roots is not None:
        return await _arm64_placement(session, memory, kernel, adapter)
    if not memory.through_monitor:
        placed = await _placement(session, memory, kernel, adapter)
        return None if placed is _UNMAPPED else placed
    for _ in range(PLACEMENT_PAUSES):
        async with paused(session) as ours:
            placed = await _placement(session, memory, kernel, adapter)
        if placed is not _UNMAPPED:
            return placed
        if not ours:
            break  # held paused by someone else: the vCPUs stay where they are
    raise KernelMismatch(
        f"cannot check --kernel {kernel.path} against the guest: in up to {PLACEMENT_PAUSES} "
        "pauses no vCPU ran on page tables that map the kernel (page table isolation, and every "
        "vCPU in user code); --memory direct reads it through the kernel's own tables"
    )


async def _placement(
    session: QmpSession, memory: MemoryBackend, kernel: Module, adapter: LinuxAdapter
) -> KernelPlacement | _Unmapped | None:
    text = await session.hmp(REGISTERS)
    registers = parse_all(text)
    bases = [int(base, 16) for base in _IDT.findall(text)]
    if len(bases) != len(registers):
        return None
    memory.set_registers(registers)
    # A vCPU in kernel mode first: with page table isolation, one running user code maps
    # little of the kernel.
    pairs = sorted(zip(registers, bases, strict=True), key=lambda pair: pair[0].cpl != 0)
    unmapped = False
    for regs, base in pairs:
        if regs.bits != 8 * kernel.word:
            continue  # firmware, boot code, or a 32-bit program under a 64-bit kernel
        gate = await memory.read_window(regs.vcpu, base, gate_size(kernel.word))
        handler = gate_handler(gate, kernel.word)
        if handler is None:
            return None
        slide = kernel_slide(gate, kernel.symbols, kernel.word)
        if slide is None:
            raise KernelMismatch(mismatch_no_slide(str(kernel.path), handler, kernel.symbols))
        if await _check_banner(memory, regs, kernel, adapter.banner, slide):
            await _mend_from_running_code(memory, regs.vcpu, kernel, slide)
            return KernelPlacement(slide, regs.vcpu)
        unmapped = True
    return _UNMAPPED if unmapped else None


async def _arm64_placement(
    session: QmpSession, memory: DirectMemory, kernel: Module, adapter: LinuxAdapter
) -> KernelPlacement | None:
    """An arm64 kernel has no IDT: its slide is its VMCOREINFO's (KERNELOFFSET), checked
    against the ELF's linux_banner where it has one (a kernel read from memory has
    none: its kallsyms' _stext was checked against VMCOREINFO's already). Raises
    KernelMismatch."""
    try:
        info = guest_vmcoreinfo(session, memory)
    except BadGuestKernel:
        return None
    slide = info.kernel_offset
    if adapter.linear_bases is None:  # a vmlinux's adapter: the page cache's bases
        adapter.linear_bases = linear_bases(info)
    registers = parse_all(await session.hmp(REGISTERS))
    if not registers:
        return None
    memory.set_registers(registers)
    await _check_banner(memory, registers[0], kernel, adapter.banner, slide)
    return KernelPlacement(slide, registers[0].vcpu)


async def _mend_from_running_code(
    memory: MemoryBackend, vcpu: int, kernel: Module, slide: int
) -> None:
    """Mend the kernel's ORC where the code it runs is not the file's (unwind/orc_mends.py:
    the return stack buffer fills the kernel patched in at boot), reading that code from
    the guest through `vcpu`, which maps the kernel."""
    if kernel.orc is None:
        return
    windows = []
    for address, size in filler_spans(kernel.symbols):
        running = (address + slide) % (1 << 8 * kernel.word)
        windows.append(MemoryWindow(address, await memory.read_window(vcpu, running, size)))
    mend_return_buffer_fills(kernel.orc, kernel.symbols, WindowMemory(windows))


async def _check_banner(
    memory: MemoryBackend, regs: RegisterSet, kernel: Module, banner: int | None, slide: int
) -> bool:
    """Raise KernelMismatch unless the guest's linux_banner, moved by `slide`, is the
    ELF's; False, without a verdict, when the vCPU could read none of it through QEMU's
    monitor (its page tables do not map the kernel: user code, or entry code before it
    switches tables, under page table isolation). A kernel ELF without the
    symbol or its bytes is not checked."""
    expected = linked_string(kernel.path, banner) if banner is not None else None
    if banner is None or not expected:
        return True
    address = (banner + slide) % (1 << 8 * kernel.word)
    found = await memory.read_window(regs.vcpu, address, len(expected))
    if not found and memory.through_monitor:
        return False
    problem = mismatch_banner(str(kernel.path), expected, found, address)
    if problem is not None:
        raise KernelMismatch(problem)
    return True
