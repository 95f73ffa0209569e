"""Hostile module lists: a guest whose `modules` list and struct modules are random
words, often pointers back into the same few pages (cycles, self-loops, the head, the
lower half, the end of the address space), or pages of nodes each pointing at the next
(a list longer than MAX_MODULES). The walk ends, reads each node once, raises
only MemoryFault, and every module it gives is bounded: a name of at most MAX_NAME bytes,
text in the kernel half and inside the address space, at most MAX_MODULES of them."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.modules import (
    MAX_MODULES,
    MAX_NAME,
    MAX_TEXT,
    ModuleListLayout,
    ModuleWalk,
)
from qmpprof.model import KERNEL_HALF, KernelModule
from tests.fuzz.budget import cases, counted
from tests.fuzz.kernel_pages import BASE, PAGE, PAGES, RandomKernelPages

MODULE_AREA = 0xFFFF_FFFF_C000_0000
#: Debian 6.12's struct module, as GDB reads it (tests/unit/data/linux/modules.json).
LAYOUT = ModuleListLayout(BASE + 0x40, 0, 0, 8, 24, 56, 320, 328, 4, 332)


def random_page(seed: int, address: int) -> bytes:
    """A page of chained nodes (`_chain`), or of random words (`_word`)."""
    rng = random.Random(f"{seed}:{(address - BASE) // PAGE}")
    if seed % 8 == 0 or rng.random() < 0.2:
        return _chain(address)
    return b"".join(_word(rng).to_bytes(8, "little") for _ in range(PAGE // 8))


def _chain(start: int) -> bytes:
    """Every word points 8 bytes past itself: overlapping struct modules, each node new,
    a list as long as the memory (longer than MAX_MODULES when it is all like this)."""
    return b"".join(
        ((start + at + 8) % (1 << 64)).to_bytes(8, "little") for at in range(0, PAGE, 8)
    )


def _word(rng: random.Random) -> int:
    choice = rng.random()
    if choice < 0.45:  # a node: somewhere in the pages, 8-aligned
        return BASE + rng.randrange(PAGES * PAGE) // 8 * 8
    if choice < 0.5:
        return LAYOUT.head
    if choice < 0.6:  # a text base in the module area
        return MODULE_AREA + rng.randrange(1 << 24)
    if choice < 0.65:
        return rng.randrange(KERNEL_HALF)  # the lower half
    if choice < 0.8:
        return rng.randrange(1 << 16)  # a size, or a state (3: unformed)
    return rng.getrandbits(64)


class FaultingFirst:
    """The same memory, but each read faults the first time its address is asked for,
    as a capture's memory does until that window is read: the walk must resume."""

    def __init__(self, memory: RandomKernelPages) -> None:
        self.memory = memory
        self.asked: set[int] = set()
        self.faults = 0

    def read(self, address: int, size: int) -> bytes:
        if address not in self.asked:
            self.asked.add(address)
            self.faults += 1
            raise MemoryFault(address, size)
        return self.memory.read(address, size)

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


@settings(max_examples=cases(300), deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 32) - 1), st.sampled_from([0, 0x200000]))
@counted
def test_walk_ends_bounded(seed: int, slide: int) -> None:
    memory = FaultingFirst(RandomKernelPages(seed, random_page))
    walk = ModuleWalk(replace(LAYOUT, head=LAYOUT.head - slide), slide)
    found: tuple[KernelModule, ...] | None = None
    for _ in range(2 * (MAX_MODULES + 1)):
        try:
            found = walk.advance(memory)
            break
        except MemoryFault as fault:
            try:
                memory.memory.read(fault.address, fault.size)
            except MemoryFault:
                found = tuple(walk.found)  # unreadable: the walk ends there
                break
    assert found is not None
    assert memory.faults <= MAX_MODULES + 1  # no node read twice
    assert len(found) <= MAX_MODULES
    for module in found:
        assert len(module.name) <= MAX_NAME
        assert module.base >= KERNEL_HALF and module.end <= 1 << 64
        assert 0 < module.size <= MAX_TEXT
