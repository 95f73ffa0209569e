"""VMCOREINFO: the page of `KEY=VALUE` lines a Linux kernel writes about itself at boot.

Linux builds it whether or not a crash kernel is loaded (CONFIG_CRASH_CORE, from 6.12
CONFIG_VMCORE_INFO: every distribution kernel), in two page-aligned copies anywhere in
RAM: the bare text (it starts with `OSRELEASE=`) and an ELF note (`VMCOREINFO` as its
name, the text as its descriptor). QEMU has no command that returns it, so qmpprof
looks at page starts (`page_text`). It names the release, the GNU build-id of the
vmlinux, the KASLR slide (`KERNELOFFSET`), where the kernel image lies in physical
memory (x86-64: `phys_base`; arm64: `kimage_voffset`, the distance from an image address
to its physical one) and, since 6.0, where the kallsyms tables are.

RAM outlives a reset, so a copy from an earlier boot can still be found, and the guest
may write anything there: a candidate is used only once `check` has found its release
at `init_uts_ns` in the kernel image it describes (read through that image's own
mapping), and everything built from it is checked again (kallsyms against `_stext`,
the slide against the IDT).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from qmpprof.errors import BadGuestKernel, MemoryFault
from qmpprof.model import KERNEL_HALF
from qmpprof.visible import visible

PAGE_SIZE = 4096
#: VMCOREINFO_BYTES: the text is at most a page.
MAX_TEXT = PAGE_SIZE
#: Where x86-64 Linux maps its image: virtual = physical - phys_base + this.
START_KERNEL_MAP = 0xFFFF_FFFF_8000_0000
#: The kernel image area (KERNEL_IMAGE_SIZE's ceiling) and the slide's alignment (both
#: architectures: arm64 aligns its image to MIN_KIMG_ALIGN, 2 MiB).
IMAGE_AREA = 1 << 30
SLIDE_ALIGN = 0x20_0000
#: The largest arm64 slide: KASLR moves the image within the vmalloc area, at most a
#: quarter of a 52-bit address space.
MAX_ARM64_SLIDE = 1 << 50
#: The ELF note's header: namesz, descsz, type, then "VMCOREINFO\0" padded to 12 bytes.
_NOTE = struct.Struct("<III12s")
_NOTE_NAME = b"VMCOREINFO\0\0"
#: struct new_utsname: sysname[65], nodename[65], then release.
_RELEASE_IN_UTSNAME = 2 * 65
_RELEASE_SIZE = 65
#: uts_namespace.name's offset at most, and the sysname it starts with.
_MAX_NAME_OFFSET = 64
_SYSNAME = b"Linux\0"
_UTS_READ = _MAX_NAME_OFFSET + _RELEASE_IN_UTSNAME + _RELEASE_SIZE
_LINE = re.compile(rb"^([A-Z_]+(?:\([A-Za-z0-9_.]+\))?|[A-Z_-]+)=([ -~]{0,256})$")
_PHYSICAL_LIMIT = 1 << 52

#: Reads guest physical memory. Raises MemoryFault.
PhysicalRead = Callable[[int, int], bytes]


@dataclass(frozen=True)
class ImageMapping:
    """How a kernel maps its image: the `size` bytes from `start` (runtime addresses)
    lie at physical address = address - `delta`."""

    start: int
    size: int
    delta: int

    def physical(self, address: int) -> int:
        """Raises BadGuestKernel for an address outside the image."""
        if not self.start <= address < self.start + self.size:
            raise BadGuestKernel(f"VMCOREINFO names {address:#x}, outside the kernel image")
        physical = address - self.delta
        if physical < 0:
            raise BadGuestKernel(f"VMCOREINFO puts {address:#x} below physical address 0")
        return physical


@dataclass(frozen=True)
class VmcoreInfo:
    """What one VMCOREINFO text says, parsed; `values` keeps every line."""

    release: str
    build_id: bytes | None
    kernel_offset: int
    image: ImageMapping
    values: dict[str, str] = field(repr=False)
    #: The instruction set: "x86_64" or "aarch64" (arm64 gives kimage_voffset).
    isa: str = "x86_64"

    def symbol(self, name: str) -> int | None:
        """`SYMBOL(name)`: a runtime (slid) address; None when absent or not hex."""
        return _hex(self.values.get(f"SYMBOL({name})"))

    def number(self, name: str) -> int | None:
        """`NUMBER(name)`, decimal (a few kernels print hex with 0x)."""
        return _number(self.values.get(f"NUMBER({name})"))

    def offset(self, name: str) -> int | None:
        """`OFFSET(struct.member)`, decimal."""
        return _number(self.values.get(f"OFFSET({name})"))

    def physical(self, address: int) -> int:
        """The physical address of a kernel image address (text, rodata, data, bss).
        Raises BadGuestKernel for an address outside the image's mapping."""
        return self.image.physical(address)

    def link_address(self, address: int) -> int:
        """Where the vmlinux links what the guest has at `address`."""
        return (address - self.kernel_offset) % (1 << 64)


