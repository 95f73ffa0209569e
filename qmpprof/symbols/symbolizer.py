"""Turn unwound addresses into named frames, caching per address."""

from __future__ import annotations

from typing import Protocol

from qmpprof.model import Frame, FrameAddress
from qmpprof.symbols.elf import SymbolTable


class SymbolSource(Protocol):
    def symbols_at(self, address: int) -> tuple[SymbolTable, int] | None:
        """The symbol table of the module mapped at a guest address, and its bias
        (guest address = file address + bias); None where no module is mapped."""
        ...


class Symbolizer:
    """Names frames at guest addresses from the symbols of the modules mapped there."""

    def __init__(self, source: SymbolSource) -> None:
        self._source = source
        self._cache: dict[int, tuple[str | None, int, str | None]] = {}
        # Interned, so the many samples of a recording share their Frame objects.
        self._frames: dict[FrameAddress, Frame] = {}

    def symbolize(self, address: FrameAddress) -> Frame:
        """The frame for `address`; function None (and offset 0) when no symbol covers it."""
        frame = self._frames.get(address)
        if frame is None:
            frame = self._frames[address] = self._symbolize(address)
        return frame

    def _symbolize(self, address: FrameAddress) -> Frame:
        key = address.lookup_address
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._lookup(key)
        function, offset, module = found
        if function is not None:
            offset += address.address - key
        return Frame(address, function, offset, module)

    def _lookup(self, address: int) -> tuple[str | None, int, str | None]:
        found = self._source.symbols_at(address)
        if found is None:
            return None, 0, None
        table, bias = found
        hit = table.lookup(address - bias)
        if hit is None:
            return None, 0, None
        symbol, offset = hit
        return symbol.name, offset, table.name
