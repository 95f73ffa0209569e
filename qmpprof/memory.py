"""Guest memory as the unwinder sees it: a reader that may fault on any read."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
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


def read_word(memory: MemoryReader, address: int, size: int) -> int:
    """One little-endian word of `size` bytes: 8 (x86-64's) through `read_u64`; 4 (i386's)
    through `read`, at `address` modulo 2**32 (32-bit code's addresses wrap around).
    Raises MemoryFault."""
    if size == 8:
        return memory.read_u64(address)
    return int.from_bytes(memory.read(address & 0xFFFF_FFFF, size), "little")


class WindowMemory:
    """A MemoryReader over captured windows of guest memory; anything else faults."""

    def __init__(self, windows: Iterable[MemoryWindow]) -> None:
        #: (base, end, data): every unwound frame reads here, so the ends are computed once.
        self._windows = [(w.base, w.base + len(w.data), w.data) for w in windows if w.data]
        #: The window the last read found: an unwind reads one stack a while.
        self._last = self._windows[0] if self._windows else (1, 0, b"")

    def read(self, address: int, size: int) -> bytes:
        base, end, data = self._last
        if address < base or address + size > end:
            base, _, data = self._find(address, size)
        start = address - base
        return data[start : start + size]

    def read_u64(self, address: int) -> int:
        base, end, data = self._last
        if address < base or address + 8 > end:
            base, _, data = self._find(address, 8)
        value: int = _U64.unpack_from(data, address - base)[0]
        return value

    def _find(self, address: int, size: int) -> tuple[int, int, bytes]:
        for window in self._windows:
            if window[0] <= address and address + size <= window[1]:
                self._last = window
                return window
        raise MemoryFault(address, size)


#: Fetches a window holding [address, address + size) from the paused guest, or one
#: that starts there and ends early, or None when `address` is unreadable.
WindowFetch = Callable[[int, int], MemoryWindow | None]


class FetchingMemory:
    """A MemoryReader over a sample's windows that grow while it is examined: a read they
    miss fetches a window there from the paused guest at once (`fetch`), at most `limit`
    fetches, and an address found unreadable is not asked for again. Every byte read
    then lies in `windows`, so examining them alone later (a capture file) reads the same.

    Misses are the common case here (each is a fetch, not an error), so the lookup
    returns None instead of raising as WindowMemory does."""

    def __init__(self, windows: Iterable[MemoryWindow], fetch: WindowFetch, limit: int) -> None:
        self.windows = [w for w in windows if w.data]
        self._spans = [(w.base, w.base + len(w.data), w.data) for w in self.windows]
        self._fetch = fetch
        self._left = limit
        self._unreadable: set[int] = set()

    def read(self, address: int, size: int) -> bytes:
        found = self._find(address, size) or self._fetched(address, size)
        if found is None:
            raise MemoryFault(address, size)
        start, data = found
        return data[start : start + size]

    def read_u64(self, address: int) -> int:
        found = self._find(address, 8) or self._fetched(address, 8)
        if found is None:
            raise MemoryFault(address, 8)
        value: int = _U64.unpack_from(found[1], found[0])[0]
        return value

    def keep(self, window: MemoryWindow) -> None:
        """Add bytes known without reading them (words the OS never changes, read at an
        earlier sample), so that the windows hold every byte the examination used."""
        if window.data and self._find(window.base, len(window.data)) is None:
            self.windows.append(window)
            self._spans.append((window.base, window.base + len(window.data), window.data))

    def _find(self, address: int, size: int) -> tuple[int, bytes] | None:
        for base, end, data in self._spans:
            if base <= address and address + size <= end:
                return address - base, data
        return None

    def _fetched(self, address: int, size: int) -> tuple[int, bytes] | None:
        """The new window's (offset of `address`, bytes), when it holds the whole read."""
        if self._left <= 0 or address in self._unreadable or size < 0:
            return None
        self._left -= 1
        window = self._fetch(address, size)
        end = window.base + len(window.data) if window is not None else address
        if window is None or not window.base <= address < end:
            self._unreadable.add(address)
            return None
        self.windows.append(window)
        self._spans.append((window.base, end, window.data))
        return (address - window.base, window.data) if address + size <= end else None
