"""Where the guest runs its kernel, found once per connection and checked (guest/kaslr.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qmpprof.analysis import Analyzer
from qmpprof.errors import KernelMismatch
from qmpprof.guest.kaslr import (
    GATE_SIZE,
    gate_handler,
    kernel_slide,
    linked_string,
    mismatch_banner,
    mismatch_no_slide,
)
from qmpprof.guest.linux import LinuxAdapter
from qmpprof.model import RegisterSet
from qmpprof.modules import Module
from qmpprof.record.capture import REGISTERS
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all

#: `info registers` gives each vCPU's IDT as "IDT=     <base> <limit>".
_IDT = re.compile(r"^IDT=\s*([0-9a-f]{1,16}) ", re.MULTILINE)


@dataclass(frozen=True)
class KernelPlacement:
    """Where a Linux guest runs its kernel, and a vCPU in 64-bit mode that read it (whose
    page tables map the kernel's half)."""

    slide: int
    vcpu: int


async def kernel_slide_of(
    session: QmpSession, memory: MemoryBackend, analyzer: Analyzer
) -> KernelPlacement | None:
    """The slide of a Linux guest's kernel (KASLR), read from the divide-error gate of
    the IDT of a vCPU in 64-bit mode and checked against the guest's `linux_banner`;
    None when the kernel is not Linux or no vCPU gives one (a guest still booting).
    Raises KernelMismatch when the guest's kernel is not the --kernel ELF."""
    kernel, adapter = analyzer.kernel, analyzer.adapter
    if kernel is None or not isinstance(adapter, LinuxAdapter):
        return None
    text = await session.hmp(REGISTERS)
    registers = parse_all(text)
    bases = [int(base, 16) for base in _IDT.findall(text)]
    if len(bases) != len(registers):
        return None
    memory.set_registers(registers)
    for regs, base in zip(registers, bases, strict=True):
        if regs.bits == 64:
            gate = await memory.read_window(regs.vcpu, base, GATE_SIZE)
            handler = gate_handler(gate)
            if handler is None:
                return None
            slide = kernel_slide(gate, kernel.symbols)
            if slide is None:
                raise KernelMismatch(mismatch_no_slide(str(kernel.path), handler, kernel.symbols))
            await _check_banner(memory, regs, kernel, adapter.banner, slide)
            return KernelPlacement(slide, regs.vcpu)
    return None


async def _check_banner(
    memory: MemoryBackend, regs: RegisterSet, kernel: Module, banner: int | None, slide: int
) -> None:
    """Raise KernelMismatch unless the guest's linux_banner, moved by `slide`, is the
    ELF's. A kernel ELF without the symbol or its bytes is not checked."""
    expected = linked_string(kernel.path, banner) if banner is not None else None
    if banner is None or not expected:
        return
    address = (banner + slide) % (1 << 64)
    found = await memory.read_window(regs.vcpu, address, len(expected))
    problem = mismatch_banner(str(kernel.path), expected, found, address)
    if problem is not None:
        raise KernelMismatch(problem)
