"""The page-table walk over hand-built tables in a bytearray of "physical memory".

Each test writes the entries a guest kernel would (the input) and checks the physical
address a CPU would use (worked out by hand from the entries, not by our code).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import MemoryFault
from qmpprof.model import RegisterSet
from qmpprof.target.direct import isolated_kernel_root
from qmpprof.target.paging import (
    MAX_READ_BYTES,
    PagingMode,
    PagingState,
    TableCache,
    VirtualMemory,
)
from tests.unit.properties import examples

CR0_PG = 1 << 31 | 1  # PG and PE
CR4_PSE, CR4_PAE, CR4_LA57 = 1 << 4, 1 << 5, 1 << 12
EFER_LONG = 1 << 8 | 1 << 10  # LME, LMA
P, RW, PS = 0x1, 0x2, 0x80
NX = 1 << 63

LONG4 = PagingState(CR0_PG, 0x1000, CR4_PAE, EFER_LONG)


class Ram:
    """Guest physical memory: a bytearray; reads outside it fault. Counts reads."""

    def __init__(self, size: int = 1 << 20) -> None:
        self.data = bytearray(size)
        self.reads = 0

    def read_physical(self, address: int, size: int) -> bytes:
        self.reads += 1
        if address < 0 or size < 0 or address + size > len(self.data):
            raise MemoryFault(address, size)
        return bytes(self.data[address : address + size])

    def entry(self, table: int, index: int, value: int, size: int = 8) -> None:
        struct.pack_into("<Q" if size == 8 else "<I", self.data, table + index * size, value)

    def fill(self, address: int, data: bytes) -> None:
        self.data[address : address + len(data)] = data


class WordRam(Ram):
    """Ram that also reads single words (paging.WordReader, as a mapped RAM file does):
    a walk then reads the entries it needs, not their table pages."""

    def read_word(self, address: int, size: int) -> int:
        return int.from_bytes(self.read_physical(address, size), "little")


def long4_kernel_page(ram: Ram) -> VirtualMemory:
    """0xffffffff80123000 → 0x7000 through PML4 0x1000, PDPT 0x2000, PD 0x3000, PT 0x4000
    (indexes 511, 510, 0, 0x123), the PTE with NX and ignored high bits set."""
    ram.entry(0x1000, 511, 0x2000 | P | RW)
    ram.entry(0x2000, 510, 0x3000 | P | RW)
    ram.entry(0x3000, 0, 0x4000 | P | RW)
    ram.entry(0x4000, 0x123, NX | 0x7FF0_0000_0000_0000 | 0x7000 | P)
    return VirtualMemory(ram, LONG4)


# ---- modes ----


@pytest.mark.parametrize(
    ("cr0", "cr4", "efer", "mode"),
    [
        (0x11, CR4_PAE, EFER_LONG, PagingMode.DISABLED),
        (CR0_PG, 0, 0, PagingMode.LEGACY),
        (CR0_PG, CR4_PSE, 0, PagingMode.LEGACY),
        (CR0_PG, CR4_PAE, 0, PagingMode.PAE),
        (CR0_PG, CR4_PAE, EFER_LONG, PagingMode.LONG4),
        (CR0_PG, CR4_PAE, 1 << 10, PagingMode.LONG4),
        (CR0_PG, CR4_PAE | CR4_LA57, EFER_LONG, PagingMode.LONG5),
    ],
)
def test_mode_from_control_registers(cr0: int, cr4: int, efer: int, mode: PagingMode) -> None:
    assert PagingState(cr0, 0, cr4, efer).mode is mode


def test_state_from_a_register_set() -> None:
    regs = RegisterSet(0, {}, 8, 0, False, 64, cr0=CR0_PG, cr3=0x1000, cr4=CR4_PAE, efer=0x500)
    assert PagingState.from_registers(regs) == PagingState(CR0_PG, 0x1000, CR4_PAE, 0x500)


# ---- long mode ----


def test_long4_4k_page_masks_nx_and_ignored_bits() -> None:
    memory = long4_kernel_page(Ram())
    assert memory.translate(0xFFFF_FFFF_8012_3456) == 0x7456


def test_long4_cr3_pcid_bits_are_not_part_of_the_root() -> None:
    ram = Ram()
    long4_kernel_page(ram)
    memory = VirtualMemory(ram, PagingState(CR0_PG, 0x1000 | 0x5, CR4_PAE, EFER_LONG))
    assert memory.translate(0xFFFF_FFFF_8012_3456) == 0x7456


def test_long4_2m_page() -> None:
    ram = Ram()
    ram.entry(0x1000, 0, 0x2000 | P)
    ram.entry(0x2000, 1, 0x3000 | P)  # VA 0x4000_0000 ...
    ram.entry(0x3000, 3, NX | 0x0A00_0000 | 1 << 12 | PS | P)  # PAT bit 12 is not address
    memory = VirtualMemory(ram, LONG4)
    assert memory.translate(0x4060_0000 + 0x12_3456) == 0x0A12_3456


def test_long4_1g_page() -> None:
    ram = Ram()
    ram.entry(0x1000, 0x1FF, 0x2000 | P)
    ram.entry(0x2000, 0x1FE, 0x1_4000_0000 | PS | P)
    memory = VirtualMemory(ram, LONG4)
    assert memory.translate(0xFFFF_FFFF_8000_0000 + 0x2345_6789) == 0x1_6345_6789


def test_long4_non_canonical_addresses_fault() -> None:
    memory = long4_kernel_page(Ram())
    for address in (0x0000_8000_0000_0000, 0xFFFF_7FFF_FFFF_F000, 1 << 64, -8):
        with pytest.raises(MemoryFault) as fault:
            memory.translate(address)
        assert fault.value.address == address


def test_long5_walks_five_levels() -> None:
    ram = Ram()
    address = 0xFF12_3456_789A_BCDE  # indexes 0x112, 0x068, 0x159, 0x1C4, 0x1AB
    ram.entry(0x1000, 0x112, 0x2000 | P)
    ram.entry(0x2000, 0x068, 0x3000 | P)
    ram.entry(0x3000, 0x159, 0x4000 | P)
    ram.entry(0x4000, 0x1C4, 0x5000 | P)
    ram.entry(0x5000, 0x1AB, 0x9000 | P)
    state = PagingState(CR0_PG, 0x1000, CR4_PAE | CR4_LA57, EFER_LONG)
    assert VirtualMemory(ram, state).translate(address) == 0x9CDE


def test_long5_accepts_57_bit_addresses_that_4_levels_reject() -> None:
    state = PagingState(CR0_PG, 0x1000, CR4_PAE | CR4_LA57, EFER_LONG)
    ram = Ram()
    ram.entry(0x1000, 1, 0x2000 | P)  # bit 48 set: index 1 in the PML5
    ram.entry(0x2000, 0, 0x3000 | P)
    ram.entry(0x3000, 0, 0x4000_0000 | PS | P)  # a 1 GiB page
    assert VirtualMemory(ram, state).translate(0x0001_0000_0000_1234) == 0x4000_1234
    with pytest.raises(MemoryFault):
        VirtualMemory(ram, LONG4).translate(0x0001_0000_0000_1234)
    with pytest.raises(MemoryFault):
        VirtualMemory(ram, state).translate(0x0100_0000_0000_0000)  # not 57-bit canonical


def test_recursive_pml4_entry_maps_the_pml4_itself_and_the_walk_ends() -> None:
    ram = Ram()
    ram.entry(0x1000, 510, 0x1000 | P | RW)  # the self-map Windows and others use
    ram.entry(0x1000, 7, 0xABC000 | P)  # any entry, to read back through the self-map
    memory = VirtualMemory(ram, LONG4)
    self_map = 0xFFFF_FF7F_BFDF_E000  # indexes 510, 510, 510, 510
    assert memory.translate(self_map) == 0x1000
    assert memory.read_u64(self_map + 7 * 8) == 0xABC000 | P


@pytest.mark.parametrize("level", range(4))
def test_not_present_at_any_level_faults_with_the_virtual_address(level: int) -> None:
    ram = Ram()
    memory = long4_kernel_page(ram)
    table, index = [(0x1000, 511), (0x2000, 510), (0x3000, 0), (0x4000, 0x123)][level]
    ram.entry(table, index, 0x7000 & ~P)  # an address, but not present
    with pytest.raises(MemoryFault) as fault:
        memory.read(0xFFFF_FFFF_8012_3450, 16)
    assert (fault.value.address, fault.value.size) == (0xFFFF_FFFF_8012_3450, 16)


def test_a_table_outside_physical_memory_faults_with_the_virtual_address() -> None:
    ram = Ram()
    memory = long4_kernel_page(ram)
    ram.entry(0x3000, 0, 0x40_0000_0000 | P)  # PT far beyond the RAM
    with pytest.raises(MemoryFault) as fault:
        memory.read_u64(0xFFFF_FFFF_8012_3000)
    assert fault.value.address == 0xFFFF_FFFF_8012_3000


# ---- 32-bit modes ----


def pae_tables(ram: Ram) -> PagingState:
    """PAE: PDPT at 0x1020 (32-byte aligned, CR3 low bits 5..11 are part of it)."""
    ram.entry(0x1020, 3, 0x2000 | P)  # VA 0xC000_0000..
    ram.entry(0x2000, 1, 0x3000 | P)  # VA 0xC020_0000..
    ram.entry(0x3000, 5, NX | 0x0123_4000 | P)
    ram.entry(0x2000, 2, NX | 0x0160_0000 | PS | P)  # a 2 MiB page at VA 0xC040_0000
    return PagingState(CR0_PG, 0x1020, CR4_PAE, 0)


def test_pae_4k_page() -> None:
    ram = Ram()
    memory = VirtualMemory(ram, pae_tables(ram))
    assert memory.translate(0xC020_5ABC) == 0x0123_4ABC


def test_pae_2m_page() -> None:
    ram = Ram()
    memory = VirtualMemory(ram, pae_tables(ram))
    assert memory.translate(0xC045_6789) == 0x0165_6789


def test_pae_rejects_addresses_beyond_32_bits() -> None:
    ram = Ram()
    memory = VirtualMemory(ram, pae_tables(ram))
    with pytest.raises(MemoryFault):
        memory.translate(0x1_C020_5ABC)


def test_pae_not_present_pdpte_faults() -> None:
    ram = Ram()
    memory = VirtualMemory(ram, pae_tables(ram))
    with pytest.raises(MemoryFault) as fault:
        memory.translate(0x4000_0000)
    assert fault.value.address == 0x4000_0000


def legacy_tables(ram: Ram) -> None:
    ram.entry(0x1000, 0x300, 0x2000 | P, size=4)  # VA 0xC000_0000..
    ram.entry(0x2000, 0x12, 0x0034_5000 | P, size=4)
    ram.entry(0x1000, 0x301, 0x00C0_0000 | 1 << 13 | PS | P, size=4)  # 4 MiB, PSE-36 bit 32


def test_legacy_4k_page_with_4_byte_entries() -> None:
    ram = Ram()
    legacy_tables(ram)
    memory = VirtualMemory(ram, PagingState(CR0_PG, 0x1000, 0, 0))
    assert memory.translate(0xC001_2FED) == 0x0034_5FED


def test_legacy_4m_page_with_pse_uses_pse36_high_bits() -> None:
    ram = Ram()
    legacy_tables(ram)
    memory = VirtualMemory(ram, PagingState(CR0_PG, 0x1000, CR4_PSE, 0))
    assert memory.translate(0xC040_0000 + 0x12_3456) == 0x1_00D2_3456


def test_legacy_ps_bit_without_cr4_pse_points_to_a_table() -> None:
    ram = Ram(16 << 20)
    legacy_tables(ram)
    ram.entry(0x00C0_2000, 0x3, 0x0055_5000 | P, size=4)  # the "4 MiB page" as a PT (bit 13!)
    memory = VirtualMemory(ram, PagingState(CR0_PG, 0x1000, 0, 0))
    assert memory.translate(0xC040_3001) == 0x0055_5001


def test_paging_disabled_is_identity() -> None:
    ram = Ram()
    ram.fill(0x5FFC, b"abcdefgh")
    memory = VirtualMemory(ram, PagingState(0x11, 0x1000, CR4_PAE, EFER_LONG))
    assert memory.translate(0x1234_5678) == 0x1234_5678
    with pytest.raises(MemoryFault):  # linear addresses have 32 bits outside long mode
        memory.translate(0xFFFF_FFFF_8000_0000)
    assert memory.read(0x5FFC, 8) == b"abcdefgh"
    with pytest.raises(MemoryFault):
        memory.read(len(ram.data) - 4, 8)


# ---- reads ----


def two_pages(ram: Ram) -> VirtualMemory:
    """VA 0x40_0000 → frame 0x9000 and VA 0x40_1000 → frame 0x5000 (not adjacent);
    VA 0x40_2000 unmapped."""
    ram.entry(0x1000, 0, 0x2000 | P)
    ram.entry(0x2000, 0, 0x3000 | P)
    ram.entry(0x3000, 2, 0x4000 | P)
    ram.entry(0x4000, 0, 0x9000 | P)
    ram.entry(0x4000, 1, 0x5000 | P)
    ram.fill(0x9FF8, bytes(range(8)))
    ram.fill(0x5000, bytes(range(8, 16)))
    return VirtualMemory(ram, LONG4)


@pytest.mark.parametrize("ram", [Ram, WordRam])
def test_a_read_across_pages_is_translated_page_by_page(ram: type[Ram]) -> None:
    memory = two_pages(ram())
    assert memory.read(0x40_0FF8, 16) == bytes(range(16))
    assert memory.read_u64(0x40_0FFC) == int.from_bytes(bytes(range(4, 12)), "little")


@pytest.mark.parametrize("ram", [Ram, WordRam])
def test_a_read_into_an_unmapped_page_faults_and_the_prefix_stops_there(ram: type[Ram]) -> None:
    memory = two_pages(ram())
    with pytest.raises(MemoryFault):
        memory.read(0x40_1FF8, 16)
    assert memory.read_prefix(0x40_0FF8, 3 * 4096) == bytes(range(16)) + bytes(4096 - 8)
    assert memory.read_prefix(0x40_2000, 64) == b""


def stack_pages(ram: Ram) -> VirtualMemory:
    """VA 0x40_0000.. → frames 0x9000, 0x5000, 0x8000, 0x6000 (PT entries 0-3 of the
    table at 0x4000), entry 4 not present, entry 5 → 0x7000; each page filled with its
    own byte: 1, 2, 3, 4 (and 6)."""
    ram.entry(0x1000, 0, 0x2000 | P)
    ram.entry(0x2000, 0, 0x3000 | P)
    ram.entry(0x3000, 2, 0x4000 | P)
    for index, frame in enumerate((0x9000, 0x5000, 0x8000, 0x6000, None, 0x7000)):
        if frame is not None:
            ram.entry(0x4000, index, frame | P)
            ram.fill(frame, bytes([index + 1]) * 4096)
    return VirtualMemory(ram, LONG4)


def test_a_word_reader_reads_a_windows_leaf_entries_in_one_piece() -> None:
    ram = WordRam()
    memory = stack_pages(ram)
    prefix = memory.read_prefix(0x40_0800, 6 * 4096)
    assert prefix == b"\x01" * 2048 + b"\x02" * 4096 + b"\x03" * 4096 + b"\x04" * 4096
    # PML4E, PDPTE, PDE alone; PTEs 0-5 in one read; the four pages' data. The page
    # not present where the window ends is known from that read: not walked again.
    assert ram.reads == 3 + 1 + 4
    reads = ram.reads
    assert memory.translate(0x40_3000) == 0x6000  # kept: no walk
    with pytest.raises(MemoryFault):
        memory.translate(0x40_4000)
    assert ram.reads == reads
    assert memory.translate(0x40_5000) == 0x7000  # past the hole: its own walk


def test_an_unmapped_page_is_walked_once_until_a_flush() -> None:
    ram = WordRam()
    memory = stack_pages(ram)
    with pytest.raises(MemoryFault):
        memory.read(0x40_4010, 8)
    reads = ram.reads
    with pytest.raises(MemoryFault) as fault:
        memory.read(0x40_4020, 4)
    assert (fault.value.address, fault.value.size) == (0x40_4020, 4)  # this read's
    assert ram.reads == reads  # from the cache
    memory.flush()
    with pytest.raises(MemoryFault):
        memory.read(0x40_4010, 8)
    assert ram.reads > reads  # walked again: the guest may have mapped it since


def test_a_word_reader_walks_a_leaf_table_once_for_a_regions_pages() -> None:
    ram = WordRam()
    memory = stack_pages(ram)
    assert memory.translate(0x40_0000) == 0x9000
    reads = ram.reads
    assert memory.translate(0x40_2000) == 0x8000
    assert ram.reads == reads + 1  # the PTE alone: the leaf table's address was kept


def two_megabyte_page_at_the_end_of_ram(ram: Ram) -> VirtualMemory:
    """VA 0x20_0000 → the 2 MiB page at PA 0x20_0000, of which a 3 MiB Ram holds 1 MiB."""
    ram.entry(0x1000, 0, 0x2000 | P)
    ram.entry(0x2000, 0, 0x3000 | P)
    ram.entry(0x3000, 1, 0x20_0000 | PS | P)
    ram.fill(0x20_0000, bytes(range(256)) * 16)
    return VirtualMemory(ram, LONG4)


def test_a_prefix_within_a_large_page_is_one_walk_and_one_read() -> None:
    ram = Ram(3 << 20)
    memory = two_megabyte_page_at_the_end_of_ram(ram)
    prefix = memory.read_prefix(0x20_0010, 4 * 4096)
    assert prefix == (bytes(range(256)) * 16)[0x10:] + bytes(3 * 4096 + 0x10)
    assert ram.reads == 3 + 1  # PML4E, PDPTE, PDE; then the data


def test_a_prefix_running_out_of_ram_in_a_large_page_stops_at_the_last_readable_page() -> None:
    ram = Ram(3 << 20)
    memory = two_megabyte_page_at_the_end_of_ram(ram)
    prefix = memory.read_prefix(0x2F_E000, 5 * 4096)
    assert len(prefix) == 2 * 4096  # PA 0x2F_E000..0x30_0000: the rest is beyond the Ram


def test_read_sizes() -> None:
    memory = two_pages(Ram())
    assert memory.read(0x40_0000, 0) == b""
    with pytest.raises(MemoryFault):
        memory.read(0x40_0000, -1)
    with pytest.raises(MemoryFault):
        memory.read(0x40_0000, MAX_READ_BYTES + 1)
    with pytest.raises(MemoryFault):
        memory.read_u64(0xFFFF_FFFF_FFFF_FFFC)


def test_translations_are_cached_until_flushed() -> None:
    ram = Ram()
    memory = two_pages(ram)
    assert memory.read_u64(0x40_0FF8) == 0x0706_0504_0302_0100
    reads = ram.reads
    memory.read_u64(0x40_0FF0)
    assert ram.reads == reads + 1  # the data only, no walk
    memory.read_u64(0x40_1000)
    assert ram.reads == reads + 2  # the neighbour: its PTE is in the table page read, the data
    ram.entry(0x4000, 0, 0x5000 | P)  # the guest remaps the page
    assert memory.translate(0x40_0000) == 0x9000
    memory.flush()
    assert memory.translate(0x40_0000) == 0x5000


def test_readers_of_one_moment_share_the_table_pages_they_read() -> None:
    ram = Ram()
    tables = TableCache()
    long4_kernel_page(ram)
    first = VirtualMemory(ram, LONG4, tables)
    assert first.translate(0xFFFF_FFFF_8012_3000) == 0x7000
    reads = ram.reads
    other = VirtualMemory(ram, PagingState(CR0_PG, 0x1000 | 0x5, CR4_PAE, EFER_LONG), tables)
    assert other.translate(0xFFFF_FFFF_8012_3456) == 0x7456
    assert ram.reads == reads  # every level's table page was read by the first reader


def test_an_upper_half_address_the_own_tables_miss_is_walked_from_the_upper_root() -> None:
    """Page table isolation: the user's PML4 (0x5000) maps only its own half; the
    kernel's (0x1000) maps the kernel. Lower-half addresses never use the second root."""
    ram = Ram()
    long4_kernel_page(ram)  # the kernel's tables, from 0x1000
    ram.entry(0x5000, 0, 0x2000 | P)  # a user half, through the same PDPT page
    user = PagingState(CR0_PG, 0x5000, CR4_PAE, EFER_LONG)
    with pytest.raises(MemoryFault):
        VirtualMemory(ram, user).translate(0xFFFF_FFFF_8012_3000)
    memory = VirtualMemory(ram, user, upper_root=0x1000)
    assert memory.translate(0xFFFF_FFFF_8012_3008) == 0x7008
    with pytest.raises(MemoryFault):  # index 0 of the user PML4 leads to PDPT entry 0: empty
        memory.translate(0x0000_0000_0012_3000)
    ram.entry(0x1000, 1, 0x2000 | P)  # the kernel root maps this lower address; the user's not
    with pytest.raises(MemoryFault):
        memory.translate(0x0000_0080_0012_3000)


