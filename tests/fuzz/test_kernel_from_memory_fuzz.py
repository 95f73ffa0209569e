"""A guest that lies about its kernel (guest/linux/vmcoreinfo.py, kallsyms.py,
from_memory.py): VMCOREINFO texts and pages that are random or a real one mutated,
kallsyms tables of random bytes or of random counts and sizes, Debian 5.10's tables
(found by their shape) with bytes mutated, and a whole kernel image
of random pages behind a VMCOREINFO that checks. Each parser returns what it found or
raises BadGuestKernel, reads a bounded number of bytes, and never names more symbols
than the table says it has."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadGuestKernel, MemoryFault
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.guest.linux.from_memory import MAX_TABLE, read_guest_kernel
from qmpprof.guest.linux.kallsyms import (
    MAX_SYMBOLS,
    KallsymsBytes,
    KallsymsTables,
    decode,
    read_tables,
)
from qmpprof.guest.linux.kallsyms_search import find_tables
from qmpprof.guest.linux.module_symbols import module_from_memory
from qmpprof.model import KernelModule
from qmpprof.unwind.orc import Layout
from tests.fuzz.budget import cases, counted
from tests.linux_vm import nm_symbols
from tests.unit.test_kernel_from_memory import LinkedImage

SAVED = Path(__file__).parents[1] / "unit" / "data" / "linux" / "vmcoreinfo-6.1.0-50-amd64.txt"
TEXT = SAVED.read_bytes()
LINES = TEXT.split(b"\n")
PAGE = 4096


def mutated(rng: random.Random) -> bytes:
    """The real text with lines dropped, repeated, cut or given random values."""
    lines = list(LINES)
    for _ in range(rng.randrange(1, 8)):
        at = rng.randrange(len(lines))
        key = lines[at].split(b"=", 1)[0]
        choice = rng.random()
        if choice < 0.25:
            del lines[at]
        elif choice < 0.5:
            lines[at] = key + b"=" + rng.randbytes(rng.randrange(24))
        elif choice < 0.75:
            lines[at] = key + b"=" + f"{rng.getrandbits(64):x}".encode()
        else:
            lines.insert(at, lines[at][: rng.randrange(len(lines[at]) + 1)])
    return b"\n".join(lines)


@settings(max_examples=cases(300), deadline=None)
@given(st.integers(0, 2**32), st.binary(max_size=PAGE + 64))
@counted
def test_any_text_or_page_parses_or_is_refused(seed: int, junk: bytes) -> None:
    rng = random.Random(seed)
    for text in (junk, mutated(rng)):
        try:
            info = vmcoreinfo.parse(text)
        except BadGuestKernel:
            continue
        assert info.kernel_offset % vmcoreinfo.SLIDE_ALIGN == 0
        assert info.build_id is None or len(info.build_id) == 20
    found = vmcoreinfo.page_text(junk)
    assert found is None or len(found) <= vmcoreinfo.MAX_TEXT


class RandomRam:
    """Guest physical memory where every page is random bytes (from `seed`), and the
    bytes read are counted."""

    def __init__(self, seed: int, size: int) -> None:
        self.seed, self.size, self.read_bytes = seed, size, 0

    def read(self, address: int, size: int) -> bytes:
        if address < 0 or address + size > self.size or size > MAX_TABLE:
            raise MemoryFault(address, size)
        self.read_bytes += size
        first, last = address // PAGE, (address + size - 1) // PAGE
        data = b"".join(
            random.Random(f"{self.seed}:{page}").randbytes(PAGE) for page in range(first, last + 1)
        )
        return data[address % PAGE : address % PAGE + size]


@settings(max_examples=cases(100), deadline=None)
@given(st.integers(0, 2**32))
@counted
def test_a_kernel_image_of_random_pages_is_refused_in_bounded_reads(seed: int) -> None:
    """A VMCOREINFO (real, or mutated) over an image of random bytes: the kallsyms
    tables it names hold anything, and no symbol comes out of it (no decoding puts
    `_stext` where VMCOREINFO does), after reads bounded by the tables' own limits."""
    rng = random.Random(seed)
    text = TEXT if seed % 2 else mutated(rng)
    try:
        info = vmcoreinfo.parse(text)
    except BadGuestKernel:
        return
    ram = RandomRam(seed, 1 << 31)
    try:
        kernel = read_guest_kernel(info, ram.read)
    except BadGuestKernel:
        kernel = None
    assert kernel is None, kernel.describe()
    assert ram.read_bytes <= 4 * MAX_TABLE


