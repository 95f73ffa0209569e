"""A Linux kernel as qmpprof uses a vmlinux, built from the guest's memory alone.

From a checked VMCOREINFO (guest/linux/vmcoreinfo.py), everything is read from the
kernel image through its own linear mapping (physical = virtual - START_KERNEL_MAP +
phys_base: no page tables needed):
- the symbols, from kallsyms (guest/linux/kallsyms.py): code symbols become the
  module's symbol table (each reaching to the next symbol, as /proc/kallsyms has no
  sizes), the others answer the OS adapter's and walkers' data-symbol lookups;
- the ORC unwind tables, between the `__start_orc_unwind*` / `__stop_orc_unwind*`
  symbols (`__start_orc_header` marks the 6.4 layout);
- the BTF, between `__start_BTF` and `__stop_BTF`: the struct layouts.

All of it is placed at link addresses (runtime minus VMCOREINFO's KERNELOFFSET), so the
kernel is relocated by its slide exactly as a vmlinux is, and the IDT check of the slide
(record/relocation.py) checks this table too. What memory does not hold is not made
up: no inlined frames, no source lines, no code bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from qmpprof.errors import BadBtf, BadGuestKernel, MemoryFault
from qmpprof.guest.adapter import KernelFacts, OsAdapter
from qmpprof.guest.btf import Btf
from qmpprof.guest.kernel_types import MemoryTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.kallsyms import Kallsyms, KallsymsTables, read_kallsyms
from qmpprof.guest.linux.vmcoreinfo import IMAGE_AREA, PhysicalRead, VmcoreInfo
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_HALF
from qmpprof.modules import Module
from qmpprof.symbols.elf import Symbol, SymbolTable
from qmpprof.unwind.cfi import CfiTable
from qmpprof.unwind.orc import ENTRY_SIZE, Layout, OrcTable
from qmpprof.visible import visible

#: The name a kernel read from memory goes by (frames, summaries, captures).
NAME = "vmlinux"
#: What a path to it says: there is no file.
PATH = Path("[guest memory]")
_CODE_TYPES = frozenset("tTwW")
#: The largest table read whole: Debian's ORC tables are 2.3 MB, its BTF 5 MB.
MAX_TABLE = 64 << 20
_ORC_TABLES = ("__start_orc_unwind_ip", "__stop_orc_unwind_ip", "__start_orc_unwind")
_ORC_END = "__stop_orc_unwind"


@dataclass(frozen=True)
class GuestKernel:
    """The kernel read from guest memory, and what it told about itself."""

    info: VmcoreInfo
    module: Module
    adapter: OsAdapter
    types: MemoryTypes
    symbols: int
    orc: bool
    btf: bool

    def describe(self) -> str:
        """One line: which kernel, and what was found in its memory."""
        build = f" (build-id {self.info.build_id.hex()[:12]}…)" if self.info.build_id else ""
        found = [f"{self.symbols:,} symbols"]
        found += ["ORC"] if self.orc else ["no ORC (frame pointers)"]
        found += ["BTF"] if self.btf else ["no BTF (no process names)"]
        return (
            f"kernel: {visible(self.info.release)}{build} from guest memory: {', '.join(found)}; "
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


def read_guest_kernel(info: VmcoreInfo, read: PhysicalRead) -> GuestKernel:
    """The kernel VMCOREINFO `info` describes (checked already: vmcoreinfo.check).
    Raises BadGuestKernel when its symbols cannot be had; ORC and BTF are optional."""
    image = KernelImage(info, read)
    stext = info.symbol("_stext")
    if stext is None:
        raise BadGuestKernel("VMCOREINFO without SYMBOL(_stext)")
    kallsyms = read_kallsyms(KallsymsTables.from_symbols(info.symbol), image.read, stext)
    table = _Table(kallsyms, info.kernel_offset)
    start, end = table.link("_stext"), table.link("_etext")
    if start is None or end is None or not start < end <= start + IMAGE_AREA:
        raise BadGuestKernel("kallsyms has no _etext after _stext")
    orc = _orc(image, table, end)
    btf = _btf(image, table)
    symbols = table.code_symbols(end)
    code = SymbolTable(NAME, symbols)
    empty = WindowMemory(())
    module = Module(NAME, PATH, code, CfiTable([]), empty, None, info.build_id, (start, end), orc)
    types = MemoryTypes(table.variables, btf)
    adapter = _adapter(table, types)
    return GuestKernel(info, module, adapter, types, len(symbols), orc is not None, btf is not None)


class _Table:
    """kallsyms at link addresses: per-CPU symbols (absolute, below the kernel half)
    stay as they are; everything else moves back by the slide."""

    def __init__(self, kallsyms: Kallsyms, slide: int) -> None:
        self.kallsyms = kallsyms
        self._slide = slide

    def _link(self, address: int) -> int:
        return address - self._slide if address >= KERNEL_HALF else address

    def link(self, name: str) -> int | None:
        found = self.kallsyms.find(name)
        return None if found is None else self._link(found)

    def variables(self, names: Collection[str]) -> dict[str, int]:
        """The link address of each of `names` kallsyms has (the first of a name)."""
        wanted, found = set(names), {}
        for address, name in zip(self.kallsyms.addresses, self.kallsyms.names, strict=True):
            if name in wanted and name not in found:
                found[name] = self._link(address)
        return found

    def code_symbols(self, end: int) -> list[Symbol]:
        """The code symbols, each up to the next symbol of any kind (the last to `end`)."""
        k = self.kallsyms
        starts = sorted({self._link(a) for a in k.addresses if a >= KERNEL_HALF})
        symbols = []
        for address, kind, name in zip(k.addresses, k.types, k.names, strict=True):
            if kind not in _CODE_TYPES or address < KERNEL_HALF:
                continue
            at = self._link(address)
            index = bisect.bisect_right(starts, at)
            following = starts[index] if index < len(starts) else end
            symbols.append(Symbol(name, at, max(min(following, max(end, at + 1)) - at, 1)))
        return symbols


def _span(table: _Table, first: str, last: str) -> tuple[int, int] | None:
    start, stop = table.kallsyms.find(first), table.kallsyms.find(last)
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
        offsets, data = image.read(*ips), image.read(*entries)
    except (MemoryFault, BadGuestKernel):
        return None
    layout = Layout.FROM_6_4 if table.kallsyms.find("__start_orc_header") else Layout.BEFORE_6_4
    base = ips[0] - image.info.kernel_offset  # the ip offsets are relative to themselves
    return OrcTable(offsets, base, data, layout, end)


def _btf(image: KernelImage, table: _Table) -> Btf | None:
    span = _span(table, "__start_BTF", "__stop_BTF")
    if span is None:
        return None
    try:
        return Btf(image.read(*span))
    except (MemoryFault, BadGuestKernel, BadBtf):
        return None


def _adapter(table: _Table, types: MemoryTypes) -> OsAdapter:
    wanted = LinuxAdapter.probe_symbols
    facts = KernelFacts(PATH, table.variables(wanted), frozenset(), types)
    return LinuxAdapter.from_facts(facts)
