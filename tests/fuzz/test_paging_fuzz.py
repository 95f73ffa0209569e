"""Hostile page tables: random guest physical memory and random paging registers.
Every read returns exactly the bytes asked for or raises MemoryFault; read_prefix never
raises; nothing allocates by a size taken from the guest. A 32-bit vCPU's modes (2-level
32-bit paging with 4 KiB and 4 MiB pages, PAE) and AArch64's 4 KiB granule with
48-bit addresses are also checked against a walk written from the manual (Intel SDM
volume 3 chapter 4; Arm ARM D8, VMSAv8-64 descriptors), translation for translation."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.defaults import PAGE_SIZE
from qmpprof.errors import MemoryFault
from qmpprof.target.paging import (
    MAX_READ_BYTES,
    Aarch64PagingState,
    PagingMode,
    PagingState,
    TableCache,
    UnsupportedPaging,
    VirtualMemory,
)
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


def outcome(read: Callable[..., object], *arguments: int) -> object:
    try:
        return read(*arguments)
    except MemoryFault:
        return "fault"


@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_a_word_reader_walks_as_a_page_reader_does(seed: int) -> None:
    """Entries read alone, and a window's leaf entries in one piece (a mapped RAM file),
    translate every page as whole table pages read once do."""
    rng = random.Random(seed)
    state = random_state(rng)
    pages = VirtualMemory(RandomRam(seed), state)
    words = VirtualMemory(WordRandomRam(seed), state)
    for _ in range(8):
        address, size = random_address(rng), random_size(rng)
        for read in ("read_prefix", "read"):
            wanted = outcome(getattr(pages, read), address, size)
            assert outcome(getattr(words, read), address, size) == wanted
        for page in range(4):  # those the window's read may have kept
            at = address + page * PAGE_SIZE
            assert outcome(words.translate, at) == outcome(pages.translate, at)


# -- 32-bit paging (2 levels of 4-byte entries, 4 MiB pages with CR4.PSE) and PAE -------
#
# Tables drawn at random, each translation checked against a walk written here from the
# SDM (volume 3, 4.3 and 4.4): the same answer, or a fault for both. Reserved bits are
# masked away, as qmpprof does (paging.py), rather than faulting as a CPU would.

_CR0_PG = 1 << 31
_CR4_PSE = 1 << 4
_CR4_PAE = 1 << 5
_PAE_FRAME = 0x000F_FFFF_FFFF_F000


class RandomRam32(RandomRam):
    """RandomRam whose page-table pages hold 4-byte entries: a 4 KiB frame in (or just
    past) the memory or, with PS set, a 4 MiB page, sometimes above 4 GiB (PSE-36)."""

    def _page(self, page: int) -> bytes:
        if page not in self.pages:
            rng = random.Random(f"{self.seed}:32:{page}")
            data = rng.randbytes(PAGE_SIZE)
            if rng.random() < 0.7:
                data = _entries32(struct.unpack(f"<{PAGE_SIZE // 4}I", data))
            self.pages[page] = data
        return self.pages[page]


def _entries32(words: tuple[int, ...]) -> bytes:
    entries = []
    for word in words:
        entry = (word % (PAGES + 2)) << 12 | _FLAGS[word >> 29]
        if word >> 27 & 3 == 3:  # PSE-36: physical bits 32..39 of a 4 MiB page
            entry |= (word >> 8 & 0xFF) << 13
        if word >> 25 & 3 == 3:  # a 4 MiB frame above the first
            entry |= (word >> 12 & 0x3FF) << 22
        entries.append(entry & 0xFFFF_FFFF)
    return struct.pack(f"<{len(entries)}I", *entries)


class WordReads(RandomRam):
    """Also reads single words (paging.WordReader, as a mapped RAM file does): the
    walker then reads entries alone, and a window's leaf entries in one piece."""

    def read_word(self, address: int, size: int) -> int:
        return int.from_bytes(self.read_physical(address, size), "little")


class WordRandomRam(WordReads, RandomRam):
    pass


