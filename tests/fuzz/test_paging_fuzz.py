"""Hostile page tables: random guest physical memory and random paging registers.
Every read returns exactly the bytes asked for or raises MemoryFault; read_prefix never
raises; nothing allocates by a size taken from the guest."""

from __future__ import annotations

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.defaults import PAGE_SIZE
from qmpprof.errors import MemoryFault
from qmpprof.target.paging import MAX_READ_BYTES, PagingState, VirtualMemory
from tests.fuzz.budget import cases, counted

PAGES = 64  # of physical memory: small, so that random entries often point inside it


class RandomRam:
    """PAGES pages of random bytes, made on first read, whose 8-byte words are often
    page-table entries (present, sometimes large) pointing back into the same memory."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.pages: dict[int, bytes] = {}

    def read_physical(self, address: int, size: int) -> bytes:
        if address < 0 or size < 0 or address + size > PAGES * PAGE_SIZE:
            raise MemoryFault(address, size)
        first, last = address // PAGE_SIZE, (address + size - 1) // PAGE_SIZE
        data = b"".join(self._page(page) for page in range(first, last + 1))
        start = address - first * PAGE_SIZE
        return data[start : start + size]

    def _page(self, page: int) -> bytes:
        if page not in self.pages:
            rng = random.Random(f"{self.seed}:{page}")
            data = rng.randbytes(PAGE_SIZE)
            if rng.random() < 0.7:  # a page of entries, not just noise
                data = _entries(struct.unpack(f"<{PAGE_SIZE // 8}Q", data))
            self.pages[page] = data
        return self.pages[page]


#: Flags of the entries: present, writable, large (PS), not present, with ignored bits.
_FLAGS = (0x1, 0x3, 0x83, 0x0, 0x81, 0xE03, 0x1, 0x3)


def _entries(words: tuple[int, ...]) -> bytes:
    """Page-table entries from random words: a frame in (or just past) the memory,
    flags, sometimes NX and reserved high bits."""
    entries = [
        (word % (PAGES + 2)) << 12 | _FLAGS[word >> 61] | (word >> 40 & 0x801) << 52
        for word in words
    ]
    return struct.pack(f"<{len(entries)}Q", *entries)


def random_state(rng: random.Random) -> PagingState:
    cr0 = rng.choice([0, 1, 1 << 31 | 1, rng.getrandbits(32)])
    cr3 = rng.choice([rng.randrange(PAGES) * PAGE_SIZE, rng.getrandbits(64)])
    cr4 = rng.choice([0, 1 << 4, 1 << 5, 1 << 5 | 1 << 12, rng.getrandbits(32)])
    efer = rng.choice([0, 1 << 8 | 1 << 10, rng.getrandbits(64)])
    return PagingState(cr0, cr3, cr4, efer)


def random_address(rng: random.Random) -> int:
    return rng.choice(
        [
            rng.getrandbits(64),
            rng.getrandbits(32),
            rng.randrange(PAGES * PAGE_SIZE),
            (1 << 64) - rng.randrange(1, 1 << 20),
            (1 << 47) - rng.randrange(1, PAGE_SIZE),
        ]
    )


def random_size(rng: random.Random) -> int:
    return rng.choice([0, 1, 8, rng.randrange(3 * PAGE_SIZE), MAX_READ_BYTES + 1, 1 << 62])


@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_page_walk_over_random_memory(seed: int) -> None:
    # One drawn seed, not hypothesis' own randoms: pages of random memory would be far
    # beyond what it likes to draw and shrink.
    rng = random.Random(seed)
    memory = VirtualMemory(RandomRam(seed), random_state(rng))
    for _ in range(8):
        address, size = random_address(rng), random_size(rng)
        try:
            data = memory.read(address, size)
        except MemoryFault:
            pass
        else:
            assert len(data) == size
            if size >= 8:
                assert memory.read_u64(address) == int.from_bytes(data[:8], "little")
        prefix = memory.read_prefix(address, size)
        assert len(prefix) <= min(size, MAX_READ_BYTES)
        if prefix:
            assert memory.read(address, len(prefix)) == prefix
        try:
            physical = memory.translate(address)
        except MemoryFault:
            continue
        assert 0 <= physical < 1 << 64
        assert physical & (PAGE_SIZE - 1) == address & (PAGE_SIZE - 1)
