"""Virtual-to-physical translation by walking a guest's page tables (pure).

Given something that reads guest *physical* memory and one vCPU's paging registers
(x86: CR0, CR3, CR4, EFER; AArch64: TTBR0_EL1, TTBR1_EL1, TCR_EL1), `VirtualMemory`
reads guest *virtual* memory as that vCPU sees it. x86 modes: paging disabled
(identity), 32-bit (4 KiB pages, 4 MiB with CR4.PSE), PAE (4 KiB and 2 MiB pages) and
long mode with 4- or 5-level tables (CR4.LA57; 4 KiB, 2 MiB and 1 GiB pages). AArch64:
the 4 KiB granule with 48-bit addresses (4 levels; 4 KiB pages, 2 MiB and 1 GiB
blocks), the lower half from TTBR0's table and the upper half from TTBR1's; other
granules and address sizes are refused (`UnsupportedPaging`). The page tables are guest
memory, hence hostile input: a walk has a fixed number of levels, every read may fault,
reserved bits are masked away.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from qmpprof.defaults import PAGE_SHIFT, PAGE_SIZE
from qmpprof.errors import MemoryFault
from qmpprof.model import RegisterSet

_PAGE_OFFSET = PAGE_SIZE - 1
_ADDRESS_SPACE_END = 1 << 64
#: The most bytes one read may ask for: callers read stacks and structs, not gigabytes,
#: and a bound keeps a bogus size taken from guest memory from looping for minutes.
MAX_READ_BYTES = 1 << 24
#: Translations kept per instance before the cache starts over (a tick needs a few).
CACHE_LIMIT = 4096
#: A page the cache knows to be unmapped (or unreadable) at this moment: a sample's reads
#: meet the same guard page or hole more than once, and each would walk to it again.
_UNMAPPED = (-1, 0)
#: Page-table pages kept before that cache starts over (a tick needs a few dozen).
TABLE_PAGES_LIMIT = 256
#: Page-table entries kept before that cache starts over.
TABLE_ENTRIES_LIMIT = 16384

_CR0_PG = 1 << 31
_CR4_PSE = 1 << 4
_CR4_PAE = 1 << 5
_CR4_LA57 = 1 << 12
_EFER_LME = 1 << 8
_EFER_LMA = 1 << 10

_PRESENT = 1 << 0
_LARGE = 1 << 7  # PS: this entry maps a page instead of pointing to a table
#: Physical address bits 12..51 of an entry (drops flags, PAT, protection keys and NX).
_ADDRESS_MASK = 0x000F_FFFF_FFFF_F000
_FRAME_2M = _ADDRESS_MASK & ~((1 << 21) - 1)
_FRAME_1G = _ADDRESS_MASK & ~((1 << 30) - 1)
_FRAME_4M = 0xFFC0_0000
_PSE36_BITS = 0x001F_E000  # a 4 MiB PDE's bits 13..20 are physical bits 32..39

_U64 = struct.Struct("<Q")
#: One page-table entry, by its size.
_ENTRIES = {8: _U64, 4: struct.Struct("<I")}


class PhysicalReader(Protocol):
    """Reads guest physical memory. Raises MemoryFault (with the address) on failure."""

    def read_physical(self, address: int, size: int) -> bytes: ...


class WordReader(PhysicalReader, Protocol):
    """A PhysicalReader whose small reads cost no system call (a mapped file): a walk
    reads each table entry it needs instead of the entry's whole table page."""

    def read_word(self, address: int, size: int) -> int:
        """The little-endian `size`-byte word at physical `address`. Raises MemoryFault."""
        ...


class PagingMode(Enum):
    """How a vCPU translates virtual addresses: x86's from CR0.PG, CR4.PAE/LA57 and
    EFER.LMA; AArch64's 4 KiB granule with 48-bit or (LPA2) 52-bit addresses."""

    DISABLED = "disabled"
    LEGACY = "32-bit"
    PAE = "pae"
    LONG4 = "4-level"
    LONG5 = "5-level"
    AARCH64_4K_48 = "aarch64-4k-48"
    #: FEAT_LPA2's 52-bit addresses with the 4 KiB granule (TCR_EL1.DS): a fifth level.
    AARCH64_4K_52 = "aarch64-4k-52"


