"""A Linux kernel as qmpprof uses a vmlinux, built from the guest's memory alone.

From a checked VMCOREINFO (guest/linux/vmcoreinfo.py), everything is read from the
kernel image through its own linear mapping (physical = virtual - START_KERNEL_MAP +
phys_base: no page tables needed):
- the symbols, from kallsyms (guest/linux/kallsyms.py; before 6.0 VMCOREINFO does not
  say where its tables are, and they are found by their shape: kallsyms_search.py):
  code symbols become the module's symbol table (each reaching to the next symbol, as
  /proc/kallsyms has no sizes), the others answer the OS adapter's and walkers'
  data-symbol lookups;
- the ORC unwind tables, between the `__start_orc_unwind*` / `__stop_orc_unwind*`
  symbols (`__start_orc_header` marks the 6.4 layout);
- the BTF, between `__start_BTF` and `__stop_BTF`, or found by its header where kallsyms
  has no data symbols (arm64: btf_search.py): the struct layouts.

All of it is placed at link addresses (runtime minus VMCOREINFO's KERNELOFFSET), so the
kernel is relocated by its slide exactly as a vmlinux is, and the IDT check of the slide
(record/relocation.py) checks this table too. What memory does not hold is not made
up: no inlined frames, no source lines, no code bytes.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from qmpprof.errors import BadBtf, BadGuestKernel, MemoryFault
from qmpprof.guest.adapter import KernelFacts, OsAdapter
from qmpprof.guest.btf import MAGIC, Btf
from qmpprof.guest.kernel_types import MemoryTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.arm64 import (
    PER_CPU_SECTION,
    PER_CPU_VARIABLES,
    Arm64LinuxAdapter,
    LinearMap,
    per_cpu_search_span,
)
from qmpprof.guest.linux.btf_search import find_btf
from qmpprof.guest.linux.kallsyms import (
    Kallsyms,
    KallsymsBytes,
    KallsymsTables,
    decode,
    read_tables,
)
from qmpprof.guest.linux.kallsyms_search import find_tables
from qmpprof.guest.linux.page_cache import LinearBases
from qmpprof.guest.linux.vmcoreinfo import IMAGE_AREA, PhysicalRead, VmcoreInfo
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import KERNEL_HALF, MemoryWindow
from qmpprof.modules import Module
from qmpprof.symbols.derived import FileKey, derived
from qmpprof.symbols.elf import (
    PackedColumn,
    PackedNames,
    PackedTable,
    Symbol,
    SymbolTable,
    pack,
    unpack,
)
from qmpprof.unwind.cfi import CfiTable
from qmpprof.unwind.orc import ENTRY_SIZE, Layout, OrcTable
from qmpprof.unwind.orc_mends import mend_error_entry_returns, mend_return_buffer_fills
from qmpprof.visible import visible

#: The name a kernel read from memory goes by (frames, summaries, captures).
NAME = "vmlinux"
#: What a path to it says: there is no file.
PATH = Path("[guest memory]")
_CODE_TYPES = frozenset("tTwW")
#: A BTF blob's first two bytes (little-endian 0xEB9F).
BTF_MAGIC = MAGIC.to_bytes(2, "little")
#: What a kernel without BTF lacks, and what gives it (the struct layouts).
NO_BTF = (
    "no BTF (processes and their files stay unnamed: --kernel VMLINUX or "
    "--debuginfod URL names them)"
)
#: The largest table read whole: Debian's ORC tables are 2.3 MB, its BTF 5 MB.
MAX_TABLE = 64 << 20
#: The most of the image searched for kallsyms (Debian's 5.10: text and rodata, 22 MB).
MAX_SEARCH = 64 << 20
_ORC_TABLES = ("__start_orc_unwind_ip", "__stop_orc_unwind_ip", "__start_orc_unwind")
_ORC_END = "__stop_orc_unwind"


@dataclass(frozen=True)
class GuestKernel:
    """The kernel read from guest memory, and what it told about itself."""

    info: VmcoreInfo
    module: Module
    adapter: OsAdapter
    types: MemoryTypes
    #: Whether the image holds BTF (its layouts are read from it only when asked).
    btf: bool

    def describe(self) -> str:
        """One line: which kernel, and what was found in its memory."""
        found = [f"{len(self.module.symbols):,} symbols"]
        found += ["ORC"] if self.module.orc is not None else ["no ORC (frame pointers)"]
        found += ["BTF"] if self.btf else [NO_BTF]
        return self.describe_from(f"guest memory: {', '.join(found)}")

    def describe_from(self, source: str) -> str:
        """One line: which kernel, from `source`, and its slide."""
        build = f" (build-id {self.info.build_id.hex()[:12]}…)" if self.info.build_id else ""
        return (
            f"kernel: {visible(self.info.release)}{build} from {source}; "
            f"KASLR slide {self.info.kernel_offset:#x}"
        )


class KernelImage:
    """The kernel image's memory, read by its runtime addresses."""

    def __init__(self, info: VmcoreInfo, read: PhysicalRead) -> None:
        self.info = info
        self._read = read

    def read(self, address: int, size: int) -> bytes:
        """Raises BadGuestKernel outside the image, MemoryFault outside RAM."""
        if not 0 <= size <= MAX_TABLE:
            raise BadGuestKernel(f"a table of {size} bytes in the kernel image: more than any")
        return self._read(self.info.physical(address), size)

    def read_linked(self, address: int, size: int) -> bytes:
        """What the vmlinux links at `address`, as the guest has it now."""
        return self.read((address + self.info.kernel_offset) % (1 << 64), size)


