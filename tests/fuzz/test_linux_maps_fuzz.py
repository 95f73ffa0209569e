"""Hostile memory maps: a guest whose task, maple tree or VMA list (5.10), VMAs, files and
dentries are random words, often pointers back into the same few pages (encoded maple
nodes of every type, cycles, self-loops, the lower half, the end of the address space),
or pages of nodes each pointing at the next (a tree deeper than MAX_DEPTH). The walk
ends, reads nothing twice, raises only MemoryFault, and what it gives is bounded; so
does the build-id reader over random and mutated ELF headers."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.maps import (
    MAX_BUILD_ID,
    MAX_DEPTH,
    NAME_MAX,
    NODE_SIZE,
    PATH_MAX,
    BuildIdRead,
    MappedFile,
    MapsLayout,
    MapsWalk,
    parent_read,
)
from qmpprof.memory import MemoryReader
from qmpprof.model import KERNEL_HALF
from tests.fuzz.budget import cases, counted
from tests.fuzz.kernel_pages import BASE, PAGE, PAGES, RandomKernelPages

#: Debian 6.1's offsets, as GDB prints them (tests/unit/data/linux/maps.json), the
#: special mappings' (the vDSO's name), the parent's and the exiting mm's included.
LAYOUT = MapsLayout(
    *(2272, 8, 0, 8, 32, 104, 112, 24, 24, 36, 40, 88, 72, None, 120, 0, 2432, 2420, 2280, 84)
)
#: Debian 5.10's: the VMAs a list from mm_struct.mmap along vm_next (the same file).
LIST_LAYOUT = MapsLayout(
    *(2056, 0, 0, 8, 80, 152, 160, 24, 24, 36, 40, 136, 80, 16, 168, 0, 2248, 2236, 2064, 92)
)
TASK = BASE


def random_page(seed: int, address: int) -> bytes:
    """A page of chained nodes (`_chain`), or of random words (`_word`)."""
    rng = random.Random(f"{seed}:{(address - BASE) // PAGE}")
    if seed % 8 == 0 or rng.random() < 0.1:
        return _chain(address)
    return b"".join(_word(rng).to_bytes(8, "little") for _ in range(PAGE // 8))


def _chain(start: int) -> bytes:
    """Range nodes each of whose slots is the next node: a tree as deep as the memory."""
    words = []
    for at in range(0, PAGE, 8):
        node = (start + at) // NODE_SIZE * NODE_SIZE
        following = (node + NODE_SIZE) % (1 << 64)
        words.append(following | 2 << 3 | 4 if at % NODE_SIZE >= 128 else 0)
    return b"".join(w.to_bytes(8, "little") for w in words)


def _word(rng: random.Random) -> int:
    choice = rng.random()
    somewhere = BASE + rng.randrange(PAGES * PAGE)
    if choice < 0.3:  # a struct: somewhere in the pages, 8-aligned
        return somewhere // 8 * 8
    if choice < 0.5:  # an encoded maple node of a random type: a root (2) or a child (4)
        return somewhere // NODE_SIZE * NODE_SIZE | rng.randrange(5) << 3 | rng.choice((2, 4))
    if choice < 0.6:  # a user address, or a page offset
        return rng.randrange(1 << 47) // PAGE * PAGE
    if choice < 0.65:
        return rng.randrange(KERNEL_HALF)
    if choice < 0.85:  # flags (VM_EXEC), lengths, a metadata end, a pivot 0
        return rng.randrange(1 << rng.choice((3, 8, 16)))
    return rng.getrandbits(64)


class FaultingFirst:
    """The same memory, but a read faults until the walker has been given it, as a
    capture's memory does until that window is read: the walk must resume."""

    def __init__(self, memory: RandomKernelPages) -> None:
        self.memory = memory
        self.given: set[tuple[int, int]] = set()

    def read(self, address: int, size: int) -> bytes:
        if (address, size) not in self.given:
            raise MemoryFault(address, size)
        return self.memory.read(address, size)

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


Found = tuple[MappedFile, ...] | None
T = TypeVar("T")


