"""Running pure steps that raise MemoryFault (a walk's `advance`) over guest memory read
through a memory backend a page window at a time: what record/process_maps.py and
record/file_pages.py read the guest's kernel and processes with."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TypeVar

from qmpprof.errors import MemoryFault
from qmpprof.memory import MemoryReader
from qmpprof.target.memory import MemoryBackend

#: Pages read at most by one walk: 16 MiB, far more than a tree of MAX_VMAS entries
#: packed in slab pages takes; a hostile tree ends there, as a failed walk.
MAX_READS = 4096
PAGE_SIZE = 4096
T = TypeVar("T")


class PageMemory:
    """A MemoryReader over the guest pages read so far; reading any other faults."""

    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}

    def read(self, address: int, size: int) -> bytes:
        first, last = address // PAGE_SIZE, (address + size - 1) // PAGE_SIZE
        if size <= 0 or last - first > 1 or last >= (1 << 64) // PAGE_SIZE:
            raise MemoryFault(address, size)
        parts = [self.pages.get(page) for page in range(first, last + 1)]
        if any(part is None for part in parts):
            raise MemoryFault(address, size)
        data = b"".join(part for part in parts if part is not None)
        start = address % PAGE_SIZE
        return data[start : start + size]

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


class PageReader:
    """Runs pure steps that raise MemoryFault (a walk's `advance`), satisfying each
    fault by reading whole pages through the backend with `vcpu`'s page tables; the
    pages are kept, so nothing is read twice."""

    def __init__(self, memory: MemoryBackend, vcpu: int) -> None:
        self._memory = memory
        self._vcpu = vcpu
        self.pages = PageMemory()
        self.reads = 0

    async def run(self, step: Callable[[MemoryReader], T]) -> T | _Unreadable:
        """`step`'s result, or UNREADABLE when memory it needs cannot be read (or the
        reads would pass MAX_READS)."""
        while True:
            try:
                return step(self.pages)
            except MemoryFault as fault:
                if not await self._fetch(fault):
                    return UNREADABLE

    async def _fetch(self, fault: MemoryFault) -> bool:
        first = fault.address // PAGE_SIZE * PAGE_SIZE
        size = -(-(fault.address + fault.size - first) // PAGE_SIZE) * PAGE_SIZE
        if self.reads >= MAX_READS or size > 2 * PAGE_SIZE or first + size > 1 << 64:
            return False
        self.reads += 1
        data = await self._memory.read_window(self._vcpu, first, size)
        for at in range(0, len(data) - PAGE_SIZE + 1, PAGE_SIZE):
            self.pages.pages[(first + at) // PAGE_SIZE] = data[at : at + PAGE_SIZE]
        return fault.address + fault.size <= first + len(data) // PAGE_SIZE * PAGE_SIZE

    async def read_page(self, address: int) -> bytes:
        """The page at `address` (page-aligned), not kept: b"" when unreadable or past
        MAX_READS."""
        if self.reads >= MAX_READS:
            return b""
        self.reads += 1
        return await self._memory.read_window(self._vcpu, address, PAGE_SIZE)


class _Unreadable(enum.Enum):
    UNREADABLE = enum.auto()


UNREADABLE = _Unreadable.UNREADABLE
