"""Function symbols of one ELF file, looked up by address with bisection."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from qmpprof.symbols.elf_file import open_elf

_CODE_TYPES = {"STT_FUNC", "STT_NOTYPE"}
_SHF_EXECINSTR = 0x4


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int
    size: int


class SymbolTable:
    """The code symbols of one module, sorted by address.

    A symbol covers [address, address + size); the loader gives a zero-size symbol
    (an assembly label) the rest of its section, and the lookup takes the nearest
    symbol below an address, so a label covers up to the next symbol.
    """

    def __init__(self, name: str, symbols: list[Symbol]) -> None:
        self.name = name
        self._symbols = sorted(_dedupe(symbols), key=lambda s: s.address)
        self._starts = [s.address for s in self._symbols]

    def __len__(self) -> int:
        return len(self._symbols)

    def lookup(self, address: int) -> tuple[Symbol, int] | None:
        """The symbol covering `address` and the offset into it, or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        symbol = self._symbols[index]
        offset = address - symbol.address
        if offset >= symbol.size:
            return None
        return symbol, offset

    def find(self, name: str) -> Symbol | None:
        """The symbol called `name`, if any."""
        return next((s for s in self._symbols if s.name == name), None)


def load_symbols(path: str | Path) -> SymbolTable:
    """Read the code symbols of an ELF file (.symtab, else .dynsym). Raises BadElf."""
    path = Path(path)
    with open_elf(path) as elf:
        return SymbolTable(path.name, read_code_symbols(elf))


def read_code_symbols(elf: ELFFile) -> list[Symbol]:
    """The code symbols of an ELF file opened by `open_elf`."""
    section_ends = {
        index: section["sh_addr"] + section["sh_size"]
        for index, section in enumerate(elf.iter_sections())
        if section["sh_flags"] & _SHF_EXECINSTR
    }
    for table_name in (".symtab", ".dynsym"):
        table = elf.get_section_by_name(table_name)
        if isinstance(table, SymbolTableSection) and table.num_symbols():
            return [
                _code_symbol(sym, section_ends[sym["st_shndx"]])
                for sym in table.iter_symbols()
                if _is_code(sym, section_ends)
            ]
    return []


def _code_symbol(sym: Any, section_end: int) -> Symbol:
    address = sym["st_value"]
    return Symbol(sym.name, address, sym["st_size"] or max(section_end - address, 0))


def _is_code(sym: Any, section_ends: dict[int, int]) -> bool:
    section = sym["st_shndx"]
    return (
        bool(sym.name)
        and sym["st_info"]["type"] in _CODE_TYPES
        and isinstance(section, int)
        and section in section_ends
    )


def _dedupe(symbols: list[Symbol]) -> list[Symbol]:
    """Keep one symbol per address, preferring the tightest (the function over a label)."""
    best: dict[int, Symbol] = {}
    for symbol in symbols:
        current = best.get(symbol.address)
        if current is None or symbol.size < current.size:
            best[symbol.address] = symbol
    return list(best.values())
