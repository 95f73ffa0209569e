"""The code bytes of an ELF file, readable by guest address without asking the guest."""

from __future__ import annotations

from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow

_SHF_EXECINSTR = 0x4


def load_code(path: str | Path) -> WindowMemory:
    """The executable sections of the ELF at `path`, at their link addresses. Raises BadElf."""
    try:
        with Path(path).open("rb") as stream:
            return WindowMemory(_code_sections(ELFFile(stream)))
    except OSError as err:
        raise BadElf(str(path), err.strerror or str(err)) from err
    except ELFError as err:
        raise BadElf(str(path), f"not a readable ELF file ({err})") from err


def _code_sections(elf: ELFFile) -> list[MemoryWindow]:
    return [
        MemoryWindow(section["sh_addr"], section.data())
        for section in elf.iter_sections()
        if section["sh_flags"] & _SHF_EXECINSTR and section["sh_type"] == "SHT_PROGBITS"
    ]
