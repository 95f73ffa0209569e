"""The Linux kernel's own records of itself, decoded as qmpprof reads them from a guest
(guest/linux/vmcoreinfo.py, guest/linux/kallsyms.py), on real bytes:

- a VMCOREINFO page Debian's 6.1 kernel wrote in a booted example guest (saved as it was:
  tests/unit/data/linux/vmcoreinfo-6.1.0-50-amd64.txt), checked against that kernel's
  vmlinux as binutils reads it (its build-id note, nm's _stext);
- the kallsyms tables of each Debian vmlinux the tests boot: the same bytes the kernel
  has in memory (its .rodata, at link addresses), decoded and compared with nm's symbol
  table of the same file.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from qmpprof.errors import BadGuestKernel, MemoryFault
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.guest.linux.kallsyms import KallsymsTables, decode, read_tables
from qmpprof.guest.linux.kallsyms_search import find_tables
from qmpprof.symbols.elf_file import open_elf
from qmpprof.target import remembered
from tests.linux_vm import kernel_abis, nm_symbols

DATA = Path(__file__).parent / "data" / "linux"
SAVED_ABI = "6.1.0-50-amd64"
SAVED = (DATA / f"vmcoreinfo-{SAVED_ABI}.txt").read_bytes()
CACHE = Path.home() / ".cache" / "qmpprof" / "linux"
PAGE = 4096


def vmlinux(abi: str) -> Path:
    path = CACHE / abi / "vmlinux"
    if not path.exists():
        pytest.skip(f"no {path}: make linux-guest fetches it")
    return path


def note_page(text: bytes) -> bytes:
    """The ELF note copy as the kernel writes it (namesz, descsz, type 0, the name padded
    to 4 bytes, the text), padded to a page."""
    note = struct.pack("<III", 11, len(text), 0) + b"VMCOREINFO\0\0" + text
    return note.ljust(PAGE, b"\0")


def test_the_saved_vmcoreinfo_names_the_kernel_it_came_from() -> None:
    info = vmcoreinfo.parse(SAVED)
    assert info.release == SAVED_ABI
    readelf = subprocess.run(
        ["readelf", "-n", str(vmlinux(SAVED_ABI))], capture_output=True, text=True, check=True
    )
    assert info.build_id is not None and f"Build ID: {info.build_id.hex()}" in readelf.stdout
    (stext,) = nm_symbols(vmlinux(SAVED_ABI))["_stext"]
    assert info.symbol("_stext") == stext + info.kernel_offset  # the slide KERNELOFFSET says
    assert (
        info.link_address(info.symbol("kallsyms_names") or 0)
        in nm_symbols(vmlinux(SAVED_ABI))["kallsyms_names"]
    )


def test_both_copies_of_a_page_give_the_same_text() -> None:
    assert vmcoreinfo.page_text(SAVED.ljust(PAGE, b"\0")) == SAVED
    assert vmcoreinfo.page_text(note_page(SAVED)) == SAVED
    assert vmcoreinfo.page_text(b"\0" * PAGE) is None
    assert vmcoreinfo.page_text(note_page(b"NOT VMCOREINFO")) is None


def test_a_vmcoreinfo_without_what_qmpprof_needs_is_refused_in_one_line() -> None:
    for missing in (b"KERNELOFFSET=", b"NUMBER(phys_base)=", b"OSRELEASE="):
        lines = [line for line in SAVED.split(b"\n") if not line.startswith(missing)]
        with pytest.raises(BadGuestKernel) as raised:
            vmcoreinfo.parse(b"\n".join(lines))
        assert "\n" not in str(raised.value)
    with pytest.raises(BadGuestKernel):  # no KASLR slide is 4 KiB-aligned only
        vmcoreinfo.parse(SAVED.replace(b"KERNELOFFSET=16c00000", b"KERNELOFFSET=16c01000"))


class SparseRam:
    """Guest physical memory of a few pages; everything else faults."""

    def __init__(self, pages: dict[int, bytes]) -> None:
        self.pages = {at: page.ljust(PAGE, b"\0")[:PAGE] for at, page in pages.items()}

    def read(self, address: int, size: int) -> bytes:
        data = b""
        while len(data) < size:
            page, offset = divmod(address + len(data), PAGE)
            if page * PAGE not in self.pages:
                raise MemoryFault(address + len(data))
            data += self.pages[page * PAGE][offset : offset + size - len(data)]
        return data


def release_page(info: vmcoreinfo.VmcoreInfo, release: bytes) -> tuple[int, bytes]:
    """The page holding init_uts_ns's release (new_utsname: after two 65-byte fields)."""
    where = info.physical((info.symbol("init_uts_ns") or 0) + 130)
    page = bytearray(PAGE)
    page[where % PAGE : where % PAGE + len(release)] = release
    return where - where % PAGE, bytes(page)


