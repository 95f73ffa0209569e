"""The KASLR slide from an IDT gate, on a gate read from the Linux example guest.

The gate's 16 bytes were read with HMP `x /2gx` at the IDT base of Debian 12's 6.1 kernel
booted with KASLR; the expected handler is the gate decoded by hand from the layout in
Intel's SDM (vol. 3, 6.14.1), and the symbol address is nm's for that vmlinux."""

from __future__ import annotations

import struct

from qmpprof.guest.linux.kaslr import gate_handler, kernel_slide
from qmpprof.symbols.elf import Symbol, SymbolTable

#: `x /2gx 0xfffffe0000000000` on the guest: vector 0's gate.
GATE = struct.pack("<QQ", 0x99008E0000100990, 0x00000000FFFFFFFF)
HANDLER = 0xFFFF_FFFF_9900_0990  # offset 15..0 0990, 31..16 9900, 63..32 ffffffff
LINKED = 0xFFFF_FFFF_81C0_0990  # nm: asm_exc_divide_error in vmlinux-6.1.0-50-amd64


def table(name: str = "asm_exc_divide_error", address: int = LINKED) -> SymbolTable:
    return SymbolTable("vmlinux", [Symbol(name, address, 16)])


def test_the_gate_gives_its_handler() -> None:
    assert gate_handler(GATE) == HANDLER


def test_the_slide_is_the_handler_minus_the_linked_address() -> None:
    assert kernel_slide(GATE, table()) == HANDLER - LINKED == 0x1740_0000


def test_older_kernels_name_the_handler_divide_error() -> None:
    assert kernel_slide(GATE, table("divide_error")) == 0x1740_0000


def test_what_kaslr_cannot_have_made_is_no_slide() -> None:
    assert kernel_slide(GATE, table(address=LINKED + 0x1000)) is None  # not 2 MiB-aligned
    assert kernel_slide(GATE, table(address=HANDLER - (1 << 30))) is None  # beyond 1 GiB
    assert kernel_slide(GATE, table("something_else")) is None
    not_present = GATE[:5] + bytes([GATE[5] & 0x7F]) + GATE[6:]
    assert gate_handler(not_present) is None
    assert gate_handler(GATE[:8]) is None
    assert gate_handler(bytes(16)) is None
