"""Names for PLT stubs, which no symbol table names: `qsort@plt`, as GDB, objdump and
perf call them.

Each stub of `.plt`, `.plt.sec` and `.plt.got` jumps through a GOT slot (`jmp
*disp32(%rip)`, after an optional `endbr64` and `bnd` prefix); the relocation that
fills that slot names the function: its symbol (`realloc@plt`), or for an IRELATIVE
relocation with none, the resolver's address (`*ABS*+0x9be70@plt`, GDB's spelling).
The first `.plt` entry (PLT0, which jumps to the dynamic linker) names nothing.
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
_ENDBR64 = b"\xf3\x0f\x1e\xfa"
_BND = b"\xf2"
_JMP_RIP = b"\xff\x25"
_R_X86_64_IRELATIVE = 37


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
        return [
            symbol
            for section in stubs
            for symbol in _stubs(section.data(), section["sh_addr"], _entry_size(section), names)
        ]
    except ELF_PARSE_ERRORS:
        return []


def _entry_size(section: object) -> int:
    size = section["sh_entsize"]  # type: ignore[index]
    return size if size in (8, 16) else 16


def _stubs(data: bytes, address: int, size: int, names: dict[int, str]) -> list[Symbol]:
    found = []
    for offset in range(0, min(len(data), MAX_STUBS * size), size):
        slot = _jump_slot(data[offset : offset + size], address + offset)
        if slot is not None and slot in names:
            found.append(Symbol(names[slot], address + offset, size))
    return found


def _jump_slot(entry: bytes, address: int) -> int | None:
    """The GOT slot a stub jumps through, or None for anything else (PLT0, padding)."""
    at = 4 if entry.startswith(_ENDBR64) else 0
    at += 1 if entry[at : at + 1] == _BND else 0
    if entry[at : at + 2] != _JMP_RIP or len(entry) < at + 6:
        return None
    displacement = int(struct.unpack_from("<i", entry, at + 2)[0])
    return (address + at + 6 + displacement) & (1 << 64) - 1


def _slot_names(elf: ELFFile) -> dict[int, str]:
    """GOT slot address -> the stub's name, from the dynamic relocations."""
    names: dict[int, str] = {}
    count = 0
    for section in elf.iter_sections():
        if not isinstance(section, RelocationSection) or not section.is_RELA():
            continue
        if section["sh_type"] != "SHT_RELA" or not section["sh_flags"] & 0x2:  # SHF_ALLOC
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
    if relocation["r_info_type"] == _R_X86_64_IRELATIVE:  # type: ignore[index]
        return f"*ABS*+{relocation['r_addend']:#x}"  # type: ignore[index]
    return None
