"""Where the guest runs its kernel, found once per connection (guest/kaslr.py)."""

from __future__ import annotations

import re

from qmpprof.analysis import Analyzer
from qmpprof.guest.kaslr import GATE_SIZE, kernel_slide
from qmpprof.record.capture import REGISTERS
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all

#: `info registers` gives each vCPU's IDT as "IDT=     <base> <limit>".
_IDT = re.compile(r"^IDT=\s*([0-9a-f]{1,16}) ", re.MULTILINE)


async def kernel_slide_of(
    session: QmpSession, memory: MemoryBackend, analyzer: Analyzer
) -> int | None:
    """The slide of a Linux guest's kernel (KASLR), read from the divide-error gate of
    the IDT of a vCPU in 64-bit mode; None when the kernel is not Linux or no vCPU
    gives one (a guest still booting)."""
    if analyzer.kernel is None or analyzer.adapter.name != "linux":
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
            return kernel_slide(gate, analyzer.kernel.symbols)
    return None