def test_only_the_user_half_of_a_pti_pair_has_a_kernel_root_beside_it() -> None:
    """x86-32 Linux pairs its PGDs as x86-64 does: a PAE PDPT and a 2-level page
    directory too (its entry code clears bit 12 of CR3); paging off has none."""
    user = PagingState(CR0_PG, 0x0123_5000 | 0x800 | 1 << 63, CR4_PAE, EFER_LONG)
    assert isolated_kernel_root(user) == 0x0123_4000
    assert isolated_kernel_root(PagingState(CR0_PG, 0x0123_4000, CR4_PAE, EFER_LONG)) is None
    assert isolated_kernel_root(PagingState(CR0_PG, 0x0123_5020, CR4_PAE, 0)) == 0x0123_4020
    assert isolated_kernel_root(PagingState(CR0_PG, 0x0123_5000, 0, 0)) == 0x0123_4000
    assert isolated_kernel_root(PagingState(0, 0x0123_5000, 0, 0)) is None


def test_a_32_bit_upper_root_answers_from_2_gib_up_only() -> None:
    """A 2-level user page directory (0x5000) that maps nothing; the kernel's (0x1000)
    maps 0xc0000000 with a 4 MiB page and 0x00400000 too: only the upper address is
    walked from it."""
    ram = Ram()
    ram.entry(0x1000, 0xC0000000 >> 22, 0x0080_0000 | P | PS, size=4)
    ram.entry(0x1000, 0x00400000 >> 22, 0x0080_0000 | P | PS, size=4)
    user = PagingState(CR0_PG, 0x5000, CR4_PSE, 0)
    memory = VirtualMemory(ram, user, upper_root=0x1000)
    assert memory.translate(0xC012_3456) == 0x0092_3456
    with pytest.raises(MemoryFault):
        memory.translate(0x0041_2345)