def table_bytes(rng: random.Random) -> KallsymsBytes:
    count = rng.choice([1, 2, rng.randrange(1, 64), MAX_SYMBOLS + 1, 0])
    tokens = [rng.randbytes(rng.randrange(0, 4)).replace(b"\0", b"_") for _ in range(256)]
    table, index = b"", []
    for token in tokens:
        index.append(len(table))
        table += token + b"\0"
    if rng.random() < 0.2:
        table = table[: rng.randrange(len(table) + 1)]
    names = rng.randbytes(rng.randrange(4 * max(count, 1) + 1))
    width = 8 if rng.random() < 0.2 else 4
    fits = count <= MAX_SYMBOLS and rng.random() < 0.9
    offsets = rng.randbytes(width * count if fits else rng.randrange(64))
    base = rng.getrandbits(64)
    packed = struct.pack(f"<{len(index)}H", *index)
    return KallsymsBytes(count, packed, table, names, offsets, base, base, width == 8)


@settings(max_examples=cases(400), deadline=None)
@given(st.integers(0, 2**32))
@counted
def test_random_kallsyms_tables_decode_to_at_most_their_count_or_are_refused(seed: int) -> None:
    rng = random.Random(seed)
    raw = table_bytes(rng)
    try:
        found = decode(raw, rng.getrandbits(64))
    except BadGuestKernel:
        return
    assert len(found.names) == len(found.addresses) == len(found.types) == raw.count
    assert all(0 <= address < 1 << 64 for address in found.addresses)


@settings(max_examples=cases(200), deadline=None)
@given(st.integers(0, 2**32))
@counted
def test_reading_tables_from_random_memory_is_bounded(seed: int) -> None:
    """kallsyms_num_syms holds anything; the names table is walked through random bytes."""
    ram = RandomRam(seed, 1 << 28)
    rng = random.Random(seed)  # one generator: six different places, not one six times
    where = [rng.randrange(1 << 27) for _ in range(6)]
    tables = KallsymsTables(where[0], where[1], where[2], where[3], where[4], where[5], None)
    try:
        raw = read_tables(tables, ram.read)
    except BadGuestKernel:
        return
    assert 0 < raw.count <= MAX_SYMBOLS
    assert ram.read_bytes <= raw.count * 518 + (1 << 17) + 8 * raw.count


