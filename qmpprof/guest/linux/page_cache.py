"""A page of a guest file as the Linux kernel's page cache holds it, for what a process
never touched: Linux maps a file's pages into a process lazily, so pages it never read
are in no page table, but a file just executed is mostly in the page cache.

The way there: `struct file`'s f_mapping (an address_space), its `i_pages` xarray
(include/linux/xarray.h, lib/xarray.c) indexed by the page's index in the file, whose
entry is the folio (6.1 and 6.12 alike) holding that index — before folios (5.16) the
struct page (a huge page's head page is in every slot it covers, and its index is its
first: such a page is not taken, as nothing read tells a head page from one whose index
was changed); the folio's struct page is
in the vmemmap array, so its page frame number is its distance from `vmemmap_base` in
sizeof(struct page); the page's bytes are in the direct map at `page_offset_base` +
pfn * 4096. Both bases are variables that KASLR randomizes, read from the guest.

An xarray node (xa_node) has a shift, 64 slots and a fixed layout on 64-bit kernels
(not in the DWARF this module reads, as with the maple nodes of guest/linux/maps.py;
GDB's ptype of 6.1's and 6.12's: tests/unit/test_linux_page_cache.py). A slot holds
NULL, a pointer (the folio), a value entry (low bit set: a shadow or swap entry, no page
here), a node (low bits 10, above 4096), or a sibling (low bits 10, 0..62 above them:
the slot of a large folio's entry covering several indexes). A large folio's pages
follow its head page in the vmemmap, so an index's page is the head page plus its
distance from the first index the entry covers.

Everything read is checked before it is used: the tree's shifts go down by 6 a level
(so at most 11 levels, no cycle), and the folio found must name this address_space and
the first index its entry covers, else the page is taken as not cached (never a page of
another file). `file_page` raises MemoryFault for memory it needs; the caller reads it
and calls again (record/process_maps.py keeps the pages, so nothing is read twice).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.linux.maps import is_kernel, is_node
from qmpprof.memory import MemoryReader

PAGE_SIZE = 4096
#: XA_CHUNK_SHIFT (6 unless CONFIG_BASE_SMALL, which no 64-bit distribution kernel sets).
CHUNK_SHIFT = 6
CHUNK_SIZE = 1 << CHUNK_SHIFT
#: A 64-bit index needs at most 11 levels of 6 bits: the root's shift is at most 60.
MAX_SHIFT = 60
#: struct xa_node: `shift` (u8) at 0, `slots` at 40 (GDB's ptype/o, 6.1 and 6.12).
NODE_SHIFT = 0
NODE_SLOTS = 40
NODE_SPAN = NODE_SLOTS + 8 * CHUNK_SIZE
#: Page frame numbers of 52 physical address bits.
MAX_PFN = 1 << (52 - 12)
#: The largest struct page believed (64 bytes in every 64-bit kernel so far).
MAX_PAGE_STRUCT = 256
_VARIABLES = {"vmemmap_base", "page_offset_base"}
_STRUCTS = {"file", "address_space", "xarray", "folio", "page"}
#: sizeof(struct page) where no struct folio embeds one to tell (5.10's VMCOREINFO says
#: SIZE(page)=64, as every x86-64 kernel with a vmemmap has it).
PAGE_STRUCT_BEFORE_FOLIOS = 64

_MEMBERS = ("f_mapping", "i_pages", "xa_head", "mapping", "index", "page")


@dataclass(frozen=True)
class PageCacheLayout:
    """Offsets and link addresses the walk needs, from the vmlinux's DWARF and symbols."""

    f_mapping: int  # file.f_mapping
    pages_head: int  # address_space.i_pages.xa_head
    folio_mapping: int
    folio_index: int
    page_struct: int  # sizeof(struct page): folio.page's size
    #: The variables' link addresses (x86-64; 0 where the bases are LinearBases').
    vmemmap_base: int
    page_offset_base: int

    @classmethod
    def from_kernel(cls, types: KernelTypes, fixed: bool = False) -> PageCacheLayout | None:
        """`fixed`: the bases come from LinearBases, not variables."""
        layout = types.layout(set() if fixed else _VARIABLES, _STRUCTS, _MEMBERS)
        s, v = layout.structs, layout.variables
        try:
            if "folio" in s:
                entry, page_struct = s["folio"], s["folio"]["page"].size
            else:
                entry, page_struct = s["page"], PAGE_STRUCT_BEFORE_FOLIOS
            found = cls(
                s["file"]["f_mapping"].offset,
                s["address_space"]["i_pages"].offset + s["xarray"]["xa_head"].offset,
                entry["mapping"].offset,
                entry["index"].offset,
                page_struct or 0,
                0 if fixed else v["vmemmap_base"],
                0 if fixed else v["page_offset_base"],
            )
        except KeyError:
            return None
        fits = 0 < found.page_struct <= MAX_PAGE_STRUCT and found.folio_span <= MAX_PAGE_STRUCT
        return found if fits and max(found.f_mapping, found.pages_head) < PAGE_SIZE else None

    @property
    def folio_span(self) -> int:
        return max(self.folio_mapping, self.folio_index) + 8


@functools.lru_cache(maxsize=4)
def page_cache_layout(types: KernelTypes, fixed: bool = False) -> PageCacheLayout | None:
    """The layout in the vmlinux at `path`; None when it lacks a part (a kernel built
    without CONFIG_RANDOMIZE_MEMORY has no base variables)."""
    return PageCacheLayout.from_kernel(types, fixed)


