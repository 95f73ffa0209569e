"""The code bytes of an ELF file, readable by guest address without asking the guest."""

from __future__ import annotations

from pathlib import Path

from elftools.elf.elffile import ELFFile

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.symbols.elf_file import open_elf

_SHF_EXECINSTR = 0x4


def load_code(path: str | Path) -> WindowMemory:
    """The executable sections of the ELF at `path`, at their link addresses. Raises BadElf."""
    with open_elf(Path(path)) as elf:
        return WindowMemory(code_sections(elf))


def code_sections(elf: ELFFile) -> list[MemoryWindow]:
    """The executable sections' bytes of an ELF file opened by `open_elf`."""
    return [
        MemoryWindow(section["sh_addr"], section.data())
        for section in elf.iter_sections()
        if section["sh_flags"] & _SHF_EXECINSTR and section["sh_type"] == "SHT_PROGBITS"
    ]
