"""One guest binary (the kernel, or a user program) and everything read from its ELF."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadElf
from qmpprof.memory import WindowMemory
from qmpprof.symbols.elf import SymbolTable, load_symbols
from qmpprof.symbols.image import load_code
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
    """Load an ELF as a module called `name` (default: the file name). Raises BadElf."""
    path = Path(path)
    return Module(
        name=name or path.name,
        path=path,
        symbols=load_symbols(path),
        cfi=load_cfi(path),
        code=load_code(path),
        text=read_text_section(path),
    )


def read_text_section(path: Path) -> TextSection | None:
    """The .text section's address, size and SHA-256, or None without one. Raises BadElf."""
    try:
        with path.open("rb") as stream:
            section = ELFFile(stream).get_section_by_name(".text")
            if section is None or not section["sh_size"]:
                return None
            data = section.data()
    except OSError as err:
        raise BadElf(str(path), err.strerror or str(err)) from err
    except ELFError as err:
        raise BadElf(str(path), f"not a readable ELF file ({err})") from err
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
