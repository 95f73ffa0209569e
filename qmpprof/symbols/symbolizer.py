"""Turn unwound addresses into named frames, caching per address."""

from __future__ import annotations

from collections.abc import Sequence

from qmpprof.model import Frame, FrameAddress
from qmpprof.symbols.elf import SymbolTable


class Symbolizer:
    """Names frames from a set of modules' symbol tables (first match wins)."""

    def __init__(self, tables: Sequence[SymbolTable]) -> None:
        self._tables = tuple(tables)
        self._cache: dict[int, tuple[str | None, int, str | None]] = {}
        # Interned, so the many samples of a recording share their Frame objects.
        self._frames: dict[FrameAddress, Frame] = {}

    @property
    def has_symbols(self) -> bool:
        return any(len(table) for table in self._tables)

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
        for table in self._tables:
            hit = table.lookup(address)
            if hit is not None:
                symbol, offset = hit
                return symbol.name, offset, table.name
        return None, 0, None