def read_guest_kernel(info: VmcoreInfo, read: PhysicalRead) -> GuestKernel:
    """The kernel VMCOREINFO `info` describes (checked already: vmcoreinfo.check).
    Raises BadGuestKernel when its symbols cannot be had; ORC and BTF are optional."""
    image = KernelImage(info, read)
    stext = info.symbol("_stext")
    if stext is None:
        raise BadGuestKernel("VMCOREINFO without SYMBOL(_stext)")
    table, key = _kallsyms(info, image, stext)
    orc = _orc(image, table, table.extent[1])
    btf = _btf_bytes(image, table)
    code, text = table.code, _text(image, table, lazily=orc is not None)
    if orc is not None:
        mend_error_entry_returns(orc, code, text, table.extent)
        mend_return_buffer_fills(orc, code, text)
    module = Module(
        NAME, PATH, code, CfiTable([]), text, None, info.build_id, table.extent, orc, isa=info.isa
    )
    # Layouts are cached under what they come from: these kallsyms and this BTF.
    digest = hashlib.sha256(key.build_id + hashlib.sha256(btf or b"").digest()).digest()
    types = MemoryTypes(table.variables, _lazy_btf(btf), FileKey(digest[:20], len(btf or b""), 0))
    adapter = _arm64_adapter(info, table, types) if info.isa == "aarch64" else None
    adapter = adapter or _adapter(table, types)
    return GuestKernel(info, module, adapter, types, btf is not None)


def _kallsyms(info: VmcoreInfo, image: KernelImage, stext: int) -> tuple[_Table, FileKey]:
    """The kernel's symbols, from the tables VMCOREINFO names or, before 6.0, the
    first tables of kallsyms' shape in the image that decode and check. Raises
    BadGuestKernel."""
    try:
        candidates = [KallsymsTables.from_symbols(info.symbol)]
    except BadGuestKernel:
        candidates = find_tables(image.read, *_search_span(info, stext))
    problem = BadGuestKernel("no kallsyms tables")
    for tables in candidates:
        try:
            return _checked_table(info, image, tables, stext)
        except BadGuestKernel as err:
            problem = err
    raise problem


def _search_span(info: VmcoreInfo, stext: int) -> tuple[int, int]:
    """Where kallsyms may be: the image's text and read-only data, which end before
    its data (init_uts_ns) starts; else as far as the image area goes."""
    uts = info.symbol("init_uts_ns")
    end = uts if uts is not None and stext < uts < stext + IMAGE_AREA else stext + IMAGE_AREA
    return stext, min(end, stext + MAX_SEARCH)


