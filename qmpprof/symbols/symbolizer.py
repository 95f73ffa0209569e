"""Turn unwound addresses into named frames, caching per address."""

from __future__ import annotations

from typing import Protocol

from qmpprof.model import FileMapping, Frame, FrameAddress, MappedFile
from qmpprof.symbols.elf import SymbolTable

#: What a lookup found at an address: function, offset, module, file mapping, and
#: whether it is the kernel's.
_Found = tuple[str | None, int, str | None, FileMapping | None, bool]


class SymbolSource(Protocol):
    def symbols_at(self, address: int) -> tuple[SymbolTable, int] | None:
        """The symbol table of the module mapped at a guest address, and its bias
        (guest address = file address + bias); None where no module is mapped."""
        ...

    def file_at(self, address: int) -> MappedFile | None:
        """The file mapped at `address`, where the guest's own map says so."""
        ...

    def in_kernel(self, address: int) -> bool:
        """Whether code at `address` is the kernel's (or one of its modules')."""
        ...


class Symbolizer:
    """Names frames at guest addresses from the symbols of the modules mapped there."""

    def __init__(self, source: SymbolSource) -> None:
        self._source = source
        self._cache: dict[int, _Found] = {}
        # Interned, so the many samples of a recording share their Frame objects.
        self._frames: dict[FrameAddress, Frame] = {}

    def symbolize(self, address: FrameAddress) -> Frame:
        """The frame for `address`; function None when no symbol covers it (its offset
        then the offset in the file mapped there, if any)."""
        frame = self._frames.get(address)
        if frame is None:
            frame = self._frames[address] = self._symbolize(address)
        return frame

    def _symbolize(self, address: FrameAddress) -> Frame:
        key = address.lookup_address
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._lookup(key)
        function, offset, module, mapping, kernel = found
        if module is not None:
            offset += address.address - key
        return Frame(address, function, offset, module, mapping, kernel)

    def _lookup(self, address: int) -> _Found:
        found = self._source.symbols_at(address)
        hit = found[0].lookup(address - found[1]) if found is not None else None
        in_file = self._source.file_at(address)
        mapping = in_file.mapping if in_file is not None else None
        kernel = self._source.in_kernel(address)
        if found is not None and hit is not None:
            return hit[0].name, hit[1], found[0].name, mapping, kernel
        if in_file is not None:
            # Which file still says something: `libc.so.6+0x2f1a0` (offset in the file).
            return None, in_file.file_offset, in_file.name, mapping, kernel
        return None, 0, None, None, kernel
