"""i386 Linux's system-call entries before their pt_regs are whole, where the user's
registers are elsewhere: `int $0x80` (entry_INT80_32) and `sysenter` (entry_SYSENTER_32,
which the vDSO's __kernel_vsyscall makes, as glibc does).

`int $0x80` goes through an interrupt gate: the CPU pushes the user's SS, ESP, EFLAGS, CS
and EIP at the top of the CPU's entry stack (TSS.sp0: cpu_entry_area's, under page-table
isolation). entry_INT80_32 pushes the rest of pt_regs there, switches CR3, copies the
whole frame to the task's stack (SWITCH_TO_KERNEL_STACK, a `rep movsl`) and calls
do_int80_syscall_32. Until the copy ends, the pt_regs at the task's stack top are the
previous entry's: read there, a sample's user frames were another system call's (6.1:
every instruction before the copy's last word, stepped with GDB). Up to the call the
hardware frame still lies at sp0 - 20, and EBP and EBX are the user's (pushed, never
written).

`sysenter` saves nothing: __kernel_vsyscall pushed ECX, EDX and EBP and set EBP = ESP
before it, and the kernel returns (sysexit or iret) to the vDSO's int80_landing_pad.
entry_SYSENTER_32 pushes a pt_regs whose IP and SP are 0; do_SYSENTER_32 sets SP from
EBP, do_fast_syscall_32 sets IP to the landing pad (mm->context.vdso +
vdso_image_32.sym_int80_landing_pad) and EBP to the word at SP. Until then the user's
registers are those: SP the live EBP (or the saved one), IP the landing pad, EBP the word
the vDSO pushed. The vDSO's base is read from the task's saved auxiliary vector
(mm->saved_auxv's AT_SYSINFO_EHDR, the value the kernel put there from
mm->context.vdso): mm_context_t is an anonymous struct no layout can name.

Each window runs from the entry's symbol to the return address of its call of the C
handler, found in the vmlinux's code (a `call rel32` to the handler's symbol).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qmpprof.guest.adapter import KernelFacts, UserRegisters
from qmpprof.guest.dwarf_types import Member
from qmpprof.memory import MemoryReader, read_word
from qmpprof.model import RegisterSet
from qmpprof.symbols.elf_file import linked_bytes
from qmpprof.unwind.callsite import rel32_branches_to
from qmpprof.unwind.rules import RBP, REGISTER_COUNT, RIP, RSP

#: The entries, each with the C handler it calls once pt_regs are pushed.
INT80 = ("entry_INT80_32", "do_int80_syscall_32")
SYSENTER = ("entry_SYSENTER_32", "do_SYSENTER_32")
#: The per-CPU TSS (its x86_tss.sp0 is the entry stack's top) and the vDSO's image.
TSS = "cpu_tss_rw"
VDSO_IMAGE = "vdso_image_32"
DATA = frozenset({TSS, VDSO_IMAGE})
SYMBOLS = frozenset({*INT80, *SYSENTER, *DATA})
STRUCTS = frozenset({"tss_struct", "x86_hw_tss", "mm_struct", "vdso_image"})
MEMBERS = ("x86_tss", "sp0", "mm", "saved_auxv", "sym_int80_landing_pad")
#: The most code read after an entry's symbol for its call (6.1: +0xeb, +0x93).
MAX_ENTRY_BYTES = 0x400
#: The hardware's frame at the entry stack's top: EIP, CS, EFLAGS, ESP, SS.
HARDWARE_FRAME = 5 * 4
#: The auxiliary vector's key for the vDSO's base (include/uapi/linux/auxvec.h).
AT_SYSINFO_EHDR = 33
_MASK = 0xFFFF_FFFF
#: EBX's slot in the unwinder's numbering (x86-64's DWARF number).
RBX = 3

#: Reads the per-CPU variable at a symbol, for the vCPU of the registers.
PerCpuRead = Callable[[RegisterSet, int], int]
#: The running task's address (`current`), None where unknown.
CurrentTask = Callable[[], int | None]


@dataclass(frozen=True)
class Layout:
    """Where the kernel keeps what the entries' rules read (link addresses, offsets)."""

    entry_stack_top: int  # cpu_tss_rw.x86_tss.sp0
    task_mm: int
    saved_auxv: int
    auxv_size: int
    landing_pad_offset: int  # &vdso_image_32.sym_int80_landing_pad


