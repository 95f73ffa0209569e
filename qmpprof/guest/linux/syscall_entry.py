"""x86-64 Linux's system-call entry before its pt_regs are whole: the user's registers
are still live there.

`syscall` leaves the user's return address in RCX (and RFLAGS in R11) and touches no
stack. entry_SYSCALL_64 then swaps GS, sets the user's RSP aside in the per-CPU TSS
(`cpu_tss_rw.x86_tss.sp2`), loads the task's kernel stack and pushes the hardware
frame (SS, RSP, RFLAGS, CS, RIP) slot by slot; from `entry_SYSCALL_64_after_hwframe` on
the rest of pt_regs follows. Until that label the pt_regs at the top of the task's
stack are the previous entry's: read there, a sample's user frames were another system
call's (6.1, 5.10: five instructions, 0x29 to 0x37, checked by stepping GDB through
them, tests/integration/test_linux_gdb_agreement.py). There the user's registers are
the vCPU's own: RIP in RCX, RSP in the vCPU's RSP until the stack switch and in sp2
after it, every register a call preserves untouched so far.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qmpprof.guest.adapter import KernelFacts, UserRegisters
from qmpprof.guest.dwarf_types import Member
from qmpprof.model import KERNEL_HALF, RegisterSet
from qmpprof.unwind.rules import RIP, RSP
from qmpprof.unwind.unwinder import dwarf_registers

#: The entry's symbols: its first instruction, and where its hardware frame is whole.
ENTRY = "entry_SYSCALL_64"
AFTER_HARDWARE_FRAME = "entry_SYSCALL_64_after_hwframe"
#: The per-CPU task-state segment, and the members that lead to its sp2.
TSS = "cpu_tss_rw"
TSS_STRUCTS = frozenset({"tss_struct", "x86_hw_tss"})
TSS_MEMBERS = ("x86_tss", "sp1", "sp2")
#: The longest hardware-frame prologue believed (6.1's is 0x38 bytes, 6.12's with
#: ENDBR 0x3c): symbols further apart are not these.
MAX_PROLOGUE = 0x100

#: Reads the 64-bit per-CPU variable at an offset, for the vCPU of the registers.
PerCpuRead = Callable[[RegisterSet, int], int]


def tss_member(
    facts: KernelFacts, structs: Mapping[str, Mapping[str, Member]], member: str
) -> int | None:
    """The per-CPU offset of `member` (sp1, sp2) of an x86-64 kernel's TSS,
    `cpu_tss_rw.x86_tss.member`, where it has the symbol and the layouts (TSS_STRUCTS)."""
    tss, hardware = structs.get("tss_struct", {}), structs.get("x86_hw_tss", {})
    if facts.word != 8 or TSS not in facts.symbols or "x86_tss" not in tss:
        return None
    found = hardware.get(member)
    return None if found is None else facts.symbols[TSS] + tss["x86_tss"].offset + found.offset


@dataclass(frozen=True)
class SystemCallEntry:
    """[start, end): entry_SYSCALL_64 up to its after_hwframe label (link addresses);
    `user_stack`: the per-CPU offset of the TSS's sp2, where it sets the user's RSP aside."""

    start: int
    end: int
    user_stack: int

    @classmethod
    def from_facts(
        cls, facts: KernelFacts, structs: Mapping[str, Mapping[str, Member]]
    ) -> SystemCallEntry | None:
        """The entry, where an x86-64 kernel has the three symbols and the TSS's layout."""
        symbols, sp2 = facts.symbols, tss_member(facts, structs, "sp2")
        if sp2 is None or not {ENTRY, AFTER_HARDWARE_FRAME} <= symbols.keys():
            return None
        start, end = symbols[ENTRY], symbols[AFTER_HARDWARE_FRAME]
        return cls(start, end, sp2) if 0 < end - start <= MAX_PROLOGUE else None

    def user_registers(
        self, registers: RegisterSet, bias: int, per_cpu: PerCpuRead
    ) -> UserRegisters:
        """The user's registers, live, when the vCPU is in the entry's hardware-frame
        prologue (at `bias` from the link addresses); None elsewhere. Raises MemoryFault."""
        pc = registers.pc - bias
        if not self.start <= pc < self.end or registers.isa != "x86_64":
            return None
        user = dwarf_registers(registers)
        user[RIP] = registers.general.get("rcx")
        sp = registers.sp
        user[RSP] = sp if sp < KERNEL_HALF else per_cpu(registers, self.user_stack)
        return user
