"""Where a randomized (KASLR) Linux kernel runs: its slide, from the guest's IDT.

Every x86-64 interrupt gate holds the address of its handler. Linux points vector 0
(divide error) at `asm_exc_divide_error` (`divide_error` before 5.8), so that gate's
handler minus the symbol's address in the vmlinux is the slide of the kernel's text:
guest address = file address + slide. One 16-byte read, at the IDT base that `info
registers` gives, and no guessing.
"""

from __future__ import annotations

import struct

from qmpprof.symbols.elf import SymbolTable

#: The handler of vector 0, by kernel version.
DIVIDE_ERROR_HANDLERS = ("asm_exc_divide_error", "divide_error")
GATE_SIZE = 16
#: KASLR moves the kernel's text by whole 2 MiB pages (CONFIG_PHYSICAL_ALIGN at least),
#: within the 1 GiB kernel image area: anything else is not a slide.
SLIDE_ALIGN = 0x20_0000
MAX_SLIDE = 1 << 30
_INTERRUPT_GATE = 0xE


def gate_handler(gate: bytes) -> int | None:
    """The handler address of a 64-bit interrupt or trap gate; None if `gate` is not a
    present one."""
    if len(gate) < GATE_SIZE:
        return None
    fields: tuple[int, ...] = struct.unpack_from("<HHHHII", gate)
    low, selector, attributes, middle, high, _ = fields
    present, kind = attributes >> 15, (attributes >> 8) & 0xF
    if not present or kind not in (_INTERRUPT_GATE, _INTERRUPT_GATE + 1) or selector == 0:
        return None
    return low | middle << 16 | high << 32


def kernel_slide(divide_error_gate: bytes, symbols: SymbolTable) -> int | None:
    """The kernel's slide from the gate of vector 0; None when the gate or the symbol
    table does not give one that KASLR could have made."""
    handler = gate_handler(divide_error_gate)
    symbol = next(filter(None, map(symbols.find, DIVIDE_ERROR_HANDLERS)), None)
    if handler is None or symbol is None:
        return None
    slide = handler - symbol.address
    if slide % SLIDE_ALIGN or abs(slide) >= MAX_SLIDE:
        return None
    return slide