class UnsupportedPaging(Exception):
    """The vCPU translates in a way this module does not walk (one line, why)."""


@dataclass(frozen=True, slots=True)
class EntryFormat:
    """What a table entry's bits say, per architecture."""

    #: Present (x86 P; AArch64 valid).
    valid: int
    #: A large page (block) where `entry & large_mask == large_value`: x86's PS set,
    #: AArch64's bit 1 clear.
    large_mask: int
    large_value: int
    #: A last-level entry maps a page where it has all of these bits.
    leaf_mask: int
    #: The next table's or the page's physical address.
    address_mask: int
    #: A large entry at a level without large pages faults (AArch64: an invalid block
    #: descriptor); else it is a table (x86 ignores PS there).
    large_elsewhere_faults: bool


_X86_ENTRIES = EntryFormat(_PRESENT, _LARGE, _LARGE, _PRESENT, _ADDRESS_MASK, False)


@dataclass(frozen=True, slots=True)
class PagingState:
    """The registers that decide one vCPU's address translation."""

    cr0: int
    cr3: int
    cr4: int
    efer: int

    @classmethod
    def from_registers(cls, registers: RegisterSet) -> PagingState:
        return cls(registers.cr0, registers.cr3, registers.cr4, registers.efer)

    @property
    def mode(self) -> PagingMode:
        if not self.cr0 & _CR0_PG:
            return PagingMode.DISABLED
        if not self.cr4 & _CR4_PAE:
            return PagingMode.LEGACY
        if self.efer & (_EFER_LMA | _EFER_LME):  # LME with PG and PAE on implies LMA
            return PagingMode.LONG5 if self.cr4 & _CR4_LA57 else PagingMode.LONG4
        return PagingMode.PAE

    @property
    def root(self) -> int:
        """The physical address of the top-level table CR3 points at (flags, PCID and
        reserved bits dropped)."""
        return _root(self, self.mode)

    @property
    def entries(self) -> EntryFormat:
        return _X86_ENTRIES


@dataclass(frozen=True, slots=True)
class Aarch64PagingState:
    """The registers that decide an AArch64 vCPU's EL1&0 translation. TCR_EL1 0: not
    known, taken as Linux's usual 4 KiB granule with 48-bit addresses in both halves.
    TTBR0_EL1 None: not known, and nothing of the lower half is read."""

    ttbr0: int | None
    ttbr1: int
    tcr: int = 0

    @property
    def mode(self) -> PagingMode:
        """Raises UnsupportedPaging for a granule or address size not walked here."""
        if not self.tcr:
            return PagingMode.AARCH64_4K_48
        t0sz, t1sz = self.tcr & 0x3F, (self.tcr >> 16) & 0x3F
        tg0, tg1 = (self.tcr >> 14) & 3, (self.tcr >> 30) & 3
        lpa2 = bool(self.tcr >> _TCR_DS & 1)
        if tg0 == _TG0_4K and tg1 == _TG1_4K:
            if (t0sz, t1sz) == (16, 16):
                return PagingMode.AARCH64_4K_48
            if (t0sz, t1sz) == (12, 12) and lpa2:
                return PagingMode.AARCH64_4K_52
        raise UnsupportedPaging(
            f"AArch64 translation with T0SZ={t0sz} T1SZ={t1sz} TG0={tg0} TG1={tg1} DS={lpa2:d}:"
            " only the 4 KiB granule with 48-bit or (LPA2) 52-bit addresses is walked"
        )

    @property
    def root(self) -> int:
        return (self.ttbr0 or 0) & _A64_ROOT_ADDRESS

    @property
    def upper_root(self) -> int:
        return self.ttbr1 & _A64_ROOT_ADDRESS

    @property
    def entries(self) -> EntryFormat:
        return _A64_ENTRIES