class WordRandomRam32(WordReads, RandomRam32):
    pass


def _entry(ram: RandomRam, address: int, size: int) -> int | None:
    """The present entry of `size` bytes at physical `address`; None if not present or
    not in memory."""
    try:
        entry = int.from_bytes(ram.read_physical(address, size), "little")
    except MemoryFault:
        return None
    return entry if entry & 1 else None


def reference_legacy(ram: RandomRam, state: PagingState, address: int) -> int | None:
    """32-bit paging: CR3 -> page directory -> page table (or a 4 MiB page)."""
    if not 0 <= address < 1 << 32:
        return None
    pde = _entry(ram, (state.cr3 & 0xFFFF_F000) + (address >> 22) * 4, 4)
    if pde is None:
        return None
    if state.cr4 & _CR4_PSE and pde & 0x80:
        base = (pde & 0xFFC0_0000) | (pde >> 13 & 0xFF) << 32
        return base | (address & 0x3F_FFFF)
    pte = _entry(ram, (pde & 0xFFFF_F000) + (address >> 12 & 0x3FF) * 4, 4)
    return None if pte is None else (pte & 0xFFFF_F000) | (address & 0xFFF)


def reference_pae(ram: RandomRam, state: PagingState, address: int) -> int | None:
    """PAE: CR3 -> 4-entry PDPT -> page directory (or a 2 MiB page) -> page table."""
    if not 0 <= address < 1 << 32:
        return None
    pdpte = _entry(ram, (state.cr3 & 0xFFFF_FFE0) + (address >> 30) * 8, 8)
    if pdpte is None:
        return None
    pde = _entry(ram, (pdpte & _PAE_FRAME) + (address >> 21 & 0x1FF) * 8, 8)
    if pde is None:
        return None
    if pde & 0x80:
        return (pde & 0x000F_FFFF_FFE0_0000) | (address & 0x1F_FFFF)
    pte = _entry(ram, (pde & _PAE_FRAME) + (address >> 12 & 0x1FF) * 8, 8)
    return None if pte is None else (pte & _PAE_FRAME) | (address & 0xFFF)


def address32(rng: random.Random) -> int:
    return rng.choice(
        [
            rng.getrandbits(32),
            rng.randrange(PAGES * PAGE_SIZE),
            rng.randrange(1 << 10) << 22 | rng.randrange(PAGES * PAGE_SIZE),
            (1 << 32) - rng.randrange(1, 3 * PAGE_SIZE),
            (1 << 32) + rng.randrange(1 << 20),  # no 32-bit vCPU forms this
        ]
    )


def check_against(
    memory: VirtualMemory,
    ram: RandomRam,
    reference: Callable[[RandomRam, Any, int], int | None],
    address: int,
) -> None:
    expected = reference(ram, memory.state, address)
    try:
        physical: int | None = memory.translate(address)
    except MemoryFault:
        physical = None
    assert physical == expected, f"{address:#x}: {physical!r} != {expected!r}"
    if expected is None:
        return
    size = min(8, PAGE_SIZE - (address & (PAGE_SIZE - 1)))
    try:
        wanted = ram.read_physical(expected, size)
    except MemoryFault:
        with pytest.raises(MemoryFault):
            memory.read(address, size)
        return
    assert memory.read(address, size) == wanted
    if size == 8:
        assert memory.read_u64(address) == int.from_bytes(wanted, "little")


@pytest.mark.parametrize("reads", [RandomRam32, WordRandomRam32])
@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_32_bit_paging_translates_as_the_manual_says(reads: type[RandomRam], seed: int) -> None:
    rng = random.Random(seed)
    ram = reads(seed)
    cr4 = rng.choice([0, _CR4_PSE])
    cr3 = rng.randrange(PAGES) * PAGE_SIZE | rng.choice([0, 0x18])  # PWT/PCD ignored
    state = PagingState(_CR0_PG | 1, cr3, cr4, 0)
    assert state.mode is PagingMode.LEGACY
    memory = VirtualMemory(ram, state)
    for _ in range(16):
        check_against(memory, ram, reference_legacy, address32(rng))