def _checked_table(
    info: VmcoreInfo, image: KernelImage, tables: KallsymsTables, stext: int
) -> tuple[_Table, FileKey]:
    """`tables` decoded (or their decoding from the derived cache), once `_stext` and
    `init_uts_ns` are where VMCOREINFO says. Raises BadGuestKernel."""
    raw = read_tables(tables, image.read)
    slide = info.kernel_offset
    key = FileKey(raw.digest(slide), raw.count, 0)
    table = derived(key, _KIND, lambda: _Table.decode(raw, stext, slide), _plain, _table)
    if table.names.find("_stext") != info.link_address(stext):
        raise BadGuestKernel("kallsyms' _stext is not VMCOREINFO's")
    # Without CONFIG_KALLSYMS_ALL (Debian's arm64) kallsyms has no data symbols.
    uts, listed = info.symbol("init_uts_ns"), table.names.find("init_uts_ns")
    if uts is not None and listed is not None and listed != info.link_address(uts):
        raise BadGuestKernel("kallsyms' init_uts_ns is not VMCOREINFO's")
    return table, key


class _Table:
    """kallsyms at link addresses (per-CPU symbols, absolute and below the kernel half,
    stay as they are; the rest move back by the slide), looked up by name, and its code
    symbols as a SymbolTable, each reaching to the next symbol of any kind."""

    def __init__(self, names: _Names, code: SymbolTable, extent: tuple[int, int]) -> None:
        self.names, self.code, self.extent = names, code, extent

    @classmethod
    def decode(cls, raw: KallsymsBytes, stext: int, slide: int) -> _Table:
        """Raises BadGuestKernel."""
        found = decode(raw, stext)
        linked = [a - slide if a >= KERNEL_HALF else a for a in found.addresses]
        kallsyms = Kallsyms(linked, found.types, found.names)
        names = _Names.of(zip(kallsyms.names, kallsyms.addresses, strict=True))
        start, end = names.find("_stext"), names.find("_etext")
        if start is None or end is None or not start < end <= start + IMAGE_AREA:
            raise BadGuestKernel("kallsyms has no _etext after _stext")
        # Boot code (start_kernel) is still on the boot CPU's idle stack: its ORC stays.
        init = names.find("_einittext") or end
        end = init if end < init <= start + IMAGE_AREA else end
        return cls(names, SymbolTable(NAME, _code_symbols(kallsyms, end)), (start, end))

    def variables(self, names: Collection[str]) -> dict[str, int]:
        """The link address of each of `names` kallsyms has (the first of a name)."""
        found = {}
        for name in set(names):
            address = self.names.find(name)
            if address is not None:
                found[name] = address
        return found


class _Names:
    """The first address of each name kallsyms has, found by a binary search of the
    names in order (PackedNames: the derived cache loads a few objects, not 100,000)."""

    def __init__(self, names: PackedNames, addresses: Sequence[int]) -> None:
        """Name i, in order, is first at addresses[i]. Raises ValueError for columns of
        different lengths."""
        if len(names) != len(addresses):
            raise ValueError("kallsyms' names and addresses do not fit")
        self._names, self._addresses = names, addresses

    @classmethod
    def of(cls, symbols: Iterable[tuple[str, int]]) -> _Names:
        """From (name, address) pairs, in kallsyms' order: the first of a name is kept."""
        first: dict[str, int] = {}
        for name, address in symbols:
            first.setdefault(name, address)
        ordered = sorted(first)
        return cls(PackedNames.of(ordered), [first[name] for name in ordered])

    def find(self, name: str) -> int | None:
        """The address of the first symbol called `name`."""
        index = bisect.bisect_left(self._names, name)
        if index < len(self._names) and self._names[index] == name:
            return self._addresses[index]
        return None

    def plain(self) -> tuple[str, bytes, PackedColumn]:
        return (*self._names.plain(), pack(self._addresses))

    @classmethod
    def from_plain(cls, text: object, starts: object, addresses: object) -> _Names:
        """Raises ValueError or TypeError for data of another shape."""
        return cls(PackedNames.from_plain(text, starts), unpack(addresses))