def page_text(page: bytes) -> bytes | None:
    """The VMCOREINFO text a page starts with (the bare copy or the ELF note); None
    when it starts with neither."""
    if page.startswith(b"OSRELEASE="):
        return page[:MAX_TEXT].split(b"\0", 1)[0]
    if len(page) < _NOTE.size or page[12:24] != _NOTE_NAME:
        return None
    name_size, size, kind, _ = _NOTE.unpack_from(page)
    if name_size != 11 or kind != 0 or size > MAX_TEXT:
        return None
    text = page[_NOTE.size : _NOTE.size + size]
    return text if text.startswith(b"OSRELEASE=") else None


def parse(text: bytes) -> VmcoreInfo:
    """The lines of a VMCOREINFO text. Raises BadGuestKernel when it lacks what qmpprof
    needs (release, KERNELOFFSET, where the image lies) or they are out of range."""
    values: dict[str, str] = {}
    for line in text[:MAX_TEXT].split(b"\n"):
        match = _LINE.match(line)
        if match is not None:
            values.setdefault(match.group(1).decode(), match.group(2).decode())
    release = values.get("OSRELEASE", "")
    offset = _hex(values.get("KERNELOFFSET"))
    if not release or offset is None:
        raise BadGuestKernel("VMCOREINFO without OSRELEASE or KERNELOFFSET")
    arm64 = "NUMBER(kimage_voffset)" in values
    image = _arm64_image(values, offset) if arm64 else _x86_image(values, offset)
    if image is None:
        raise BadGuestKernel(f"VMCOREINFO of {visible(release)}: no slide or image of a kernel")
    build_id = values.get("BUILD-ID", "")
    valid_id = re.fullmatch(r"[0-9a-f]{40}", build_id) is not None
    identity = bytes.fromhex(build_id) if valid_id else None
    return VmcoreInfo(release, identity, offset, image, values, "aarch64" if arm64 else "x86_64")


def _x86_image(values: dict[str, str], offset: int) -> ImageMapping | None:
    """x86-64's image: START_KERNEL_MAP onward, physically `phys_base` (signed: where
    the image lies physically less how far KASLR moved it virtually) up."""
    phys_base = _number(values.get("NUMBER(phys_base)"))
    if phys_base is None:
        raise BadGuestKernel("VMCOREINFO without NUMBER(phys_base) or NUMBER(kimage_voffset)")
    if offset % SLIDE_ALIGN or offset >= IMAGE_AREA or abs(phys_base) >= _PHYSICAL_LIMIT:
        return None
    return ImageMapping(START_KERNEL_MAP, IMAGE_AREA, START_KERNEL_MAP - phys_base)


def _arm64_image(values: dict[str, str], offset: int) -> ImageMapping | None:
    """arm64's image: from the 2 MiB below `_stext` (where the image starts: its header,
    then text), physically `kimage_voffset` below its runtime addresses."""
    voffset = _number(values.get("NUMBER(kimage_voffset)"))
    stext = _hex(values.get("SYMBOL(_stext)"))
    if voffset is None or stext is None or stext < KERNEL_HALF:
        raise BadGuestKernel("VMCOREINFO without NUMBER(kimage_voffset) or a kernel _stext")
    if offset % SLIDE_ALIGN or offset >= MAX_ARM64_SLIDE:
        return None
    start = stext - stext % SLIDE_ALIGN
    if not 0 <= start - voffset < _PHYSICAL_LIMIT:
        return None
    return ImageMapping(start, IMAGE_AREA, voffset)


def check(info: VmcoreInfo, read: PhysicalRead) -> None:
    """Raise BadGuestKernel unless the kernel image `info` describes holds its release
    at `init_uts_ns` (a copy from an earlier boot, or a lie, does not)."""
    uts = info.symbol("init_uts_ns")
    if uts is None:
        raise BadGuestKernel("VMCOREINFO without SYMBOL(init_uts_ns)")
    where = info.physical(uts)
    try:
        found = _release(read(where, _UTS_READ), info.offset("uts_namespace.name"))
    except MemoryFault as fault:
        raise BadGuestKernel(f"VMCOREINFO's init_uts_ns ({where:#x}) is not in RAM") from fault
    if found != info.release.encode():
        raise BadGuestKernel(
            f"VMCOREINFO says {visible(info.release)}, the kernel it names says "
            f"{visible(found.decode('ascii', 'replace'))} (a copy from an earlier boot?)"
        )


