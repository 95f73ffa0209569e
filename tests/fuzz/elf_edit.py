"""Byte-level edits of real ELF files (built by gcc): where a header field lives, and
a copy of the file with it changed. The unit and fuzz tests damage files with these."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

#: Offsets of the ELF64 header fields and section header fields the tests change.
E_MACHINE = 18
E_SHOFF = 40
SHDR_FIELDS = {
    "sh_name": (0, "<I"),
    "sh_type": (4, "<I"),
    "sh_flags": (8, "<Q"),
    "sh_offset": (24, "<Q"),
    "sh_size": (32, "<Q"),
    "sh_link": (40, "<I"),
    "sh_entsize": (56, "<Q"),
}
SHT_NOBITS = 8
EM_AARCH64 = 183
EM_RISCV = 243


@dataclass(frozen=True)
class SectionSpan:
    """One section of a file: its name, where its header is, where its bytes are."""

    name: str
    header: int
    offset: int
    size: int


def sections(data: bytes) -> list[SectionSpan]:
    """Every section of the ELF64 file `data`, in section-table order."""
    elf = ELFFile(io.BytesIO(data))
    base, entry = elf["e_shoff"], elf["e_shentsize"]
    return [
        SectionSpan(s.name, base + i * entry, s["sh_offset"], s["sh_size"])
        for i, s in enumerate(elf.iter_sections())
    ]


def section(data: bytes, name: str) -> SectionSpan:
    return next(s for s in sections(data) if s.name == name)


def with_field(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    """`data` with the integer at `offset` (struct format `fmt`) set to `value`."""
    edited = bytearray(data)
    struct.pack_into(fmt, edited, offset, value)
    return bytes(edited)


def with_section_field(data: bytes, name: str, field: str, value: int) -> bytes:
    """`data` with one field of section `name`'s header set to `value`."""
    where, fmt = SHDR_FIELDS[field]
    return with_field(data, section(data, name).header + where, fmt, value)