def _code_symbols(kallsyms: Kallsyms, end: int) -> list[Symbol]:
    """The code symbols, each up to the next symbol of any kind (the last to `end`)."""
    starts = sorted({a for a in kallsyms.addresses if a >= KERNEL_HALF})
    symbols = []
    for at, kind, name in zip(kallsyms.addresses, kallsyms.types, kallsyms.names, strict=True):
        if kind not in _CODE_TYPES or at < KERNEL_HALF:
            continue
        index = bisect.bisect_right(starts, at)
        following = starts[index] if index < len(starts) else max(end, at + 1)
        symbols.append(Symbol(name, at, following - at))
    return symbols


#: The derived cache's kind for a _Table: not the earlier "guest-kallsyms" (every name
#: and address a list item), so an older qmpprof sharing the cache keeps its own entry.
_KIND = "guest-kallsyms-2"
_PlainTable = tuple[str, bytes, PackedColumn, PackedTable, tuple[int, int]]


def _plain(table: _Table) -> _PlainTable:
    return (*table.names.plain(), table.code.packed(), table.extent)


def _table(plain: _PlainTable) -> _Table:
    text, starts, addresses, code, (start, end) = plain
    names = _Names.from_plain(text, starts, addresses)
    return _Table(names, SymbolTable.from_packed(NAME, code), (int(start), int(end)))


def _text(image: KernelImage, table: _Table, lazily: bool) -> MemoryReader:
    """The kernel's text as it runs (alternatives applied), for the unwinder's checks of a
    return address; its boot code is freed, so not read. `lazily`: read on the first
    read of it (_LazyText)."""
    span = _span(table, "_stext", "_etext")
    if lazily and span is not None:
        return _LazyText(image, span)
    return _text_now(image, span)


def _text_now(image: KernelImage, span: tuple[int, int] | None) -> WindowMemory:
    try:
        data = image.read_linked(*span) if span is not None else b""
    except (MemoryFault, BadGuestKernel):
        data = b""
    return WindowMemory([MemoryWindow(span[0], data)] if span and data else [])


class _LazyText:
    """The kernel's text, read a 64 KiB piece at a time when first read inside it.

    With ORC, only a frame-pointer step or a call check of a kernel frame reads it (the
    return-site check of a frame with ORC does not: address_space.ReturnSites), while the
    sample is unwound, and the mends of ORC's rows read the 64 KiB around `error_entry`
    and the start of each return stack buffer filler (unwind/orc_mends.py): it is 15 MB
    of guest memory, and read whole it took a tenth of a warm `qmpprof dump`. Without
    ORC it is read at once, as symbolize's return-site checks may read it once the
    guest's memory is closed."""

    def __init__(self, image: KernelImage, span: tuple[int, int]) -> None:
        self._image = image
        self._base, self._end = span[0], span[0] + span[1]
        self._pieces: dict[int, bytes] = {}  # at most the text's size / _TEXT_PIECE

    def read(self, address: int, size: int) -> bytes:
        if not (address - self._base >= 0 and address + size <= self._end and size > 0):
            raise MemoryFault(address, max(size, 1))  # outside the text: as WindowMemory says
        first = (address - self._base) // _TEXT_PIECE
        last = (address + size - 1 - self._base) // _TEXT_PIECE
        pieces = b"".join(self._piece(index) for index in range(first, last + 1))
        offset = address - self._base - first * _TEXT_PIECE
        data = pieces[offset : offset + size]
        if len(data) != size:  # a piece that did not read
            raise MemoryFault(address, size)
        return data

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def _piece(self, index: int) -> bytes:
        piece = self._pieces.get(index)
        if piece is None:
            start = self._base + index * _TEXT_PIECE
            try:
                piece = self._image.read_linked(start, min(_TEXT_PIECE, self._end - start))
            except (MemoryFault, BadGuestKernel):
                piece = b""
            self._pieces[index] = piece
        return piece


_TEXT_PIECE = 1 << 16


def _span(table: _Table, first: str, last: str) -> tuple[int, int] | None:
    start, stop = table.names.find(first), table.names.find(last)
    if start is None or stop is None or not 0 <= stop - start <= MAX_TABLE:
        return None
    return start, stop - start


