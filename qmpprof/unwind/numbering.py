"""The unwinder's one register numbering, and each instruction set's DWARF numbers in it.

The unwinder, the CFI rules and DWARF expressions index one vector of registers. Its
first 17 numbers are x86-64's DWARF numbers (0 rax, 1 rdx, 2 rcx, 3 rbx, 4 rsi, 5 rdi,
6 rbp, 7 rsp, 8-15 r8-r15, 16 the pc): whatever the instruction set, 6 is the frame
pointer, 7 the stack pointer and 16 the pc, so the unwinder's loop reads the same
slots for every guest. CFI is renumbered once, when decoded:

- i386: 0 eax, 1 ecx, 2 edx, 3 ebx, 4 esp, 5 ebp, 6 esi, 7 edi, 8 eip (the return
  column) are RAX..RIP's low halves (a 32-bit vCPU's RegisterSet names them so);
- AArch64: x29 (the frame record's register) is 6, sp (31) is 7, the pc (32) is 16,
  x0-x28 are 17-45 and x30, the link register and the return column, is 46.

A number with no slot here (x86's vector and x87 registers, i386's eflags, AArch64's
SIMD registers...) is moved past every slot (`OTHER`): a rule for one never reaches a
frame's registers, and an expression that reads one is refused as for any register
unknown there.
"""

from __future__ import annotations

#: The slots every instruction set shares.
FRAME_POINTER = 6
STACK_POINTER = 7
PC = 16
#: AArch64's x0 (x1..x28 follow) and its link register.
AARCH64_X0 = 17
AARCH64_LR = 46
REGISTER_COUNT = 47
#: Where the numbers with no slot are moved.
OTHER = 0x10000

#: The internal number of each i386 DWARF register 0-8: eax ecx edx ebx esp ebp esi edi
#: eip -> rax 0, rcx 2, rdx 1, rbx 3, rsp 7, rbp 6, rsi 4, rdi 5, rip 16.
I386_REGISTERS = (0, 2, 1, 3, 7, 6, 4, 5, 16)

#: The internal number of each AArch64 DWARF register 0-32: x0..x28, x29, x30, sp, pc.
AARCH64_REGISTERS = (
    *range(AARCH64_X0, AARCH64_X0 + 29),
    FRAME_POINTER,
    AARCH64_LR,
    STACK_POINTER,
    PC,
)


def from_x86_64(number: int) -> int:
    """The internal number of x86-64 DWARF register `number`."""
    return number if 0 <= number <= PC else OTHER + number


def from_i386(number: int) -> int:
    """The internal number of i386 DWARF register `number`."""
    return I386_REGISTERS[number] if 0 <= number < len(I386_REGISTERS) else OTHER + number


def from_aarch64(number: int) -> int:
    """The internal number of AArch64 DWARF register `number`."""
    in_range = 0 <= number < len(AARCH64_REGISTERS)
    return AARCH64_REGISTERS[number] if in_range else OTHER + number