_TG0_4K, _TG1_4K = 0, 2
#: TCR_EL1.DS: LPA2's 52-bit addresses with the 4 KiB granule.
_TCR_DS = 59
#: A table's address in TTBRn_EL1 (the ASID above, CnP below) and in a descriptor
#: (bits 47..12; above them the upper attributes: GP, DBM, contiguous, PXN, UXN).
_A64_TABLE_ADDRESS = 0x0000_FFFF_FFFF_F000
#: A top-level table's address in TTBRn_EL1: LPA2's level -1 table has 16 entries, 64-byte
#: aligned (Linux allocates its user ones from a cache: 0x442b9e80); bits 5..2 hold
#: address bits 51..48 there (not read: tables lie below 2^48 here), bit 0 CnP.
_A64_ROOT_ADDRESS = 0x0000_FFFF_FFFF_FFC0
_A64_BLOCK_1G = _A64_TABLE_ADDRESS & ~((1 << 30) - 1)
_A64_BLOCK_2M = _A64_TABLE_ADDRESS & ~((1 << 21) - 1)
#: Descriptor bits: 0 valid; 1, above the last level, a table (1) or a block (0); at the
#: last level a page must have it set.
_A64_VALID = 1 << 0
_A64_TABLE = 1 << 1

_A64_ENTRIES = EntryFormat(
    _A64_VALID, _A64_TABLE, 0, _A64_VALID | _A64_TABLE, _A64_TABLE_ADDRESS, True
)

#: One table level: (index shift, entries - 1, entry bytes, large-page frame mask or 0
#: where the PS bit does not make a large page).
_Level = tuple[int, int, int, int]
_LONG_LOWER: tuple[_Level, ...] = (
    (39, 511, 8, 0),
    (30, 511, 8, _FRAME_1G),
    (21, 511, 8, _FRAME_2M),
    (12, 511, 8, 0),
)


_AARCH64_LEVELS: tuple[_Level, ...] = (
    (39, 511, 8, 0),
    (30, 511, 8, _A64_BLOCK_1G),
    (21, 511, 8, _A64_BLOCK_2M),
    (12, 511, 8, 0),
)


#: LPA2's level -1: 16 entries for address bits 51..48 (its tables lie below 2^48 here:
#: the descriptors' address bits 51..50, in bits 9..8, are not read).
_AARCH64_LEVELS_52 = ((48, 15, 8, 0), *_AARCH64_LEVELS)


def _levels(state: PagingState | Aarch64PagingState, mode: PagingMode) -> tuple[_Level, ...]:
    if mode is PagingMode.AARCH64_4K_48:
        return _AARCH64_LEVELS
    if mode is PagingMode.AARCH64_4K_52:
        return _AARCH64_LEVELS_52
    assert isinstance(state, PagingState)
    if mode is PagingMode.LONG5:
        return ((48, 511, 8, 0), *_LONG_LOWER)
    if mode is PagingMode.LONG4:
        return _LONG_LOWER
    if mode is PagingMode.PAE:
        return ((30, 3, 8, 0), (21, 511, 8, _FRAME_2M), (12, 511, 8, 0))
    if mode is PagingMode.LEGACY:
        large = _FRAME_4M if state.cr4 & _CR4_PSE else 0
        return ((22, 1023, 4, large), (12, 1023, 4, 0))
    return ()


@functools.cache
def _steps(levels: tuple[_Level, ...]) -> tuple[_Level, ...]:
    """Per level: (index shift, the shift and mask that give the entry's byte offset in
    its table, large-page frame mask or 0), for the walk's inner loop."""
    return tuple(
        (shift, shift - size.bit_length() + 1, mask * size, large)
        for shift, mask, size, large in levels
    )


def _root(state: PagingState | Aarch64PagingState, mode: PagingMode) -> int:
    if isinstance(state, Aarch64PagingState):
        return state.root
    if mode is PagingMode.PAE:
        return state.cr3 & 0xFFFF_FFE0  # the PDPT is 32-byte aligned, below 4 GiB
    if mode is PagingMode.LEGACY:
        return state.cr3 & 0xFFFF_F000
    return state.cr3 & _ADDRESS_MASK  # long mode: bits 0..11 may hold a PCID