class PlantedRam(RandomRam):
    """Random pages, some of them starting with a VMCOREINFO text (mutated) or its note."""

    def __init__(self, seed: int, size: int) -> None:
        super().__init__(seed, size)
        rng = random.Random(seed)
        self.planted = {
            rng.randrange(size // PAGE) * PAGE: self._page(rng) for _ in range(rng.randrange(8))
        }

    @staticmethod
    def _page(rng: random.Random) -> bytes:
        text = mutated(rng) if rng.random() < 0.8 else TEXT
        if rng.random() < 0.5:
            text = struct.pack("<III", 11, len(text), 0) + b"VMCOREINFO\0\0" + text
        return text[:PAGE].ljust(PAGE, b"\0")

    def read(self, address: int, size: int) -> bytes:
        data = bytearray(super().read(address, size))
        for at, page in self.planted.items():
            start, end = max(at, address), min(at + PAGE, address + size)
            if start < end:
                data[start - address : end - address] = page[start - at : end - at]
        return bytes(data)


@settings(max_examples=cases(100), deadline=None)
@given(st.integers(0, 2**32))
@counted
def test_finding_vmcoreinfo_among_planted_pages_ends_in_a_checked_one_or_a_refusal(
    seed: int,
) -> None:
    ram = PlantedRam(seed, 1 << 20)
    try:
        page, info = vmcoreinfo.find(ram.read, [(0, ram.size)], hint=seed % ram.size)
    except BadGuestKernel:
        return
    assert page in ram.planted  # random pages around it never check
    vmcoreinfo.check(info, ram.read)


@settings(max_examples=cases(300), deadline=None)
@given(st.binary(max_size=24 * 40), st.binary(max_size=600), st.binary(max_size=200))
@counted
def test_a_module_s_symbols_from_random_memory_stay_in_its_text(
    symtab: bytes, strtab: bytes, orc: bytes
) -> None:
    """struct module's core_kallsyms and ORC arrays holding anything: every symbol lies in
    the module's text, and the ORC table answers any address with a row or None."""
    loaded = KernelModule("crc8", 0xFFFF_FFFF_C000_0000, 0x2000)
    values = [loaded.base + word % 0x3000 for word in range(0, len(symtab), 24)]
    placed = bytearray(symtab)
    for index, value in enumerate(values):  # half the symbols near the module's text
        if index % 2 and 24 * index + 16 <= len(placed):
            placed[24 * index + 8 : 24 * index + 16] = value.to_bytes(8, "little")
    ips = orc[: len(orc) // 10 * 4]
    module = module_from_memory(
        loaded, bytes(placed), strtab, (ips, loaded.base, orc, Layout.BEFORE_6_4)
    )
    for symbol in module.symbols:
        assert 0 <= symbol.address < loaded.size and symbol.address + symbol.size <= loaded.size
    if module.orc is not None:
        for address in range(0, loaded.size + 64, 61):
            module.orc.row_for(address)


class OldTables:
    """Debian 5.10's kallsyms tables as its vmlinux links them (the shape the search
    looks for: no VMCOREINFO names them), with some bytes mutated."""

    ABI = "5.10.0-46-amd64"
    _region: tuple[int, bytes] | None = None

    @classmethod
    def region(cls) -> tuple[int, bytes]:
        """From 64 KiB before kallsyms_offsets to 4 KiB past kallsyms_token_index."""
        if cls._region is None:
            path = Path.home() / ".cache" / "qmpprof" / "linux" / cls.ABI / "vmlinux"
            if not path.exists():
                pytest.skip(f"no {path}: make linux-guest fetches it")
            nm = nm_symbols(path)
            (low,), (high,) = nm["kallsyms_offsets"], nm["kallsyms_token_index"]
            image = LinkedImage(path)
            cls._region = (low - (64 << 10), image.read(low - (64 << 10), high - low + (68 << 10)))
        return cls._region


@settings(max_examples=cases(60), deadline=None)
@given(st.integers(0, 2**32))
@counted
def test_kallsyms_tables_of_mutated_shape_are_found_checked_or_refused(seed: int) -> None:
    start, real = OldTables.region()
    rng = random.Random(seed)
    data = bytearray(real)
    ends = len(data) - 8 * 1024  # the token tables: mutated more often, being small
    for _ in range(rng.randrange(1, 40)):
        tokens = rng.random() < 0.5
        at = rng.randrange(ends - 4096, len(data)) if tokens else rng.randrange(len(data))
        data[at : at + rng.randrange(1, 9)] = rng.randbytes(rng.randrange(1, 9))
    read_bytes = 0

    def read(address: int, size: int) -> bytes:
        nonlocal read_bytes
        if address < start or address + size > start + len(data):
            raise MemoryFault(address, size)
        read_bytes += size
        return bytes(data[address - start : address - start + size])

    try:
        found = find_tables(read, start, start + len(data))
    except BadGuestKernel:
        found = []
    assert len(found) <= 2
    for tables in found:
        assert start <= tables.names < tables.token_table < tables.token_index
    assert read_bytes <= 2 * len(data) + 64 * (1 << 21)