def _release(uts: bytes, name: int | None) -> bytes:
    """The release in a uts_namespace: at its `name` (OFFSET(uts_namespace.name), from
    5.11), else after the first aligned "Linux" sysname (5.10 keeps a kref first)."""
    if name is None:
        found = (at for at in range(0, _MAX_NAME_OFFSET + 1, 4) if uts.startswith(_SYSNAME, at))
        name = next(found, 0)
    if not 0 <= name <= _MAX_NAME_OFFSET:
        return b""
    start = name + _RELEASE_IN_UTSNAME
    return uts[start : start + _RELEASE_SIZE].split(b"\0", 1)[0]


def _hex(value: str | None) -> int | None:
    if value is None or re.fullmatch(r"(0x)?[0-9a-fA-F]{1,16}", value) is None:
        return None
    return int(value, 16)


def _number(value: str | None) -> int | None:
    if value is None:
        return None
    if value.startswith("0x"):
        return _hex(value)
    return int(value) if re.fullmatch(r"-?[0-9]{1,20}", value) else None


#: Guest RAM is looked through in pieces of this size (page-aligned).
SCAN_CHUNK = 1 << 20
#: Candidates checked at most: a guest can fill its RAM with pages that look like one.
MAX_CANDIDATES = 256
_MARKERS = ((b"OSRELEASE=", 0), (_NOTE_NAME[:11], 12))
#: Where x86-64 Linux's memory zones begin, highest first: ZONE_NORMAL, ZONE_DMA32,
#: ZONE_DMA.
_ZONE_STARTS = (1 << 32, 16 << 20, 0)


def find(
    read: PhysicalRead, ranges: list[tuple[int, int]], hint: int | None = None
) -> tuple[int, VmcoreInfo]:
    """The first page of guest RAM (physical `ranges`, [start, end)) that holds a
    VMCOREINFO that checks, and what it says; `hint` (where it was last time) is tried
    first. Raises BadGuestKernel when none does, with the last candidate's reason."""
    problem = "no page of guest RAM holds a VMCOREINFO (Linux writes one from 6.0 on)"
    candidates = _candidates(read, ranges)
    if hint is not None:
        candidates = _chain([hint], candidates)
    tried = 0
    for page in candidates:
        try:
            text = page_text(read(page, PAGE_SIZE))
            if text is None:
                continue
            tried += 1
            info = parse(text)
            check(info, read)
        except (BadGuestKernel, MemoryFault) as err:
            problem = f"{tried} VMCOREINFO pages in guest RAM, none checks (the last: {err})"
            if tried >= MAX_CANDIDATES:
                break
            continue
        return page, info
    raise BadGuestKernel(problem)


def _chain(first: list[int], rest: Iterator[int]) -> Iterator[int]:
    yield from first
    yield from (page for page in rest if page not in first)


def scan_order(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`ranges` cut at Linux's x86-64 zone boundaries, the highest zone first, each in
    address order. The kernel allocates both VMCOREINFO pages early in boot, which the
    page allocator serves from near the start of the highest zone with memory (4 GiB
    up: seen 8 MiB past 4 GiB in a 4 GiB guest, whose RAM is scanned from 0 took 4 s;
    without RAM above 4 GiB, 16 MiB up): a guest of 64 GiB is not read almost whole."""
    order = []
    upper = None
    for floor in _ZONE_STARTS:
        for start, end in ranges:
            low, high = max(start, floor), end if upper is None else min(end, upper)
            if low < high:
                order.append((low, high))
        upper = floor
    return order


def _candidates(read: PhysicalRead, ranges: list[tuple[int, int]]) -> Iterator[int]:
    """Page starts where either copy's marker lies, in `scan_order`."""
    for start, end in scan_order(ranges):
        at = start - start % PAGE_SIZE
        while at < end:
            size = min(SCAN_CHUNK, end - at)
            try:
                chunk = read(at, size)
            except MemoryFault:
                at += size
                continue
            for marker, offset in _MARKERS:
                found = chunk.find(marker)
                while found >= 0:
                    if found % PAGE_SIZE == offset:
                        yield at + found - offset
                    found = chunk.find(marker, found + 1)
            at += size
