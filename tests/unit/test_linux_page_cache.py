"""A file's pages from the guest kernel's page cache (guest/linux/page_cache.py): the walk
over guest memory saved from Debian 12's 6.1 and 6.12 kernels and Debian 11's 5.10
(tests/unit/data/linux/page_cache.json, recorded by record_page_cache.py there while
dynwork ran), for every page of libc's .eh_frame, most of which dynwork's page tables
do not map. The oracles are not qmpprof's: the sysroot's libc (the guest's, byte for
byte) holds at each file offset the bytes the recording found where the walk pointed;
GDB gave the offsets and xa_node's layout. Multi-index entries (large folios, none in
the recording: ramfs and tmpfs files have small ones) are checked on nodes laid out by
xarray.h's rules."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.maps import FileSource, FileVma
from qmpprof.guest.linux.page_cache import (
    CHUNK_SIZE,
    NODE_SHIFT,
    NODE_SLOTS,
    PageCacheLayout,
    file_page,
    memory_bases,
    page_cache_layout,
    xarray_load,
)
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from tests.unit.test_linux_maps import CACHE, gdb_members, saved

DATA: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "linux" / "page_cache.json").read_text()
)
ABIS = sorted(DATA)
REPOSITORY = Path(__file__).parents[2]
LIBC = "lib/x86_64-linux-gnu/libc.so.6"


def libc_of(abi: str) -> Path:
    """The guest's libc in the sysroot it booted with (5.10: bullseye's own)."""
    sysroot: str = DATA[abi].get("sysroot", "examples/linux/build/sysroot")
    return REPOSITORY / sysroot / LIBC


PAGE = 4096


def gdb_layout(abi: str) -> PageCacheLayout:
    return PageCacheLayout(*DATA[abi]["gdb"]["layout"])


def source(abi: str) -> FileSource:
    file, vmas = DATA[abi]["source"]
    return FileSource(file, tuple(FileVma(*vma) for vma in vmas))


def walked(abi: str, reads: list[list[Any]] | None = None) -> list[int | None]:
    """Each recorded page's direct-map address, as the walk finds it over the saved
    reads (or `reads`)."""
    layout, found = gdb_layout(abi), source(abi)
    memory = saved(DATA[abi]["kernel_reads"] if reads is None else reads)
    bases = memory_bases(memory, layout, DATA[abi]["slide"])
    assert bases is not None
    pages = []
    for address, *_ in DATA[abi]["pages"]:
        index = found.page_index(address)
        assert index is not None
        pages.append(file_page(memory, layout, bases, found.file, index))
    return pages


@pytest.mark.parametrize("abi", ABIS)
def test_the_dwarf_layout_is_gdbs(abi: str) -> None:
    vmlinux = CACHE / abi / "vmlinux"
    if not vmlinux.exists():
        pytest.skip(f"{vmlinux} is not cached (make linux-guest)")
    assert page_cache_layout(ElfTypes(vmlinux)) == gdb_layout(abi)


@pytest.mark.parametrize("abi", ABIS)
def test_the_xa_node_is_where_gdb_puts_it(abi: str) -> None:
    members = gdb_members(DATA[abi]["gdb"]["ptype"], "xa_node")
    assert members["shift"] == (NODE_SHIFT, 1)
    assert members["slots"] == (NODE_SLOTS, CHUNK_SIZE)


@pytest.mark.parametrize("abi", ABIS)
def test_most_of_libcs_eh_frame_is_in_no_page_table(abi: str) -> None:
    """Why the page cache is read at all: dynwork touched few of those pages."""
    mapped = [page[2] for page in DATA[abi]["pages"]]
    assert len(mapped) > 30 and sum(mapped) < len(mapped) // 2


@pytest.mark.parametrize("abi", ABIS)
def test_each_page_found_is_the_files_page(abi: str) -> None:
    path = libc_of(abi)
    if not path.exists():
        pytest.skip(f"no {path}: run make -C examples/linux")
    libc = path.read_bytes()
    found = walked(abi)
    for (_, index, _, address, digest), walked_to in zip(DATA[abi]["pages"], found, strict=True):
        assert walked_to == address
        expected = libc[index * PAGE : (index + 1) * PAGE].ljust(PAGE, b"\0")
        assert hashlib.sha256(expected).hexdigest() == digest, index


@pytest.mark.parametrize(("abi", "field"), [(abi, f) for abi in ABIS for f in ("mapping", "index")])
def test_a_folio_of_another_file_or_index_is_not_taken(abi: str, field: str) -> None:
    """The folio must name the file's address_space and the index the xarray put it
    at: with either changed in the saved folio, the page is not cached."""
    layout = gdb_layout(abi)
    reads = [list(read) for read in DATA[abi]["kernel_reads"]]
    at = layout.folio_mapping if field == "mapping" else layout.folio_index
    folios = [read for read in reads if len(read[1]) == 2 * layout.folio_span]
    assert len(folios) == len(DATA[abi]["pages"])
    data = bytearray.fromhex(folios[0][1])
    data[at] ^= 1
    folios[0][1] = data.hex()
    results = walked(abi, reads)
    assert results.count(None) == 1 and results[0] is None


@pytest.mark.parametrize("abi", ABIS)
def test_an_index_past_the_file_is_not_cached(abi: str) -> None:
    layout, memory, found = gdb_layout(abi), saved(DATA[abi]["kernel_reads"]), source(abi)
    bases = memory_bases(memory, layout, DATA[abi]["slide"])
    assert bases is not None
    assert file_page(memory, layout, bases, found.file, 1 << 40) is None


def test_a_vma_that_may_hold_private_copies_gives_no_index() -> None:
    file = FileSource(0, (FileVma(0x1000, 0x3000, 5, False), FileVma(0x3000, 0x4000, 7, True)))
    assert [file.page_index(a) for a in (0x1000, 0x2FFF, 0x3000, 0x4000)] == [5, 6, None, None]


# Hand-made xarrays, laid out as include/linux/xarray.h says: a node pointer is the
# node's address | 2, a sibling entry (offset << 2) | 2 names its canonical slot, a value
# entry has bit 0 set.
ROOT, LEAF = 0xFFFF_8880_0001_0000, 0xFFFF_8880_0002_0000
FOLIO_A, FOLIO_B, FOLIO_C = 0xFFFF_EA00_0000_1000, 0xFFFF_EA00_0000_2000, 0xFFFF_EA00_0000_3000


def node(shift: int, slots: dict[int, int]) -> bytes:
    words = [slots.get(i, 0) for i in range(CHUNK_SIZE)]
    return bytes([shift]) + bytes(NODE_SLOTS - 1) + b"".join(w.to_bytes(8, "little") for w in words)


def sibling(offset: int) -> int:
    return offset << 2 | 2


def two_levels() -> WindowMemory:
    """Indexes 64..127 in a leaf (an order-2 folio at 68..71, a shadow entry at 72);
    128..255 one order-7 folio in the root's slots 2 and 3."""
    leaf = node(0, {4: FOLIO_A, 5: sibling(4), 6: sibling(4), 7: sibling(4), 8: 0x1235, 9: FOLIO_C})
    root = node(6, {1: LEAF | 2, 2: FOLIO_B, 3: sibling(2)})
    return WindowMemory([MemoryWindow(ROOT, root), MemoryWindow(LEAF, leaf)])


