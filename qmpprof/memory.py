"""Guest memory as the unwinder sees it: a reader that may fault on any read."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Protocol

from qmpprof.errors import MemoryFault
from qmpprof.model import MemoryWindow

_U64 = struct.Struct("<Q")


class MemoryReader(Protocol):
    """Reads guest virtual memory. Raises MemoryFault (with the address) on failure."""

    def read(self, address: int, size: int) -> bytes: ...

    def read_u64(self, address: int) -> int:
        """One little-endian 64-bit word (the unwinder's hot path)."""
        ...


class WindowMemory:
    """A MemoryReader over captured windows of guest memory; anything else faults."""

    def __init__(self, windows: Iterable[MemoryWindow]) -> None:
        #: (base, end, data): every unwound frame reads here, so the ends are computed once.
        self._windows = tuple((w.base, w.end, w.data) for w in windows if w.data)

    def read(self, address: int, size: int) -> bytes:
        for base, end, data in self._windows:
            start = address - base
            if start >= 0 and address + size <= end:
                return data[start : start + size]
        raise MemoryFault(address, size)

    def read_u64(self, address: int) -> int:
        for base, end, data in self._windows:
            start = address - base
            if start >= 0 and address + 8 <= end:
                value: int = _U64.unpack_from(data, start)[0]
                return value
        raise MemoryFault(address, 8)