def walk_all(memory: FaultingFirst, layout: MapsLayout = LAYOUT) -> Found:
    """The walk's answer; None when it needed memory that cannot be read."""
    walk = MapsWalk(layout, TASK)
    return resumed(walk.advance, memory)


def resumed(step: Callable[[MemoryReader], T], memory: FaultingFirst) -> T | None:
    """`step`'s answer, given each read it faults on in turn; None when it needed
    memory that cannot be read."""
    while True:
        try:
            return step(memory)
        except MemoryFault as fault:
            asked = (fault.address, fault.size)
            assert asked not in memory.given, "the walk asked for the same memory twice"
            try:
                memory.memory.read(*asked)
            except MemoryFault:
                return None
            memory.given.add(asked)


@settings(max_examples=cases(200), deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 32) - 1))
@counted
def test_maps_walk_ends_bounded(seed: int) -> None:
    layout = LIST_LAYOUT if seed % 3 == 1 else LAYOUT  # a VMA list (5.10) or a maple tree
    found = walk_all(FaultingFirst(RandomKernelPages(seed, random_page)), layout)
    parent = resumed(parent_read(layout, TASK), FaultingFirst(RandomKernelPages(seed, random_page)))
    assert parent is None or 0 <= parent[1] < 1 << 32
    if found is None:
        return
    assert [m.start for m in found] == sorted(m.start for m in found)
    for mapped in found:
        assert 0 <= mapped.start < mapped.end <= KERNEL_HALF
        assert mapped.path.startswith(("/", "?")) or mapped.path == "[vdso]"
        assert len(mapped.path) <= 4 * (PATH_MAX + NAME_MAX + 1)  # backslash escapes: 4 a byte


def test_a_chain_of_nodes_is_followed_to_max_depth_only() -> None:
    memory = RandomKernelPages(0, random_page)  # seed % 8 == 0: every page is a chain
    root = (BASE + PAGE) | 2 << 3 | 2
    mm = BASE + 2 * PAGE + 128  # a chain page's second half: the word is `root`-like
    task = bytearray(memory.page(0))
    task[LAYOUT.task_mm : LAYOUT.task_mm + 8] = (mm - LAYOUT.mm_root).to_bytes(8, "little")
    memory.pages[0] = bytes(task)
    chain = bytearray(memory.page(2))
    chain[128 : 128 + 8] = root.to_bytes(8, "little")
    memory.pages[2] = bytes(chain)
    counting = FaultingFirst(memory)
    assert walk_all(counting) == ()
    nodes = [address for address, size in counting.given if size == NODE_SIZE]
    assert len(nodes) == MAX_DEPTH


ELF_HEADER = bytes.fromhex("7f454c46020101") + bytes(57)


@settings(max_examples=cases(300), deadline=None)
@given(st.binary(min_size=0, max_size=2048), st.integers(0, 63), st.integers(0, 2048))
@counted
def test_build_id_read_ends_bounded(tail: bytes, phnum: int, size: int) -> None:
    """An ELF header whose program headers and notes are random, in a mapping of random
    size: None or at most MAX_BUILD_ID bytes, each read inside the mapping."""
    header = bytearray(ELF_HEADER)
    header[32:40] = (64).to_bytes(8, "little")
    header[54:58] = (56).to_bytes(2, "little") + phnum.to_bytes(2, "little")
    image = bytes(header) + tail
    reads: list[tuple[int, int]] = []

    class Image:
        def read(self, address: int, length: int) -> bytes:
            reads.append((address, length))
            offset = address - 0x40_0000
            if offset < 0 or offset + length > len(image):
                raise MemoryFault(address, length)
            return image[offset : offset + length]

        def read_u64(self, address: int) -> int:
            return int.from_bytes(self.read(address, 8), "little")

    try:
        found = BuildIdRead(0x40_0000, size).advance(Image())
    except MemoryFault:
        found = None
    assert found is None or 0 < len(found) <= MAX_BUILD_ID
    assert all(a >= 0x40_0000 and a + n <= 0x40_0000 + size for a, n in reads)