@dataclass(frozen=True)
class MemoryBases:
    """Where this boot put the vmemmap array and the direct map: the struct page of
    page frame 0, and the address of physical address 0 (where they would be)."""

    vmemmap: int
    direct_map: int


@dataclass(frozen=True)
class LinearBases:
    """arm64's bases, which follow from VMCOREINFO's numbers (arch/arm64/include/asm/
    memory.h): the vmemmap starts at VMEMMAP_START with the page of PHYS_OFFSET, the
    linear map at PAGE_OFFSET with PHYS_OFFSET."""

    vmemmap_start: int
    page_offset: int
    phys_offset: int

    def bases(self, page_struct: int) -> MemoryBases:
        first = self.phys_offset // PAGE_SIZE * page_struct
        wrap = 1 << 64
        return MemoryBases(
            (self.vmemmap_start - first) % wrap, (self.page_offset - self.phys_offset) % wrap
        )


def memory_bases(memory: MemoryReader, layout: PageCacheLayout, slide: int) -> MemoryBases | None:
    """The two bases read from the guest (`slide`: the kernel's KASLR slide); None when
    they are not page-aligned kernel addresses."""
    vmemmap = memory.read_u64((layout.vmemmap_base + slide) % (1 << 64))
    direct_map = memory.read_u64((layout.page_offset_base + slide) % (1 << 64))
    usable = all(is_kernel(base) and base % PAGE_SIZE == 0 for base in (vmemmap, direct_map))
    return MemoryBases(vmemmap, direct_map) if usable else None


def file_page(
    memory: MemoryReader, layout: PageCacheLayout, bases: MemoryBases, file: int, index: int
) -> int | None:
    """The direct-map address of page `index` of the file open at `file` (a `struct
    file *`), None when the page cache does not hold it. Raises MemoryFault."""
    if not is_kernel(file + layout.f_mapping) or not 0 <= index < 1 << 64:
        return None
    mapping = memory.read_u64(file + layout.f_mapping)
    if not is_kernel(mapping + layout.pages_head):
        return None
    found = xarray_load(memory, memory.read_u64(mapping + layout.pages_head), index)
    if found is None:
        return None
    folio, first = found
    head = folio_pfn(folio, layout, bases)
    if head is None or not is_kernel(folio, layout.folio_span):
        return None
    data = memory.read(folio, layout.folio_span)
    owner = int.from_bytes(data[layout.folio_mapping : layout.folio_mapping + 8], "little")
    start = int.from_bytes(data[layout.folio_index : layout.folio_index + 8], "little")
    pfn = head + index - first
    if owner != mapping or start != first or pfn >= MAX_PFN:
        return None
    address = bases.direct_map + pfn * PAGE_SIZE
    return address if is_kernel(address, PAGE_SIZE) else None


def folio_pfn(folio: int, layout: PageCacheLayout, bases: MemoryBases) -> int | None:
    """The page frame number of the struct page at `folio`; None outside the vmemmap."""
    distance = folio - bases.vmemmap
    if distance < 0 or distance % layout.page_struct:
        return None
    pfn = distance // layout.page_struct
    return pfn if pfn < MAX_PFN else None


def xarray_load(memory: MemoryReader, head: int, index: int) -> tuple[int, int] | None:
    """The pointer entry for `index` in the xarray whose xa_head is `head`, with the
    first index that entry covers; None for no entry, a value entry or anything a well
    formed xarray does not hold. Raises MemoryFault."""
    if not is_node(head):
        return (head, 0) if index == 0 and is_pointer(head) else None
    entry, expected = head, None
    while is_node(entry):
        node = entry - 2
        if not is_kernel(node, NODE_SPAN):
            return None
        data = memory.read(node, NODE_SPAN)
        shift = data[NODE_SHIFT]
        if shift > MAX_SHIFT or shift % CHUNK_SHIFT or expected not in (None, shift):
            return None
        if expected is None and index >> shift >= CHUNK_SIZE:
            return None  # past what the root covers
        wanted = (index >> shift) % CHUNK_SIZE
        offset, entry = _slot(data, wanted)
        if is_node(entry) and (shift == 0 or offset != wanted):
            return None  # a node at the bottom, or a sibling of one: xas_descend's retry
        if not is_node(entry):
            first = index >> (shift + CHUNK_SHIFT) << (shift + CHUNK_SHIFT) | offset << shift
            return (entry, first) if is_pointer(entry) else None
        expected = shift - CHUNK_SHIFT
    return None


def _slot(data: bytes, offset: int) -> tuple[int, int]:
    """The slot at `offset` and its entry, a sibling's canonical slot followed (each
    sibling names a slot before its own: a chain of them ends)."""
    entry = _word(data, offset)
    while is_sibling(entry) and entry >> 2 < offset:
        offset = entry >> 2
        entry = _word(data, offset)
    return offset, entry


def _word(data: bytes, slot: int) -> int:
    at = NODE_SLOTS + 8 * slot
    return int.from_bytes(data[at : at + 8], "little")


def is_sibling(entry: int) -> bool:
    """xa_is_sibling: an internal entry below xa_mk_sibling(XA_CHUNK_SIZE - 1)."""
    return entry & 3 == 2 and entry >> 2 < CHUNK_SIZE - 1


def is_pointer(entry: int) -> bool:
    """An entry that is a kernel pointer (a folio): not NULL, a value or internal entry."""
    return entry & 3 == 0 and is_kernel(entry)
