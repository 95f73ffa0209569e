"""Opening an ELF file we did not build: checked before pyelftools reads it.

pyelftools trusts the file it reads: a section size of 2**50 is a read (or, for
SHT_NOBITS, a string of zeros) of 2**50 bytes, a symbol entry size of 0 a division by
zero, an offset past 2**63 an OverflowError from seek(). `open_elf` checks the header
and the section table against the file's size and architecture first, so that every
later read through pyelftools stays inside the file; what pyelftools still raises on
bad bytes inside the `with` block becomes BadElf, one line for the user.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elftools.common.exceptions import DWARFError, ELFError
from elftools.construct.core import ConstructError
from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.visible import visible

#: e_machine values qmpprof unwinds (a 32-bit ELF may carry x86-64 code, as multiboot
#: kernels do, so the class is not checked; qmpprof/isa/registry.py says which is which).
MACHINES = ("EM_X86_64", "EM_386", "EM_AARCH64")

#: What pyelftools raises on malformed bytes (seen by fuzzing it: its own errors,
#: construct's, struct's, asserts on DWARF it does not expect, seek() past 2**63,
#: divisions by a zero it read, attributes of DIEs a damaged tree lacks, unsupported
#: forms, unknown abbreviation codes and indexes, DIE trees nested deeper than Python
#: recurses, a stream that ends early).
ELF_PARSE_ERRORS: tuple[type[Exception], ...] = (
    ELFError,
    DWARFError,
    ConstructError,
    struct.error,
    ValueError,
    ArithmeticError,
    KeyError,
    IndexError,
    AttributeError,
    TypeError,
    AssertionError,
    NotImplementedError,
    RecursionError,
    EOFError,
)

#: Inside an open file, OSError too: lseek() refuses some bogus offsets (EINVAL).
_READ_ERRORS: tuple[type[Exception], ...] = (OSError, *ELF_PARSE_ERRORS)

#: The most bytes a compressed section may inflate to: a larger claim is a bomb.
MAX_INFLATED_BYTES = 1 << 30

_SHF_COMPRESSED = 0x800
#: Sections pyelftools reads whenever DWARF is asked for, NOBITS or not: a NOBITS one
#: becomes that many zero bytes in memory.
_DWARF_PREFIXES = (".debug_", ".zdebug_", ".eh_frame", ".gnu_debugaltlink")
_ZDEBUG_HEADER = struct.Struct(">4sQ")


@contextlib.contextmanager
def open_elf(path: str | Path) -> Iterator[ELFFile]:
    """The ELF file at `path`, once its layout is checked (`check_layout`). Raises
    BadElf for a missing, malformed or non-x86 file, and for anything pyelftools
    raises on its bytes inside the block."""
    path = Path(path)
    try:
        stream = path.open("rb")
    except OSError as err:
        raise BadElf(str(path), err.strerror or str(err)) from err
    with stream:
        try:
            elf = ELFFile(stream)
            check_layout(elf, os.fstat(stream.fileno()).st_size, str(path))
            yield elf
        except _READ_ERRORS as err:
            raise BadElf(str(path), f"not a readable ELF file ({describe(err)})") from err


def describe(error: BaseException) -> str:
    """An exception from a parser as one short visible line."""
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    return visible(first[:200])


def check_layout(elf: ELFFile, file_size: int, path: str) -> None:
    """Raise BadElf unless `elf` is for x86 or AArch64 and every section pyelftools may read lies
    inside the file, with sizes it can read without a huge allocation."""
    machine = elf["e_machine"]
    if machine not in MACHINES:
        reason = f"built for {_machine_name(machine)}: qmpprof profiles x86 and AArch64 guests"
        raise BadElf(path, reason)
    _check_section_table(elf, file_size, path)
    stored = sum(
        _checked_section(elf, index, section, file_size, path)
        for index, section in enumerate(elf.iter_sections())
    )
    if stored > file_size:
        raise BadElf(path, f"its sections claim {stored} bytes, more than the file's {file_size}")


def _machine_name(machine: Any) -> str:
    if isinstance(machine, str):
        return f"{machine.removeprefix('EM_')} ({machine})"
    return f"machine {int(machine):#x}"


def _check_section_table(elf: ELFFile, file_size: int, path: str) -> None:
    if not elf["e_shoff"]:
        return
    end = elf["e_shoff"] + elf.num_sections() * elf["e_shentsize"]
    if elf["e_shentsize"] < elf.structs.Elf_Shdr.sizeof() or end > file_size:
        raise BadElf(path, "its section header table does not fit in the file")


def _checked_section(elf: ELFFile, index: int, section: Any, file_size: int, path: str) -> int:
    """The bytes `section` stores in the file, once checked; raises BadElf."""
    name = f"{index} ({visible(section.name)})" if section.name else str(index)
    kind = section["sh_type"]
    size = section["sh_size"]
    if kind == "SHT_NULL":  # no bytes; index 0's size may count the sections
        return 0
    if kind == "SHT_NOBITS":
        if section.name.startswith(_DWARF_PREFIXES) and size > file_size:
            raise BadElf(path, f"section {name} claims {size} bytes without storing them")
        return 0
    if section["sh_offset"] + size > file_size:
        raise BadElf(path, f"section {name} lies outside the file")
    if kind in ("SHT_SYMTAB", "SHT_DYNSYM") and section["sh_entsize"] != _symbol_size(elf):
        raise BadElf(path, f"section {name} has entries of {section['sh_entsize']} bytes")
    if _inflated_size(section) > MAX_INFLATED_BYTES:
        raise BadElf(path, f"section {name} would inflate beyond {MAX_INFLATED_BYTES} bytes")
    return int(size)


def _symbol_size(elf: ELFFile) -> int:
    return int(elf.structs.Elf_Sym.sizeof())


def _inflated_size(section: Any) -> int:
    """The size a compressed section says it inflates to (0 when not compressed)."""
    if section["sh_flags"] & _SHF_COMPRESSED:
        return int(section.data_size)
    if section.name.startswith(".zdebug_") and section["sh_size"] >= _ZDEBUG_HEADER.size:
        stream = section.stream
        stream.seek(section["sh_offset"])
        magic, size = _ZDEBUG_HEADER.unpack(stream.read(_ZDEBUG_HEADER.size))
        return int(size) if magic == b"ZLIB" else 0
    return 0


#: A build-id is a hash: 16 bytes (md5/uuid) or 20 (sha1) in practice; more is not one.
MAX_BUILD_ID = 64


def read_build_id(elf: ELFFile) -> bytes | None:
    """The NT_GNU_BUILD_ID note's descriptor, or None (no note, or one too long)."""
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():  # type: ignore[attr-defined]
            if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                return _build_id_bytes(note["n_desc"])
    return None


def _build_id_bytes(desc: object) -> bytes | None:
    # pyelftools gives a build-id note's descriptor as a hex string.
    if not isinstance(desc, str) or not 0 < len(desc) <= 2 * MAX_BUILD_ID:
        return None
    try:
        return bytes.fromhex(desc)
    except ValueError:
        return None


def linked_bytes(path: Path, address: int, size: int) -> bytes | None:
    """Up to `size` bytes the ELF at `path` holds at link address `address`, to the end
    of the section with contents that holds it; None when none does (or the file is
    not an ELF we can read)."""
    try:
        with open_elf(path) as elf:
            for section in elf.iter_sections():
                start, length = section["sh_addr"], section["sh_size"]
                if section["sh_type"] != "SHT_PROGBITS" or not start <= address < start + length:
                    continue
                section.stream.seek(section["sh_offset"] + address - start)
                data: bytes = section.stream.read(min(size, start + length - address))
                return data
    except BadElf:
        return None
    return None
