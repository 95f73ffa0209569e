"""i386 DWARF register numbers in the unwinder's own numbering (x86-64's, rules.py).

i386 CFI names 0 eax, 1 ecx, 2 edx, 3 ebx, 4 esp, 5 ebp, 6 esi, 7 edi, 8 eip (the
return column), 9 eflags, then x87, SSE, MMX and segment registers. A 32-bit vCPU's
EAX..EIP are the same registers as RAX..RIP's low halves (a RegisterSet names them
so), so i386 CFI is renumbered once, when decoded, and the unwinder knows one numbering.
"""

from __future__ import annotations

#: The internal number of each i386 DWARF register 0-8: eax ecx edx ebx esp ebp esi edi
#: eip -> rax 0, rcx 2, rdx 1, rbx 3, rsp 7, rbp 6, rsi 4, rdi 5, rip 16.
I386_REGISTERS = (0, 2, 1, 3, 7, 6, 4, 5, 16)
#: Where the other i386 registers (eflags, x87, SSE, segments...) are numbered: past
#: every internal number, so a rule for one never reaches a frame's registers, and an
#: expression that reads one is refused as for any register unknown there.
I386_OTHER = 0x10000


def from_i386(number: int) -> int:
    """The internal number of i386 DWARF register `number`."""
    return I386_REGISTERS[number] if 0 <= number < len(I386_REGISTERS) else I386_OTHER + number
