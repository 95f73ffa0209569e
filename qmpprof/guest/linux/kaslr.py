"""Where a randomized (KASLR) Linux kernel runs: its slide, from the guest's IDT.

Every x86 interrupt gate holds the address of its handler. Linux points vector 0
(divide error) at `asm_exc_divide_error` (`divide_error` before 5.8), so that gate's
handler minus the symbol's address in the vmlinux is the slide of the kernel's text:
guest address = file address + slide. One 16-byte read (a long-mode gate; 8 bytes for
an i386 kernel's 32-bit gate, `word` 4), at the IDT base that `info registers` gives,
and no guessing. i386 moves the kernel by 16 MiB steps (CONFIG_PHYSICAL_ALIGN), its
virtual and physical addresses together.

The slide is then checked: `linux_banner` ("Linux version 6.1.0-… (…) #1 SMP …"), read
from the guest at its link address plus the slide, must be the vmlinux's own bytes. A
handler no slide explains, or a banner that differs, means --kernel is not the guest's
kernel: `mismatch_*` say so in one line.
"""

from __future__ import annotations

import struct
from pathlib import Path

from qmpprof.symbols.elf import SymbolTable
from qmpprof.symbols.elf_file import linked_bytes
from qmpprof.visible import visible

#: The handler of vector 0, by kernel version.
DIVIDE_ERROR_HANDLERS = ("asm_exc_divide_error", "divide_error")
GATE_SIZE = 16
#: An i386 (protected mode) gate: offset 15..0, selector, attributes, offset 31..16.
GATE_SIZE_32 = 8
#: KASLR moves the kernel's text by whole 2 MiB pages (CONFIG_PHYSICAL_ALIGN at least),
#: within the 1 GiB kernel image area: anything else is not a slide.
SLIDE_ALIGN = 0x20_0000
MAX_SLIDE = 1 << 30
_INTERRUPT_GATE = 0xE
#: The longest banner compared (Debian's 6.1 is 150 bytes) and shown in a message.
MAX_BANNER = 512
SHOWN_BANNER = 72


def gate_size(word: int) -> int:
    """The size of an IDT gate for a kernel whose pointers are `word` bytes."""
    return GATE_SIZE_32 if word == 4 else GATE_SIZE


def gate_handler(gate: bytes, word: int = 8) -> int | None:
    """The handler address of a 64-bit interrupt or trap gate (`word` 8), or of a 32-bit
    one (`word` 4: Intel SDM vol. 3, 6.11); None if `gate` is not a present one."""
    if len(gate) < gate_size(word):
        return None
    if word == 4:
        short: tuple[int, ...] = struct.unpack_from("<HHHH", gate)
        low, selector, attributes, middle = short
        high = 0
    else:
        fields: tuple[int, ...] = struct.unpack_from("<HHHHII", gate)
        low, selector, attributes, middle, high, _ = fields
    present, kind = attributes >> 15, (attributes >> 8) & 0xF
    if not present or kind not in (_INTERRUPT_GATE, _INTERRUPT_GATE + 1) or selector == 0:
        return None
    return low | middle << 16 | high << 32


def kernel_slide(divide_error_gate: bytes, symbols: SymbolTable, word: int = 8) -> int | None:
    """The kernel's slide from the gate of vector 0 (a `word`-byte kernel's: see
    gate_handler); None when the gate or the symbol table does not give one that KASLR
    could have made."""
    handler = gate_handler(divide_error_gate, word)
    linked = divide_error_symbol(symbols)
    if handler is None or linked is None:
        return None
    slide = handler - linked
    if slide % SLIDE_ALIGN or abs(slide) >= MAX_SLIDE:
        return None
    return slide


def divide_error_symbol(symbols: SymbolTable) -> int | None:
    """The link address of vector 0's handler in the kernel ELF, if it has one."""
    symbol = next(filter(None, map(symbols.find, DIVIDE_ERROR_HANDLERS)), None)
    return None if symbol is None else symbol.address


def linked_string(path: Path, address: int) -> bytes | None:
    """The NUL-terminated bytes the ELF at `path` holds at link address `address` (at
    most MAX_BANNER, NUL excluded); None when no section with contents holds it."""
    data = linked_bytes(path, address, MAX_BANNER)
    return None if data is None else data.split(b"\0", 1)[0]


def mismatch_no_slide(kernel: str, handler: int, symbols: SymbolTable) -> str:
    """Why no slide: the guest's vector 0 handler is no move of the ELF's."""
    linked = divide_error_symbol(symbols)
    if linked is None:
        return (
            f"--kernel {kernel} does not match the guest: it has no {DIVIDE_ERROR_HANDLERS[0]}, "
            f"the guest's divide-error handler (at {handler:#x})"
        )
    return (
        f"--kernel {kernel} does not match the guest: its {DIVIDE_ERROR_HANDLERS[0]} "
        f"({linked:#x}) is no KASLR slide away from the guest's divide-error handler "
        f"({handler:#x})"
    )


def mismatch_banner(kernel: str, expected: bytes, found: bytes, address: int) -> str | None:
    """None when the guest's bytes at `address` are the ELF's banner; else why not."""
    if found == expected:
        return None
    said = visible(found.split(b"\0", 1)[0][:SHOWN_BANNER].decode("utf-8", "replace").strip())
    own = visible(expected[:SHOWN_BANNER].decode("utf-8", "replace").strip())
    guest = f'"{said}"' if said else "nothing readable"
    return (
        f'--kernel {kernel} does not match the guest: its linux_banner is "{own}", '
        f"the guest has {guest} there ({address:#x})"
    )
