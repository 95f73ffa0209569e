"""One guest binary (the kernel, or a user program) and everything read from its ELF."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.memory import WindowMemory
from qmpprof.symbols.elf import SymbolTable, read_code_symbols
from qmpprof.symbols.elf_file import open_elf
from qmpprof.symbols.image import code_sections
from qmpprof.unwind.cfi import CfiTable, load_cfi


@dataclass(frozen=True)
class TextSection:
    """Where a binary's .text lies (link address = guest address) and what it holds."""

    address: int
    size: int
    sha256: str

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + self.size


@dataclass(frozen=True)
class Module:
    """A binary's symbols, CFI and code bytes, loaded once."""

    name: str
    path: Path
    symbols: SymbolTable
    cfi: CfiTable
    code: WindowMemory
    text: TextSection | None


def load_module(path: str | Path, name: str | None = None) -> Module:
    """Load an ELF as a module called `name` (default: the file name). Raises BadElf
    for a file that is missing, not an x86 ELF, or malformed (checked before the CFI,
    which opens the file again, reads any of it)."""
    path = Path(path)
    with open_elf(path) as elf:
        symbols = SymbolTable(path.name, read_code_symbols(elf))
        code = WindowMemory(code_sections(elf))
        text = text_section(elf)
    return Module(name or path.name, path, symbols, load_cfi(path), code, text)


def text_section(elf: ELFFile) -> TextSection | None:
    """The .text of an ELF file opened by `open_elf`, or None without stored bytes."""
    section = elf.get_section_by_name(".text")
    if section is None or section["sh_type"] == "SHT_NOBITS" or not section["sh_size"]:
        return None
    data = section.data()
    return TextSection(section["sh_addr"], len(data), hashlib.sha256(data).hexdigest())


def load_user_modules(directories: list[Path], files: list[Path]) -> dict[str, Module]:
    """User binaries named after their process: `DIR/NAME.elf` and each `--user FILE`
    (its name without `.elf`). Raises BadElf for a given file that is not an ELF."""
    paths = [*files]
    for directory in directories:
        if not directory.is_dir():
            raise BadElf(str(directory), "not a directory")
        paths += sorted(p for p in directory.iterdir() if p.suffix == ".elf" and p.is_file())
    modules = [load_module(p, name=p.name.removesuffix(".elf")) for p in paths]
    return {module.name: module for module in modules}
