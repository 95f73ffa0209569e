"""Random kernel memory for the fuzz tests of walks over guest structures: a few pages
near the top of the address space (so that a read can run past 2**64), each made on
first read from the seed and its address; a read anywhere else faults."""

from __future__ import annotations

from collections.abc import Callable

from qmpprof.errors import MemoryFault

PAGE = 4096
PAGES = 16
BASE = (1 << 64) - PAGES * PAGE


class RandomKernelPages:
    """PAGES pages at BASE; `make(seed, address)` gives the page at `address`."""

    def __init__(self, seed: int, make: Callable[[int, int], bytes]) -> None:
        self.seed = seed
        self.pages: dict[int, bytes] = {}
        self.reads = 0
        self._make = make

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        if address < BASE or address + size > BASE + PAGES * PAGE:
            raise MemoryFault(address, size)
        start = address - BASE
        data = b"".join(self.page(p) for p in range(start // PAGE, (start + size - 1) // PAGE + 1))
        return data[start % PAGE : start % PAGE + size]

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def page(self, page: int) -> bytes:
        """Page number `page` from BASE."""
        if page not in self.pages:
            self.pages[page] = self._make(self.seed, BASE + page * PAGE)
        return self.pages[page]
