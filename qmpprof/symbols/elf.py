"""Function symbols of one ELF file, looked up by address with bisection."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from qmpprof.errors import BadElf

_CODE_TYPES = {"STT_FUNC", "STT_NOTYPE"}
_SHF_EXECINSTR = 0x4


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int
    size: int


class SymbolTable:
    """The code symbols of one module, sorted by address.

    A symbol with a size covers [address, address + size); a zero-size symbol
    (assembly labels) covers up to the next symbol.
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
        if symbol.size and offset >= symbol.size:
            return None
        return symbol, offset

    def find(self, name: str) -> Symbol | None:
        """The symbol called `name`, if any."""
        return next((s for s in self._symbols if s.name == name), None)


def load_symbols(path: str | Path) -> SymbolTable:
    """Read the code symbols of an ELF file (.symtab, else .dynsym). Raises BadElf."""
    path = Path(path)
    try:
        with path.open("rb") as stream:
            symbols = _read_code_symbols(ELFFile(stream))
    except OSError as err:
        raise BadElf(str(path), err.strerror or str(err)) from err
    except ELFError as err:
        raise BadElf(str(path), f"not a readable ELF file ({err})") from err
    return SymbolTable(path.name, symbols)


def _read_code_symbols(elf: ELFFile) -> list[Symbol]:
    executable = {
        index
        for index, section in enumerate(elf.iter_sections())
        if section["sh_flags"] & _SHF_EXECINSTR
    }
    for table_name in (".symtab", ".dynsym"):
        table = elf.get_section_by_name(table_name)
        if isinstance(table, SymbolTableSection) and table.num_symbols():
            return [
                Symbol(sym.name, sym["st_value"], sym["st_size"])
                for sym in table.iter_symbols()
                if _is_code(sym, executable)
            ]
    return []


def _is_code(sym: object, executable: set[int]) -> bool:
    entry = sym.entry  # type: ignore[attr-defined]
    section = entry["st_shndx"]
    return (
        bool(sym.name)  # type: ignore[attr-defined]
        and entry["st_info"]["type"] in _CODE_TYPES
        and isinstance(section, int)
        and section in executable
    )


def _dedupe(symbols: list[Symbol]) -> list[Symbol]:
    """Keep one symbol per address, preferring the one with a size (the function)."""
    best: dict[int, Symbol] = {}
    for symbol in symbols:
        current = best.get(symbol.address)
        if current is None or (symbol.size and not current.size):
            best[symbol.address] = symbol
    return list(best.values())
