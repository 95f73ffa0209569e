"""Names for PLT stubs, which no symbol table names: `qsort@plt`, as GDB, objdump and
perf call them.

Each stub of `.plt`, `.plt.sec` and `.plt.got` jumps through a GOT slot (`jmp
*disp32(%rip)`, after an optional `endbr64` and `bnd` prefix; i386: `jmp *abs32` in an
executable, `jmp *disp32(%ebx)` from `.got.plt` in position-independent code, after an
optional `endbr32`); the relocation that fills that slot names the function: its symbol
(`realloc@plt`), or for an x86-64 IRELATIVE relocation with none, the resolver's address
(`*ABS*+0x9be70@plt`, GDB's spelling). The first `.plt` entry (PLT0, which jumps to the
dynamic linker) names nothing.
"""

from __future__ import annotations

import struct

from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from qmpprof.symbols.elf import Symbol
from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS

PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")
#: More stubs than any real file has (libc has 54): a bound on hostile sizes.
MAX_STUBS = 65536
#: More relocations than any real file's .rela.plt and .rela.dyn hold together.
MAX_RELOCATIONS = 1 << 20
_ENDBR = (b"\xf3\x0f\x1e\xfa", b"\xf3\x0f\x1e\xfb")  # endbr64, endbr32
_BND = b"\xf2"
_JMP_RIP = b"\xff\x25"  # i386: jmp *abs32
_JMP_EBX = b"\xff\xa3"  # i386 only: jmp *disp32(%ebx), %ebx = .got.plt
_R_X86_64_IRELATIVE = 37
#: x86-64's relocations carry addends; i386's do not.
_RELOCATIONS = ("SHT_RELA", "SHT_REL")


def plt_symbols(elf: ELFFile) -> list[Symbol]:
    """A symbol for each PLT stub of an ELF opened by `open_elf` whose GOT slot a
    relocation fills; none for a file whose relocations cannot be read (its other
    symbols do not depend on them)."""
    sections = [elf.get_section_by_name(name) for name in PLT_SECTIONS]
    stubs = [s for s in sections if s is not None and s["sh_type"] == "SHT_PROGBITS"]
    if not stubs:
        return []
    try:
        names = _slot_names(elf)
        jumps = _Jumps(elf.elfclass == 32, _got_plt(elf))
        return [
            symbol
            for section in stubs
            for symbol in _stubs(section, _entry_size(section), names, jumps)
        ]
    except ELF_PARSE_ERRORS:
        return []


class _Jumps:
    """How a file's stubs name their GOT slot: x86-64's RIP-relative jump, or i386's
    absolute one and the one relative to `.got.plt` (`got`)."""

    def __init__(self, i386: bool, got: int | None) -> None:
        self.i386 = i386
        self.got = got

    def slot(self, entry: bytes, address: int) -> int | None:
        """The GOT slot a stub jumps through, or None for anything else (PLT0, padding)."""
        at = 4 if entry[:4] in _ENDBR else 0
        at += 1 if entry[at : at + 1] == _BND else 0
        opcode, operand = entry[at : at + 2], entry[at + 2 : at + 6]
        if len(operand) < 4:
            return None
        if opcode == _JMP_RIP and not self.i386:
            displacement = int(struct.unpack("<i", operand)[0])
            return (address + at + 6 + displacement) & (1 << 64) - 1
        if opcode == _JMP_RIP:
            return int(struct.unpack("<I", operand)[0])
        if opcode == _JMP_EBX and self.i386 and self.got is not None:
            return (self.got + int(struct.unpack("<i", operand)[0])) & (1 << 32) - 1
        return None


def _got_plt(elf: ELFFile) -> int | None:
    section = elf.get_section_by_name(".got.plt")
    return int(section["sh_addr"]) if section is not None else None


def _entry_size(section: object) -> int:
    size = section["sh_entsize"]  # type: ignore[index]
    return size if size in (8, 16) else 16


def _stubs(section: object, size: int, names: dict[int, str], jumps: _Jumps) -> list[Symbol]:
    data, address = section.data(), section["sh_addr"]  # type: ignore[attr-defined,index]
    found = []
    for offset in range(0, min(len(data), MAX_STUBS * size), size):
        slot = jumps.slot(data[offset : offset + size], address + offset)
        if slot is not None and slot in names:
            found.append(Symbol(names[slot], address + offset, size))
    return found


def _slot_names(elf: ELFFile) -> dict[int, str]:
    """GOT slot address -> the stub's name, from the dynamic relocations."""
    names: dict[int, str] = {}
    count = 0
    for section in elf.iter_sections():
        if not isinstance(section, RelocationSection):
            continue
        if section["sh_type"] not in _RELOCATIONS or not section["sh_flags"] & 0x2:  # SHF_ALLOC
            continue
        symbols = elf.get_section(section["sh_link"]) if section["sh_link"] else None
        for relocation in section.iter_relocations():
            count += 1
            if count > MAX_RELOCATIONS:
                return names
            name = _relocation_name(relocation, symbols)
            if name:
                names.setdefault(relocation["r_offset"], f"{name}@plt")
    return names


def _relocation_name(relocation: object, symbols: object) -> str | None:
    index = relocation["r_info_sym"]  # type: ignore[index]
    if index and symbols is not None and hasattr(symbols, "get_symbol"):
        name = symbols.get_symbol(index).name
        return str(name).split("@", 1)[0] or None
    if relocation["r_info_type"] == _R_X86_64_IRELATIVE and relocation.is_RELA():  # type: ignore[index,attr-defined]
        return f"*ABS*+{relocation['r_addend']:#x}"  # type: ignore[index]
    return None