def _orc(image: KernelImage, table: _Table, end: int) -> OrcTable | None:
    """The kernel's ORC tables; None when kallsyms does not name them or they do not
    read (the kernel is then unwound by frame pointers, as without ORC)."""
    ips = _span(table, _ORC_TABLES[0], _ORC_TABLES[1])
    entries = _span(table, _ORC_TABLES[2], _ORC_END)
    if ips is None or entries is None or ips[1] // 4 != entries[1] // ENTRY_SIZE:
        return None
    try:
        offsets, data = image.read_linked(*ips), image.read_linked(*entries)
    except (MemoryFault, BadGuestKernel):
        return None
    layout = Layout.FROM_6_4 if table.names.find("__start_orc_header") else Layout.BEFORE_6_4
    return OrcTable(offsets, ips[0], data, layout, end)


def _btf_bytes(image: KernelImage, table: _Table) -> bytes | None:
    """The BTF in the kernel's image (`__start_BTF`..`__stop_BTF`), if it has one that
    starts as BTF does; without those symbols, the first BTF in its read-only data
    (guest/linux/btf_search.py)."""
    span = _span(table, "__start_BTF", "__stop_BTF")
    if span is None:
        rodata = table.names.find("_etext")
        if rodata is None:
            return None
        init = table.names.find("_sinittext")
        end = init if init is not None and rodata < init else rodata + MAX_SEARCH
        return find_btf(image.read_linked, rodata, min(end, rodata + MAX_SEARCH))
    try:
        data = image.read_linked(*span)
    except (MemoryFault, BadGuestKernel):
        return None
    return data if data[:2] == BTF_MAGIC else None


def _lazy_btf(data: bytes | None) -> Callable[[], Btf | None]:
    """The BTF indexed on first use (a tenth of a second: not needed when every layout
    asked for is in the derived cache); None when it does not read."""

    @functools.cache
    def indexed() -> Btf | None:
        try:
            return Btf(data) if data is not None else None
        except BadBtf:
            return None

    return indexed


def _adapter(table: _Table, types: MemoryTypes) -> OsAdapter:
    wanted = LinuxAdapter.probe_symbols
    facts = KernelFacts(PATH, table.variables(wanted), frozenset(), types)
    return LinuxAdapter.from_facts(facts)


def _arm64_adapter(info: VmcoreInfo, table: _Table, types: MemoryTypes) -> OsAdapter | None:
    """An arm64 kernel's adapter (guest/linux/arm64.py), when its BTF and VMCOREINFO
    give what it reads."""
    btf, linear = types.btf(), _linear_map(info)
    uts, init_end = info.symbol("init_uts_ns"), table.names.find("_einittext")
    if btf is None or linear is None or uts is None or init_end is None:
        return None
    search = per_cpu_search_span(init_end, info.link_address(uts))
    per_cpu = btf.section_variables(PER_CPU_SECTION, set(PER_CPU_VARIABLES))
    adapter = None if search is None else Arm64LinuxAdapter.of(types, per_cpu, search, linear)
    if adapter is not None:
        adapter.linear_bases = linear_bases(info)
    return adapter


def _linear_map(info: VmcoreInfo) -> LinearMap | None:
    """Where an arm64 kernel maps all of RAM: PAGE_OFFSET (from VA_BITS) up is
    PHYS_OFFSET up, over half the kernel's address space."""
    va_bits, phys_offset = info.number("VA_BITS"), info.number("PHYS_OFFSET")
    if va_bits is None or phys_offset is None or not 36 <= va_bits <= 52:
        return None
    return LinearMap(-(1 << va_bits) % (1 << 64), 1 << (va_bits - 1), phys_offset)


def linear_bases(info: VmcoreInfo) -> LinearBases | None:
    """An arm64 kernel's vmemmap and linear map, from its VMCOREINFO's numbers."""
    linear, vmemmap = _linear_map(info), info.number("VMEMMAP_START")
    if linear is None or vmemmap is None:
        return None
    return LinearBases(vmemmap, linear.page_offset, linear.phys_offset)
