"""Which instruction set an ELF file's code is, and each by its name (RegisterSet.isa)."""

from __future__ import annotations

from qmpprof.isa.aarch64 import AARCH64
from qmpprof.isa.base import Isa
from qmpprof.isa.x86 import I386, X86_64

ISAS: dict[str, Isa] = {isa.name: isa for isa in (X86_64, I386, AARCH64)}

#: ELF e_machine values (pyelftools' names) and the ISA of their code, by ELF class.
_BY_MACHINE = {("EM_386", 32): I386, ("EM_AARCH64", 64): AARCH64}


def isa_of_elf(machine: str, elf_class: int) -> Isa:
    """The ISA of an ELF file's code: i386 for ELF32 EM_386, AArch64 for EM_AARCH64,
    else x86-64's (an x32 file's code has 64-bit registers too)."""
    return _BY_MACHINE.get((machine, elf_class), X86_64)