@pytest.mark.parametrize("reads", [RandomRam, WordRandomRam])
@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_pae_paging_translates_as_the_manual_says(reads: type[RandomRam], seed: int) -> None:
    rng = random.Random(seed)
    ram = reads(seed)
    cr3 = rng.randrange(PAGES) * PAGE_SIZE + rng.randrange(PAGE_SIZE // 32) * 32
    cr4 = _CR4_PAE | rng.choice([0, _CR4_PSE])  # PSE changes nothing under PAE
    state = PagingState(_CR0_PG | 1, cr3, cr4, rng.choice([0, 1 << 11]))  # NXE alone
    assert state.mode is PagingMode.PAE
    memory = VirtualMemory(ram, state)
    for _ in range(16):
        check_against(memory, ram, reference_pae, address32(rng))


@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_32_bit_and_pae_walkers_sharing_tables_keep_their_entries_apart(seed: int) -> None:
    """Two vCPUs of one moment, one in each mode, share a TableCache over the same
    memory: a 4-byte entry read by one never answers the other's 8-byte read."""
    rng = random.Random(seed)
    ram = RandomRam32(seed)
    tables = TableCache()
    root = rng.randrange(PAGES) * PAGE_SIZE
    legacy = VirtualMemory(ram, PagingState(_CR0_PG | 1, root, _CR4_PSE, 0), tables)
    pae = VirtualMemory(ram, PagingState(_CR0_PG | 1, root, _CR4_PAE, 0), tables)
    for _ in range(16):
        address = address32(rng)
        check_against(legacy, ram, reference_legacy, address)
        check_against(pae, ram, reference_pae, address)


class RandomRamA64(RandomRam):
    """RandomRam whose entries are AArch64 descriptors: invalid, block (bit 1 clear) or
    table/page (bit 1 set), with attributes above bit 47 that are no address."""

    def _page(self, page: int) -> bytes:
        if page not in self.pages:
            rng = random.Random(f"a64:{self.seed}:{page}")
            words = struct.unpack(f"<{PAGE_SIZE // 8}Q", rng.randbytes(PAGE_SIZE))
            entries = [
                (word % (PAGES + 2)) << 12 | (0x3, 0x3, 0x1, 0x0)[word >> 62] | (word & 0x7FF) << 53
                for word in words
            ]
            self.pages[page] = struct.pack(f"<{len(entries)}Q", *entries)
        return self.pages[page]


def reference_aarch64(ram: RandomRam, state: Aarch64PagingState, address: int) -> int | None:
    """VMSAv8-64, 4 KiB granule, 48-bit addresses: TTBR0 (address bits 63..48 clear) or
    TTBR1 (all set) -> level 0 -> 1 (or a 1 GiB block) -> 2 (or a 2 MiB block) -> 3."""
    top = address >> 48
    if top not in (0, 0xFFFF):
        return None
    table = (state.ttbr1 if top else state.ttbr0 or 0) & 0x0000_FFFF_FFFF_F000
    for level, shift in enumerate((39, 30, 21, 12)):
        descriptor = _entry(ram, table + (address >> shift & 0x1FF) * 8, 8)
        if descriptor is None:
            return None
        output = descriptor & 0x0000_FFFF_FFFF_F000
        if level == 3:
            return output | (address & 0xFFF) if descriptor & 2 else None
        if not descriptor & 2:  # a block: at levels 1 and 2 only
            if level == 0:
                return None
            size = 1 << shift
            return (output & ~(size - 1)) | (address & (size - 1))
        table = output
    return None


def address_a64(rng: random.Random) -> int:
    return rng.choice(
        [
            rng.getrandbits(64),
            rng.getrandbits(48),
            rng.randrange(PAGES * PAGE_SIZE),
            (0xFFFF << 48) | rng.getrandbits(48),
            (1 << 48) - rng.randrange(1, 3 * PAGE_SIZE),
        ]
    )


class WordRandomRamA64(WordReads, RandomRamA64):
    pass


@pytest.mark.parametrize("reads", [RandomRamA64, WordRandomRamA64])
@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_aarch64_paging_translates_as_the_manual_says(reads: type[RandomRam], seed: int) -> None:
    rng = random.Random(seed)
    ram = reads(seed)
    asid = rng.getrandbits(16) << 48  # an ASID above the table's address, CnP below
    ttbr0 = asid | rng.randrange(PAGES) * PAGE_SIZE | rng.getrandbits(1)
    ttbr1 = rng.randrange(PAGES) * PAGE_SIZE
    state = Aarch64PagingState(ttbr0, ttbr1, rng.choice([0, 0x80100010 | 0x10 << 16]))
    assert state.mode is PagingMode.AARCH64_4K_48
    memory = VirtualMemory(ram, state)
    for _ in range(16):
        check_against(memory, ram, reference_aarch64, address_a64(rng))


@pytest.mark.parametrize(
    "tcr",
    [0x8010_4010, 0x4010_0010, 0x8010_000C, 0x8014_0010, 0x800C_000C],
    ids=["64k", "16k", "52bit-lower-only", "44bit", "52bit-without-lpa2"],
)
def test_aarch64_granules_and_sizes_not_walked_are_refused(tcr: int) -> None:
    """TCR_EL1's TG0/TG1 and T0SZ/T1SZ: anything but 4 KiB with 48-bit addresses, or
    52-bit ones in both halves with LPA2 (DS)."""
    with pytest.raises(UnsupportedPaging, match="only the 4 KiB granule"):
        VirtualMemory(RandomRamA64(0), Aarch64PagingState(0, 0, tcr))


def reference_aarch64_52(ram: RandomRam, state: Aarch64PagingState, address: int) -> int | None:
    """FEAT_LPA2 (TCR_EL1.DS), 4 KiB granule, 52-bit addresses: TTBR0 (bits 63..52 clear)
    or TTBR1 (set) -> level -1 (16 entries, bits 51..48; a 64-byte aligned table) -> the
    48-bit walk's levels 0..3 (tables and pages below 2^48 here)."""
    top = address >> 52
    if top not in (0, 0xFFF):
        return None
    root = (state.ttbr1 if top else state.ttbr0 or 0) & 0x0000_FFFF_FFFF_FFC0
    descriptor = _entry(ram, root + (address >> 48 & 0xF) * 8, 8)
    if descriptor is None or not descriptor & 2:  # no block at level -1
        return None
    lower = address & ((1 << 48) - 1)
    level_zero = Aarch64PagingState(descriptor & 0x0000_FFFF_FFFF_F000, 0)
    return reference_aarch64(ram, level_zero, lower)


#: TCR_EL1 of Linux 6.12 on `-cpu max`: DS, T0SZ = T1SZ = 12, TG1 4 KiB.
_TCR_LPA2 = 1 << 59 | 2 << 30 | 12 << 16 | 12


@pytest.mark.parametrize("reads", [RandomRamA64, WordRandomRamA64])
@settings(max_examples=cases(100))
@given(seed=st.integers(0, 1 << 64))
@counted
def test_aarch64_lpa2_paging_translates_as_the_manual_says(
    reads: type[RandomRam], seed: int
) -> None:
    rng = random.Random(seed)
    ram = reads(seed)
    # A level -1 table anywhere 64-byte aligned (Linux's user ones come from a cache).
    ttbr0 = rng.getrandbits(16) << 48 | rng.randrange(PAGES * 64) * 64 | rng.getrandbits(1)
    ttbr1 = rng.randrange(PAGES) * PAGE_SIZE
    state = Aarch64PagingState(ttbr0, ttbr1, _TCR_LPA2)
    assert state.mode is PagingMode.AARCH64_4K_52
    memory = VirtualMemory(ram, state)
    for _ in range(16):
        address = rng.choice(
            [address_a64(rng), rng.getrandbits(52), (0xFFF << 52) | rng.getrandbits(52)]
        )
        check_against(memory, ram, reference_aarch64_52, address)