#: The upper half of a 32-bit address space.
_UPPER_HALF_32 = 1 << 31


def _address_limits(mode: PagingMode) -> tuple[int, int]:
    """(end of the low half, start of the high half) of the addresses a vCPU can form.

    Outside long mode linear addresses have 32 bits; QEMU's debug translation
    (gva2gpa, memsave) truncates a longer one (or, with paging off, keeps 52 bits of
    it) instead of failing. We fault: such an address came from a confused caller.
    """
    if mode is PagingMode.LONG4:
        return 1 << 47, _ADDRESS_SPACE_END - (1 << 47)
    if mode is PagingMode.AARCH64_4K_48:
        return 1 << 48, _ADDRESS_SPACE_END - (1 << 48)
    if mode is PagingMode.AARCH64_4K_52:
        return 1 << 52, _ADDRESS_SPACE_END - (1 << 52)
    if mode is PagingMode.LONG5:
        return 1 << 56, _ADDRESS_SPACE_END - (1 << 56)
    return 1 << 32, _ADDRESS_SPACE_END


class TableCache:
    """Page-table pages and entries read at one moment, by physical address: what every
    vCPU's walker of that moment shares (the kernel's half of every address space is
    mapped by the same tables). Bounded: it starts over when full."""

    def __init__(self) -> None:
        #: Whole table pages: a walk reads one of them once, not an entry at a time
        #: (each read of guest RAM may be a system call).
        self.pages: dict[int, bytes] = {}
        #: Entries by physical address and size (8 bytes, or 4 for 32-bit paging), as a
        #: CPU's paging-structure caches keep them: neighbouring pages share all but
        #: their last levels.
        self.entries: dict[int, dict[int, int]] = {8: {}, 4: {}}

    def clear(self) -> None:
        self.pages.clear()
        for entries in self.entries.values():
            entries.clear()