def test_multi_index_entries_give_their_folio_and_first_index() -> None:
    memory, head = two_levels(), ROOT | 2
    assert xarray_load(memory, head, 68) == (FOLIO_A, 68)
    assert xarray_load(memory, head, 71) == (FOLIO_A, 68)
    assert xarray_load(memory, head, 73) == (FOLIO_C, 73)
    assert xarray_load(memory, head, 128) == (FOLIO_B, 128)
    assert xarray_load(memory, head, 250) == (FOLIO_B, 128)


def test_what_holds_no_page_gives_none() -> None:
    memory, head = two_levels(), ROOT | 2
    assert xarray_load(memory, head, 72) is None  # a value (shadow) entry
    assert xarray_load(memory, head, 74) is None  # an empty slot
    assert xarray_load(memory, head, 10) is None  # the root's empty slot 0
    assert xarray_load(memory, head, 64 * 64) is None  # past what the root covers
    assert xarray_load(memory, FOLIO_A, 0) == (FOLIO_A, 0)  # a lone entry: index 0 only
    assert xarray_load(memory, FOLIO_A, 1) is None


def test_a_node_whose_shift_is_not_one_level_down_ends_the_walk() -> None:
    """A child must have its parent's shift less 6: a node pointing at itself ends."""
    looped = node(6, {0: ROOT | 2})
    assert xarray_load(WindowMemory([MemoryWindow(ROOT, looped)]), ROOT | 2, 5) is None
