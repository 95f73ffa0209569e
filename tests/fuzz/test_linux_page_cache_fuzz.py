"""Hostile page caches: a guest whose struct file, address_space, xarray nodes and folios
are random words, often pointers back into the same few pages (encoded nodes, sibling,
value and internal entries, folios in the vmemmap, cycles, the end of the address
space). The walk ends within 11 levels, raises only MemoryFault, and a page it gives
is in the direct map."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.page_cache import (
    CHUNK_SIZE,
    MAX_PFN,
    MemoryBases,
    PageCacheLayout,
    file_page,
)
from qmpprof.model import KERNEL_HALF
from tests.fuzz.budget import cases, counted
from tests.fuzz.kernel_pages import BASE, PAGE, PAGES, RandomKernelPages

#: Debian 6.1's offsets and sizes, as GDB prints them (tests/unit/data/linux/page_cache.json).
LAYOUT = PageCacheLayout(216, 16, 24, 32, 64, 0xFFFF_FFFF_8241_3D50, 0xFFFF_FFFF_8241_3D60)
#: The vmemmap at the random pages, so that folio pointers land in them.
BASES = MemoryBases(BASE, 0xFFFF_8880_0000_0000)
#: struct file, address_space, 11 nodes, a folio: what one lookup may read at most.
MOST_READS = 2 + 11 + 1


def random_page(seed: int, address: int) -> bytes:
    rng = random.Random(f"{seed}:{(address - BASE) // PAGE}")
    return b"".join(_word(rng).to_bytes(8, "little") for _ in range(PAGE // 8))


def _word(rng: random.Random) -> int:
    choice = rng.random()
    somewhere = BASE + rng.randrange(PAGES * PAGE)
    if choice < 0.3:  # a struct or folio: somewhere in the pages, 8-aligned
        return somewhere // 8 * 8
    if choice < 0.55:  # an encoded xa_node
        return somewhere // 8 * 8 | 2
    if choice < 0.7:  # a sibling, a retry or zero entry
        return rng.randrange(CHUNK_SIZE + 4) << 2 | 2
    if choice < 0.8:  # a shift (a node's first byte), an index, a small count
        return rng.choice((0, 6, 12, 60, 66, 3)) | rng.randrange(1 << 16) << 8
    if choice < 0.9:  # a value entry
        return rng.getrandbits(64) | 1
    return rng.getrandbits(64)


def check(found: int | None, memory: RandomKernelPages) -> None:
    """A bounded walk; a page it gives is in the direct map."""
    assert memory.reads <= MOST_READS
    if found is not None:
        pfn, offset = divmod(found - BASES.direct_map, PAGE)
        assert offset == 0 and 0 <= pfn < MAX_PFN and found >= KERNEL_HALF


@settings(max_examples=cases(300), deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 32) - 1), st.integers(0, (1 << 64) - 1))
@counted
def test_page_cache_walk_ends_bounded(seed: int, index: int) -> None:
    memory = RandomKernelPages(seed, random_page)
    file = BASE + random.Random(seed).randrange(PAGES * PAGE - 512) // 8 * 8
    for wanted in (index, index % 4096, index % 64):
        memory.reads = 0
        try:
            found = file_page(memory, LAYOUT, BASES, file, wanted)
        except MemoryFault:
            continue
        check(found, memory)


def well_formed() -> bytearray:
    """A file whose page cache holds indexes 64..127 (a leaf under the root; 68..71 one
    order-2 folio) and 128..255 (one order-7 folio in the root), every folio naming the
    address_space and its first index, in pages 3 on (the vmemmap)."""
    memory = bytearray(PAGES * PAGE)
    mapping, root, leaf = BASE + 1024, BASE + PAGE, BASE + 2 * PAGE

    def word(address: int, value: int) -> None:
        memory[address - BASE : address - BASE + 8] = value.to_bytes(8, "little")

    def folio(pfn: int, first: int) -> int:
        address = BASE + 3 * PAGE + pfn * LAYOUT.page_struct
        word(address + LAYOUT.folio_mapping, mapping)
        word(address + LAYOUT.folio_index, first)
        return address

    word(BASE + LAYOUT.f_mapping, mapping)
    word(mapping + LAYOUT.pages_head, root | 2)
    memory[PAGE] = 6
    word(root + 40 + 8, leaf | 2)
    word(root + 40 + 16, folio(0, 128))
    word(root + 40 + 24, 2 << 2 | 2)
    for slot in range(64):
        sibling = 5 <= slot < 8
        word(leaf + 40 + 8 * slot, 4 << 2 | 2 if sibling else folio(10 + slot, 64 + slot))
    return memory


WELL_FORMED = bytes(well_formed())
STRUCTURED = MemoryBases(BASE + 3 * PAGE, BASES.direct_map)


def test_the_well_formed_file_gives_its_pages() -> None:
    memory = RandomKernelPages(0, lambda _, address: WELL_FORMED[address - BASE :][:PAGE])
    for index, pfn in ((64, 10), (69, 15), (70, 16), (127, 73), (128, 0), (255, 127)):
        assert file_page(memory, LAYOUT, STRUCTURED, BASE, index) == BASES.direct_map + pfn * PAGE
    assert file_page(memory, LAYOUT, STRUCTURED, BASE, 63) is None


@settings(max_examples=cases(300), deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 3 * PAGE + 130 * 64), st.binary(min_size=1, max_size=8)),
        max_size=16,
    ),
    index=st.integers(0, 300),
)
@counted
def test_an_edited_page_cache_gives_pages_or_nothing(
    edits: list[tuple[int, bytes]], index: int
) -> None:
    data = bytearray(WELL_FORMED)
    for at, raw in edits:
        data[at : at + len(raw)] = raw
    memory = RandomKernelPages(0, lambda _, address: bytes(data[address - BASE :][:PAGE]))
    try:
        found = file_page(memory, LAYOUT, STRUCTURED, BASE, index)
    except MemoryFault:
        return
    check(found, memory)