class VirtualMemory:
    """A MemoryReader over one vCPU's virtual addresses, translated through its page
    tables with a cache of page → frame translations.

    The cache holds what the guest's tables said when first asked: make a new instance
    (or call `flush()`) whenever the guest may have run since. Every read raises
    MemoryFault with the virtual address for an unmapped page, a non-canonical
    address, or physical memory the reader cannot read.
    """

    def __init__(
        self,
        physical: PhysicalReader,
        state: PagingState | Aarch64PagingState,
        tables: TableCache | None = None,
        upper_root: int | None = None,
    ) -> None:
        """`tables`: the page tables read so far, to share with the other vCPUs' readers
        of the same moment. `upper_root`: a second top-level table to
        walk an upper-half address from when the vCPU's own does not map it (a kernel
        that isolates its page tables runs user code on one that maps little of it).
        Raises UnsupportedPaging."""
        self.physical = physical
        self.state = state
        self._read = physical.read_physical
        #: Where a table entry is read alone (WordReader), else None: its page, whole.
        self._read_word = getattr(physical, "read_word", None)
        mode = state.mode
        self._levels = _levels(state, mode)
        self._root = _root(state, mode)
        self._upper_root = upper_root if mode is not PagingMode.DISABLED else None
        self._format = state.entries
        self._address_mask = self._format.address_mask
        #: AArch64's upper half has a table of its own (TTBR1), walked alone.
        self._high_root: int | None = None
        self._low_end, self._high_start = _address_limits(mode)
        if isinstance(state, Aarch64PagingState):
            self._high_root, self._upper_root = state.upper_root, None
            if state.ttbr0 is None:
                self._low_end = 0  # the lower half's table is not known: all of it faults
        #: Where `upper_root` may answer: the upper half (32-bit: from 2 GiB up, where a
        #: 3G/1G or 2G/2G kernel lies).
        self._upper_start = min(self._high_start, _UPPER_HALF_32)
        self._cache: dict[int, tuple[int, int]] = {}  # virtual page number → _page()
        self._tables = TableCache() if tables is None else tables
        self._entry_size = self._levels[0][2] if self._levels else 8
        self._entries = self._tables.entries[self._entry_size]
        steps = _steps(self._levels)
        #: The levels above the last, walked from the top; the last one, walked from
        #: the table `_leaf_tables` may remember (a stack's pages share it).
        self._upper_steps, self._last_step = steps[:-1], steps[-1] if steps else (0, 0, 0, 0)
        #: The leaf-level tables found from the vCPU's own root, by the region (2 MiB,
        #: 4 MiB with 32-bit paging) of addresses each one maps.
        self._leaf_tables: dict[int, int] = {}
        self._region_shift = steps[-2][0] if len(steps) > 1 else 64

    @classmethod
    def from_registers(cls, physical: PhysicalReader, registers: RegisterSet) -> VirtualMemory:
        return cls(physical, PagingState.from_registers(registers))

    def flush(self) -> None:
        """Forget every cached translation (the guest may have changed its tables)."""
        self._cache.clear()
        self._leaf_tables.clear()
        self._tables.clear()

    def translate(self, address: int) -> int:
        """The physical address `address` maps to. Raises MemoryFault."""
        return self._frame(address, 1) | (address & _PAGE_OFFSET)

    def read_u64(self, address: int) -> int:
        """One little-endian 64-bit word (the unwinder's hot path). Raises MemoryFault."""
        offset = address & _PAGE_OFFSET
        if offset > PAGE_SIZE - 8:  # straddles two pages
            value: int = _U64.unpack(self.read(address, 8))[0]
            return value
        data = self._read_physical(self._frame(address, 8) | offset, 8, address)
        value = _U64.unpack(data)[0]
        return value

    def read(self, address: int, size: int) -> bytes:
        """Exactly `size` bytes from `address`, page by page. Raises MemoryFault."""
        self._check_size(address, size)
        if size == 0:
            return b""
        if (address & _PAGE_OFFSET) + size <= PAGE_SIZE:  # the common case: one page
            return self._read_in_page(address, size)
        return b"".join(self._read_in_page(a, n) for a, n in _pieces(address, size))

    def read_prefix(self, address: int, size: int) -> bytes:
        """The readable bytes from `address` up to the first unreadable page, at most
        `size`; b"" when `address` itself cannot be read. Never raises MemoryFault.

        The sampler's stack read, every tick: pages that lie side by side in physical
        memory (a large page, or neighbouring frames) are read in one piece.
        """
        size = max(0, min(size, MAX_READ_BYTES, _ADDRESS_SPACE_END - max(address, 0)))
        if 0 < size <= PAGE_SIZE - (address & _PAGE_OFFSET):  # one page: all of it or none
            try:
                return self._read_in_page(address, size)
            except MemoryFault:
                return b""
        parts = []
        for virtual, physical, length in self._runs(address, size):
            data = self._readable_prefix(virtual, physical, length)
            parts.append(data)
            if len(data) < length:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _runs(self, address: int, size: int) -> Iterator[tuple[int, int, int]]:
        """(virtual, physical, length): [address, address + size) in physically
        contiguous runs, up to the first page that is not mapped."""
        end = address + size
        run: tuple[int, int, int] | None = None
        while address < end:  # at most one turn per page of a bounded size
            try:
                frame, mapped = self._page(address, end - address)
            except MemoryFault:
                break
            offset = address & _PAGE_OFFSET
            length = min(mapped - offset, end - address)
            if run is not None and run[1] + run[2] == frame | offset:
                run = (run[0], run[1], run[2] + length)
            else:
                if run is not None:
                    yield run
                run = (address, frame | offset, length)
            address += length
        if run is not None:
            yield run

    def _readable_prefix(self, virtual: int, physical: int, length: int) -> bytes:
        """A run's bytes; where the physical reader fails part way, those of its pages
        before the first one it cannot read."""
        try:
            return self._read_physical(physical, length, virtual)
        except MemoryFault:
            pass
        parts = []
        for piece_address, piece_size in _pieces(virtual, length):
            try:
                parts.append(
                    self._read_physical(
                        physical + piece_address - virtual, piece_size, piece_address
                    )
                )
            except MemoryFault:
                break
        return b"".join(parts)

    def _check_size(self, address: int, size: int) -> None:
        if not 0 <= size <= MAX_READ_BYTES or address + size > _ADDRESS_SPACE_END:
            raise MemoryFault(address, max(size, 1))

    def _read_in_page(self, address: int, size: int) -> bytes:
        frame = self._frame(address, size)
        return self._read_physical(frame | (address & _PAGE_OFFSET), size, address)

    def _read_physical(self, physical: int, size: int, address: int) -> bytes:
        """Guest physical bytes; a fault names the virtual address that led there."""
        try:
            data = self._read(physical, size)
        except MemoryFault as err:
            raise MemoryFault(address, size) from err
        if len(data) != size:  # a reader that cut the read short is a fault, not data
            raise MemoryFault(address, size)
        return data

    def _frame(self, address: int, size: int) -> int:
        """The physical address of the page holding `address`, from the cache or a walk."""
        return self._page(address, size)[0]

    def _page(self, address: int, size: int) -> tuple[int, int]:
        """(physical address of the 4 KiB page holding `address`, bytes its table entry
        maps contiguously from that page on: 4 KiB, or the rest of a large page)."""
        page = address >> PAGE_SHIFT
        known = self._cache.get(page)
        if known is None:
            if len(self._cache) >= CACHE_LIMIT:
                self.flush()
            try:
                known = self._walk(address, size)
            except MemoryFault:
                self._cache[page] = _UNMAPPED
                raise
            self._cache[page] = known
        if known is _UNMAPPED:
            raise MemoryFault(address, size)
        return known

    def _walk(self, address: int, size: int) -> tuple[int, int]:
        if not (0 <= address < self._low_end or self._high_start <= address < _ADDRESS_SPACE_END):
            raise MemoryFault(address, size)  # non-canonical, or beyond 32 bits
        if not self._levels:
            return address & ~_PAGE_OFFSET, PAGE_SIZE
        if self._high_root is not None and address >= self._high_start:
            try:
                return self._walk_tables(address, self._high_root, size)
            except MemoryFault as err:
                raise MemoryFault(address, size) from err
        try:
            return self._walk_tables(address, self._root, size)
        except MemoryFault as err:  # name the virtual address, as for a not-present entry
            if self._upper_root is None or address < self._upper_start:
                raise MemoryFault(address, size) from err
        try:
            return self._walk_tables(address, self._upper_root, size)
        except MemoryFault as err:
            raise MemoryFault(address, size) from err

    def _walk_tables(self, address: int, root: int, size: int) -> tuple[int, int]:
        """(frame, bytes mapped from it) in at most five table reads; raises MemoryFault
        for any unreadable or not-present entry (with whichever address: `_walk`
        renames it). From the vCPU's own root, a leaf table found before is read
        again directly: the pages of a stack share theirs."""
        own = root == self._root
        if own:
            table = self._leaf_tables.get(address >> self._region_shift)
            if table is not None:
                return self._leaf(address, table, size)
        table = root
        entries = self._entries
        entry_format = self._format
        valid, large_mask, large_value = (
            entry_format.valid,
            entry_format.large_mask,
            entry_format.large_value,
        )
        for shift, offset_shift, offset_mask, large_frame in self._upper_steps:
            entry_address = table + ((address >> offset_shift) & offset_mask)
            entry = entries.get(entry_address)
            if entry is None:
                entry = self._read_entry(entry_address)
            if not entry & valid:
                raise MemoryFault(address)
            if entry & large_mask == large_value:
                if not large_frame:  # x86 ignores PS there; AArch64 has no block there
                    if entry_format.large_elsewhere_faults:
                        raise MemoryFault(address)
                    table = entry & self._address_mask
                    continue
                offset = address & ((1 << shift) - 1) & ~_PAGE_OFFSET
                frame = _large_page(entry, self._entry_size, large_frame)
                return frame | offset, (1 << shift) - offset
            table = entry & self._address_mask
        if own:
            if len(self._leaf_tables) >= CACHE_LIMIT:
                self._leaf_tables.clear()
            self._leaf_tables[address >> self._region_shift] = table
        return self._leaf(address, table, size)

    def _leaf(self, address: int, table: int, size: int) -> tuple[int, int]:
        """The last level's step of a walk: the 4 KiB frame the entry in `table` maps.
        A read of `size` bytes that goes on into the next pages reads their entries
        too, in one piece, and keeps the pages they map (a stack's window)."""
        _, offset_shift, offset_mask, _ = self._last_step
        offset = (address >> offset_shift) & offset_mask
        entry_size = self._entry_size
        more = min(
            ((address & _PAGE_OFFSET) + size - 1) >> PAGE_SHIFT,
            (offset_mask - offset) // entry_size,
            CACHE_LIMIT - len(self._cache),
        )
        if more > 0 and self._read_word is not None:
            data = self._read(table + offset, (more + 1) * entry_size)
            if len(data) != (more + 1) * entry_size:
                raise MemoryFault(address)
            entries = _ENTRIES[entry_size].iter_unpack(data)
            entry = next(entries)[0]
            if entry & self._format.leaf_mask != self._format.leaf_mask:
                raise MemoryFault(address)
            self._keep_pages((address >> PAGE_SHIFT) + 1, (e for (e,) in entries))
            return entry & self._address_mask, PAGE_SIZE
        entry_address = table + offset
        entry = self._entries.get(entry_address)
        if entry is None:
            entry = self._read_entry(entry_address)
        if entry & self._format.leaf_mask != self._format.leaf_mask:
            raise MemoryFault(address)
        return entry & self._address_mask, PAGE_SIZE

    def _keep_pages(self, page: int, entries: Iterator[int]) -> None:
        """The frames of the pages from `page` on, as long as their `entries` map one."""
        cache, leaf, address_mask = self._cache, self._format.leaf_mask, self._address_mask
        for entry in entries:
            if entry & leaf != leaf:
                if self._upper_root is None:  # else another root may map it (_walk)
                    cache[page] = _UNMAPPED  # where a stack's read stops: not walked again
                return
            cache[page] = (entry & address_mask, PAGE_SIZE)
            page += 1

    def _read_entry(self, entry_address: int) -> int:
        """The entry at `entry_address`, alone from a WordReader, else from its table
        page (read whole once); kept."""
        if len(self._entries) >= TABLE_ENTRIES_LIMIT:
            self._entries.clear()
        if self._read_word is not None:
            entry: int = self._read_word(entry_address, self._entry_size)
        else:
            entry = self._entry_from_page(entry_address)
        self._entries[entry_address] = entry
        return entry

    def _entry_from_page(self, entry_address: int) -> int:
        page = entry_address & ~_PAGE_OFFSET
        pages = self._tables.pages
        table = pages.get(page)
        if table is None:
            table = self._read(page, PAGE_SIZE)
            if len(table) != PAGE_SIZE:
                raise MemoryFault(entry_address, self._entry_size)
            if len(pages) >= TABLE_PAGES_LIMIT:
                pages.clear()
            pages[page] = table
        offset = entry_address & _PAGE_OFFSET
        return int.from_bytes(table[offset : offset + self._entry_size], "little")


def _large_page(entry: int, entry_size: int, frame_mask: int) -> int:
    """The physical base of a large page: a 32-bit 4 MiB page keeps physical bits
    32..39 in entry bits 13..20 (PSE-36); the other sizes are plain masks."""
    if entry_size == 4:
        return (entry & frame_mask) | ((entry & _PSE36_BITS) << 19)
    return entry & frame_mask


def _pieces(address: int, size: int) -> list[tuple[int, int]]:
    """(address, size) pieces of a read, each within one page."""
    pieces = []
    end = address + size
    while address < end:
        piece_end = min(end, (address | _PAGE_OFFSET) + 1)
        pieces.append((address, piece_end - address))
        address = piece_end
    return pieces
