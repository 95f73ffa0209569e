"""The KASLR slide from an IDT gate, on a gate read from the Linux example guest.

The gate's 16 bytes were read with HMP `x /2gx` at the IDT base of Debian 12's 6.1 kernel
booted with KASLR; the expected handler is the gate decoded by hand from the layout in
Intel's SDM (vol. 3, 6.14.1), and the symbol address is nm's for that vmlinux."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from qmpprof.guest.linux.kaslr import gate_handler, gate_size, kernel_slide
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


#: The i386 guest (examples/linux/i386, Debian 12's 6.1.0-50-686-pae, KASLR on): vector
#: 0's 8-byte gate as `x /2wx` printed it at the IDT base `info registers` gave
#: (tests/unit/data/linux/i386/record_tasks.py captured it, tasks.json's idt_gate_0), and
#: where the guest's /proc/kallsyms put the handler (its init printed it). Decoded by
#: hand (Intel SDM vol. 3, 6.11): offset 15..0 0x1cc0, selector 0x60 (__KERNEL_CS),
#: attributes 0x8e00 (present, DPL 0, 32-bit interrupt gate), offset 31..16 0xd993.
I386 = json.loads((Path(__file__).parent / "data/linux/i386/tasks.json").read_text())
I386_GATE = struct.pack("<II", *(int(w, 16) for w in I386["idt_gate_0"].split()[1:]))
I386_HANDLER = int(I386["kallsyms_divide_error"], 16)
I386_LINKED = int(I386["nm"]["asm_exc_divide_error"], 16)  # nm, vmlinux-6.1.0-50-686-pae


def test_an_i386_gate_gives_its_handler() -> None:
    assert I386_HANDLER == 0xD993_1CC0
    assert gate_handler(I386_GATE, word=4) == I386_HANDLER
    assert gate_size(4) == len(I386_GATE) == 8 and gate_size(8) == 16
    assert gate_handler(I386_GATE) is None  # 8 bytes are no long-mode gate


def test_the_i386_slide_is_the_handler_minus_the_linked_address() -> None:
    i386 = table(address=I386_LINKED)
    assert kernel_slide(I386_GATE, i386, word=4) == I386_HANDLER - I386_LINKED == 0x1800_0000
    assert kernel_slide(I386_GATE, table(address=I386_LINKED + 0x1000), word=4) is None
    not_present = I386_GATE[:5] + bytes([I386_GATE[5] & 0x7F]) + I386_GATE[6:]
    assert gate_handler(not_present, word=4) is None
    assert gate_handler(I386_GATE[:4], word=4) is None