def test_find_skips_a_stale_copy_and_remembers_where_the_live_one_is() -> None:
    info = vmcoreinfo.parse(SAVED)
    # An earlier boot's: another slide, so init_uts_ns elsewhere.
    stale = SAVED.replace(b"KERNELOFFSET=16c00000", b"KERNELOFFSET=2e00000")
    stale = stale.replace(
        b"SYMBOL(init_uts_ns)=ffffffff997fb100", b"SYMBOL(init_uts_ns)=ffffffff85bfb100"
    )
    uts, page = release_page(info, SAVED_ABI.encode())
    ram = SparseRam({0x1000: note_page(stale), 0x5000: SAVED.ljust(PAGE, b"\0"), uts: page})
    ranges = [(0, 0x8000), (uts, uts + PAGE)]
    read = ram.read
    ram.pages.update({at: bytes(PAGE) for at in range(0, 0x8000, PAGE) if at not in ram.pages})
    assert vmcoreinfo.find(read, ranges)[0] == 0x5000
    assert vmcoreinfo.find(read, ranges, hint=0x1000)[0] == 0x5000  # the hint is stale
    other = vmcoreinfo.parse(SAVED.replace(b"OSRELEASE=6.1.0-50", b"OSRELEASE=6.1.0-49"))
    with pytest.raises(BadGuestKernel, match="earlier boot"):
        vmcoreinfo.check(other, read)


def test_no_vmcoreinfo_in_ram_says_so() -> None:
    with pytest.raises(BadGuestKernel, match="no page of guest RAM"):
        vmcoreinfo.find(SparseRam({0: bytes(PAGE), PAGE: b"OSRELEASE"}).read, [(0, 2 * PAGE)])
    ram = SparseRam({0: bytes(PAGE), PAGE: b"OSRELEASE=" * 400})
    with pytest.raises(BadGuestKernel, match="1 VMCOREINFO pages in guest RAM, none checks"):
        vmcoreinfo.find(ram.read, [(0, 2 * PAGE)])


class LinkedImage:
    """A vmlinux's allocated sections, read by link address (as the guest's memory holds
    them at link address + slide)."""

    sections: list[tuple[int, bytes]]

    def __init__(self, path: Path) -> None:
        self.sections = []
        with open_elf(path) as elf:
            for section in elf.iter_sections():
                if section["sh_type"] == "SHT_PROGBITS" and section["sh_addr"]:
                    self.sections.append((section["sh_addr"], section.data()))

    def read(self, address: int, size: int) -> bytes:
        """What RAM holds there: the sections' bytes, zeros between them (alignment)."""
        found = bytearray(size)
        overlaps = False
        for start, data in self.sections:
            low, high = max(start, address), min(start + len(data), address + size)
            if low < high:
                found[low - address : high - address] = data[low - start : high - start]
                overlaps = True
        if not overlaps:
            raise MemoryFault(address, size)
        return bytes(found)


@pytest.mark.parametrize("abi", kernel_abis())
def test_kallsyms_decodes_to_the_symbols_nm_lists(abi: str) -> None:
    path = vmlinux(abi)
    nm = nm_symbols(path)

    def linked(name: str) -> int | None:
        return min(nm[name]) if name in nm else None

    tables = KallsymsTables.from_symbols(linked)
    image = LinkedImage(path)
    (stext,) = nm["_stext"]
    found = decode(read_tables(tables, image.read), stext)
    placed = [
        (name, address)
        for name, address in zip(found.names, found.addresses, strict=True)
        if address >= 0xFFFF_8000_0000_0000
    ]
    misnamed = [(name, hex(address)) for name, address in placed if address not in nm.get(name, ())]
    assert len(placed) > 40_000
    assert not misnamed, f"{len(misnamed)} of {len(placed)}: {misnamed[:20]}"
    assert found.find("asm_exc_divide_error") in nm["asm_exc_divide_error"]
    assert set(found.types) <= set("tTdDrRbBwWvVaA")


@pytest.mark.parametrize("abi", kernel_abis())
def test_kallsyms_decoded_for_another_stext_is_refused(abi: str) -> None:
    path = vmlinux(abi)
    nm = nm_symbols(path)
    tables = KallsymsTables.from_symbols(lambda name: min(nm[name]) if name in nm else None)
    raw = read_tables(tables, LinkedImage(path).read)
    (stext,) = nm["_stext"]
    with pytest.raises(BadGuestKernel, match="_stext"):
        decode(raw, stext + 0x20_0000)


OLD_ABI = "5.10.0-46-amd64"
OLD_SAVED = (DATA / f"vmcoreinfo-{OLD_ABI}.txt").read_bytes()


def test_a_5_10_vmcoreinfo_names_no_kallsyms_table_and_no_utsname_offset() -> None:
    info = vmcoreinfo.parse(OLD_SAVED)
    assert info.release == OLD_ABI
    assert info.offset("uts_namespace.name") is None
    assert not [key for key in info.values if "kallsyms" in key]
    with pytest.raises(BadGuestKernel, match="does not say where kallsyms is"):
        KallsymsTables.from_symbols(info.symbol)


def image_as_ram(info: vmcoreinfo.VmcoreInfo, image: LinkedImage) -> vmcoreinfo.PhysicalRead:
    """Guest physical memory as the kernel `info` describes it, holding the vmlinux's
    own bytes where its image is (the slide and phys_base that VMCOREINFO says)."""
    to_link = info.image.delta - info.kernel_offset
    return lambda address, size: image.read(address + to_link, size)