@dataclass(frozen=True)
class SystemCallEntry32:
    """[start, end) of each entry, end its call's return address (link addresses)."""

    int80: range | None
    sysenter: range | None
    layout: Layout

    @classmethod
    def from_facts(
        cls, facts: KernelFacts, structs: Mapping[str, Mapping[str, Member]]
    ) -> SystemCallEntry32 | None:
        """The entries of an i386 kernel with the symbols and layouts; None elsewhere."""
        layout = _layout(facts, structs)
        if layout is None:
            return None
        int80, sysenter = (_window(facts, *entry) for entry in (INT80, SYSENTER))
        return cls(int80, sysenter, layout) if int80 or sysenter else None

    def user_registers(
        self,
        registers: RegisterSet,
        bias: int,
        memory: MemoryReader,
        per_cpu: PerCpuRead,
        task: CurrentTask,
    ) -> UserRegisters:
        """The user's registers when the vCPU is in either window (at `bias` from the
        link addresses); None elsewhere. Raises MemoryFault."""
        if registers.bits != 32 or registers.isa != "x86_64":
            return None
        pc = (registers.pc - bias) & _MASK
        if self.int80 is not None and pc in self.int80:
            return self._int80(registers, memory, per_cpu)
        if self.sysenter is not None and pc in self.sysenter:
            user_sp = registers.general.get("rbp")
            return None if user_sp is None else self._sysenter(user_sp, bias, memory, task)
        return None

    def completed(
        self, saved: UserRegisters, bias: int, memory: MemoryReader, task: CurrentTask
    ) -> UserRegisters:
        """`saved` (pt_regs at the task's stack top), with the IP and SP a sysenter's
        entry left 0 filled in as do_SYSENTER_32 and do_fast_syscall_32 will: a sample
        in them, before they did. Raises MemoryFault."""
        if saved is None or self.sysenter is None or saved[RIP] != 0:
            return saved
        user_sp = saved[RSP] or saved[RBP]
        return saved if not user_sp else self._sysenter(user_sp, bias, memory, task)

    def _int80(
        self, registers: RegisterSet, memory: MemoryReader, per_cpu: PerCpuRead
    ) -> UserRegisters:
        """The hardware frame's EIP and ESP, the live EBP and EBX; None if the frame is
        not from user mode (int $0x80 from the kernel: pt_regs say what happened)."""
        top = per_cpu(registers, self.layout.entry_stack_top)
        frame = memory.read((top - HARDWARE_FRAME) & _MASK, HARDWARE_FRAME)
        ip, cs, _, sp = (int.from_bytes(frame[at : at + 4], "little") for at in (0, 4, 8, 12))
        if cs & 3 != 3:
            return None
        user: list[int | None] = [None] * REGISTER_COUNT
        user[RIP], user[RSP] = ip, sp
        user[RBP], user[RBX] = registers.general.get("rbp"), registers.general.get("rbx")
        return user

    def _sysenter(
        self, user_sp: int, bias: int, memory: MemoryReader, task: CurrentTask
    ) -> UserRegisters:
        """The vDSO's landing pad, the user's stack and the EBP __kernel_vsyscall pushed
        there; None where the task has no vDSO to return to."""
        landing_pad = self._landing_pad(bias, memory, task)
        if landing_pad is None:
            return None
        user: list[int | None] = [None] * REGISTER_COUNT
        user[RIP], user[RSP] = landing_pad, user_sp
        user[RBP] = read_word(memory, user_sp, 4)
        return user

    def _landing_pad(self, bias: int, memory: MemoryReader, current: CurrentTask) -> int | None:
        task = current()
        if task is None:
            return None
        layout = self.layout
        mm = read_word(memory, task + layout.task_mm, 4)
        if not mm:
            return None
        auxv = memory.read((mm + layout.saved_auxv) & _MASK, layout.auxv_size)
        base = auxv_value(auxv, AT_SYSINFO_EHDR)
        if not base:
            return None
        offset = read_word(memory, layout.landing_pad_offset + bias, 4)
        return (base + offset) & _MASK


def auxv_value(auxv: bytes, key: int) -> int | None:
    """The value of `key` in a 32-bit auxiliary vector (key, value pairs up to AT_NULL)."""
    for at in range(0, len(auxv) - 7, 8):
        found = int.from_bytes(auxv[at : at + 4], "little")
        if found == 0:
            return None
        if found == key:
            return int.from_bytes(auxv[at + 4 : at + 8], "little")
    return None


def call_return(code: bytes, start: int, target: int) -> int | None:
    """The address after the first `call rel32` to `target` in `code` (which lies at
    `start`)."""
    return next(rel32_branches_to(code, start, target, 4), None)


def _window(facts: KernelFacts, entry: str, handler: str) -> range | None:
    symbols = facts.symbols
    if entry not in symbols or handler not in symbols:
        return None
    start = symbols[entry]
    code = linked_bytes(facts.path, start, MAX_ENTRY_BYTES) or b""
    end = call_return(code, start, symbols[handler])
    return None if end is None else range(start, end)


def _layout(facts: KernelFacts, structs: Mapping[str, Mapping[str, Member]]) -> Layout | None:
    if facts.word != 4 or not facts.symbols.keys() >= DATA:
        return None
    wanted = {
        "tss_struct": "x86_tss",
        "x86_hw_tss": "sp0",
        "task_struct": "mm",
        "mm_struct": "saved_auxv",
        "vdso_image": "sym_int80_landing_pad",
    }
    found = {s: structs.get(s, {}).get(m) for s, m in wanted.items()}
    members = [member for member in found.values() if member is not None]
    if len(members) != len(wanted):
        return None
    x86_tss, sp0, task_mm, auxv, pad = members
    return Layout(
        facts.symbols[TSS] + x86_tss.offset + sp0.offset,
        task_mm.offset,
        auxv.offset,
        auxv.size or 0,
        facts.symbols[VDSO_IMAGE] + pad.offset,
    )