# ---- hostile memory ----


class CyclicRam:
    """Every physical address reads (random) bytes, repeated: tables always exist and
    never make sense."""

    def __init__(self, data: bytes) -> None:
        self.period = len(data)
        self.data = data * (2 * 4096 // len(data) + 2)

    def read_physical(self, address: int, size: int) -> bytes:
        if not 0 <= size <= 4096:
            raise MemoryFault(address, size)
        start = address % self.period
        return self.data[start : start + size]


registers = st.integers(0, (1 << 64) - 1)
addresses = st.one_of(
    st.integers(0, (1 << 64) - 1), st.integers(-(1 << 10), 1 << 33), st.just(1 << 64)
)


@pytest.mark.parametrize("examples", examples(400))
def test_random_memory_and_registers_only_ever_fault(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(
        data=st.binary(min_size=64, max_size=4096),
        cr0=st.sampled_from([0, CR0_PG]) | registers,
        cr3=registers,
        cr4=st.sampled_from([0, CR4_PSE, CR4_PAE, CR4_PAE | CR4_LA57]) | registers,
        efer=st.sampled_from([0, EFER_LONG]) | registers,
        address=addresses,
        size=st.integers(-2, 3 * 4096),
    )
    def check(
        data: bytes, cr0: int, cr3: int, cr4: int, efer: int, address: int, size: int
    ) -> None:
        memory = VirtualMemory(CyclicRam(data), PagingState(cr0, cr3, cr4, efer))
        prefix = memory.read_prefix(address, size)
        assert len(prefix) <= max(size, 0)
        for read in (lambda: memory.read(address, size), lambda: memory.read_u64(address)):
            try:
                result = read()
            except MemoryFault:
                continue
            assert isinstance(result, int | bytes)
        if size >= 0 and len(prefix) == size:  # all readable: a full read gives the same bytes
            assert memory.read(address, size) == prefix

    check()