def test_5_10s_release_is_found_after_the_kref_its_uts_namespace_starts_with() -> None:
    info = vmcoreinfo.parse(OLD_SAVED)
    ram = image_as_ram(info, LinkedImage(vmlinux(OLD_ABI)))
    vmcoreinfo.check(info, ram)  # init_uts_ns as the vmlinux initialises it
    other = vmcoreinfo.parse(OLD_SAVED.replace(b"OSRELEASE=5.10.0-46", b"OSRELEASE=5.10.0-45"))
    with pytest.raises(BadGuestKernel, match="earlier boot"):
        vmcoreinfo.check(other, ram)


@pytest.mark.parametrize("abi", kernel_abis())
def test_kallsyms_tables_are_found_by_their_shape(abi: str) -> None:
    path = vmlinux(abi)
    nm = nm_symbols(path)
    image = LinkedImage(path)
    (stext,), (uts,) = nm["_stext"], nm["init_uts_ns"]

    def at(name: str) -> int:
        (address,) = nm[f"kallsyms_{name}"]
        return address

    try:
        tables = find_tables(image.read, stext, uts)[0]
    except BadGuestKernel:
        # 6.2's kallsyms_seqs_of_names between the markers and the tokens (Debian's 6.1
        # has it too): the search does not know that shape; VMCOREINFO names them there.
        assert at("markers") < at("seqs_of_names") < at("token_table")
        return
    assert (tables.names, tables.count) == (at("names"), at("num_syms"))
    assert (tables.token_table, tables.token_index) == (at("token_table"), at("token_index"))
    if at("num_syms") < at("offsets"):  # 6.4 moved them past the tokens: not found so
        return
    assert (tables.offsets, tables.relative_base) == (at("offsets"), at("relative_base"))
    decoded = decode(read_tables(tables, image.read), stext)
    assert decoded.find("init_uts_ns") == uts
    assert decoded.find("asm_exc_divide_error") in nm["asm_exc_divide_error"]


def test_rodata_without_kallsyms_tables_is_refused_in_one_line() -> None:
    path = vmlinux(OLD_ABI)
    nm = nm_symbols(path)
    image = LinkedImage(path)
    (start,), (end,) = nm["__start_rodata"], nm["kallsyms_offsets"]
    with pytest.raises(BadGuestKernel, match="no tables of its shape") as raised:
        find_tables(image.read, start, end)
    assert "\n" not in str(raised.value)


def test_remembered_vmcoreinfo_pages_stay_few(tmp_path: Path) -> None:
    """One page remembered per QEMU process (target/remembered.py): QEMU processes come
    and go, so the most recently written MAX_REMEMBERED are kept and no more."""
    made = remembered.MAX_REMEMBERED + 5
    for number in range(made):
        place = remembered.Remembered(tmp_path / f"{number:032x}")
        place.keep(0x1000 * (number + 1))
        assert place.page() == 0x1000 * (number + 1)
    left = sorted(int(path.name, 16) for path in tmp_path.iterdir())
    assert left == list(range(made - remembered.MAX_REMEMBERED, made))
    pair = remembered.Remembered(tmp_path / "roots")
    pair.keep(0x40211000, 0x12B5103510)
    assert pair.numbers() == (0x40211000, 0x12B5103510) and pair.page() is None


def test_ram_is_scanned_from_the_start_of_the_highest_zone() -> None:
    """Linux allocates VMCOREINFO early, near the start of the highest zone with memory:
    in a guest with RAM above 4 GiB the scan starts there (a 4 GiB guest had its page
    8 MiB past 4 GiB), and reads nothing below before it finds the page there."""
    gib = 1 << 30
    ranges = [(0, 3 * gib), (4 * gib, 6 * gib)]
    assert vmcoreinfo.scan_order(ranges) == [
        (4 * gib, 6 * gib),
        (16 << 20, 3 * gib),
        (0, 16 << 20),
    ]
    assert vmcoreinfo.scan_order([(0, 256 << 20)]) == [(16 << 20, 256 << 20), (0, 16 << 20)]
    info = vmcoreinfo.parse(SAVED)
    uts, page = release_page(info, SAVED_ABI.encode())
    found_at = 4 * gib + 0x870000
    chunk = found_at - found_at % vmcoreinfo.SCAN_CHUNK  # readable whole, as RAM is
    zeros = {at: bytes(PAGE) for at in range(chunk, chunk + vmcoreinfo.SCAN_CHUNK, PAGE)}
    ram = SparseRam({**zeros, found_at: SAVED.ljust(PAGE, b"\0"), uts: page})
    scanned = []

    def read(address: int, size: int) -> bytes:
        if size == vmcoreinfo.SCAN_CHUNK:
            scanned.append(address)
        return ram.read(address, size)

    assert vmcoreinfo.find(read, [*ranges, (uts, uts + PAGE)])[0] == found_at
    assert scanned and min(scanned) >= 4 * gib
