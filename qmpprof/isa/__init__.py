"""Everything an instruction set decides, one module per ISA beside the others.

`Isa` (base.py) is what the unwinder and the CFI decoder ask: the DWARF register
numbers, the registers a call preserves, the frame-pointer convention, whether a call
returns through a register, how a signed return address is stripped. x86.py holds
x86-64 and i386 (one register file, two words), aarch64.py AArch64, with the parser of
QEMU's register dump for it; registry.py finds the one a file or a vCPU uses. Adding
an instruction set is one more module here.
"""
