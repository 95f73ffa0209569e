"""Where modules lie in one guest address space, and lookups routed through them.

A `Mapping` puts a module's file at guest addresses [start, end) with a bias:
guest address = file address + bias (zero for a binary running where it was linked;
a KASLR kernel, a PIE program or a shared library has its own). An `AddressSpace` is the
list of mappings one sample can run in; the unwinder asks it for CFI rows and code bytes
at guest addresses, the symbolizer for names, each translated to file addresses once.
"""

from __future__ import annotations

import bisect
from collections import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qmpprof.errors import MemoryFault
from qmpprof.isa.registry import ISAS
from qmpprof.model import KERNEL_HALF, FileMapping, KernelModule, MappedFile
from qmpprof.modules import Module, unread_file, unread_module
from qmpprof.symbols.elf import SymbolTable
from qmpprof.unwind.rules import UnwindRow

#: One past the highest x86-64 address.
ADDRESS_END = 1 << 64
#: One past the highest 32-bit address, and the start of its upper half.
ADDRESS_END_32 = 1 << 32
UPPER_HALF_32 = 1 << 31
GIGABYTE = 1 << 30


@dataclass(frozen=True)
class Mapping:
    """A module's file seen at guest addresses [start, end), shifted by `bias`."""

    module: Module
    start: int
    end: int
    bias: int = 0
    #: The process map's entry that put the file exactly at [start, end); None for a
    #: range assumed for it (the upper or lower half, a kernel module's text).
    source: FileMapping | None = None
    #: The kernel or one of its modules: its frames are kernel frames.
    kernel: bool = False

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end

    def file_address(self, address: int) -> int:
        return address - self.bias


def kernel_mapping(kernel: Module, bias: int = 0) -> Mapping:
    """A kernel linked in the upper half as the whole upper half: with no kernel modules
    known, any address there outside its code is garbage, not someone else's code. A
    32-bit kernel linked in the upper half covers the gigabyte it starts in and those
    above (Linux's 3G/1G split: 0xc0000000 up). A kernel linked low (a unikernel,
    firmware) covers just its own code."""
    start, end = kernel.extent[0] + bias, kernel.extent[1] + bias
    if start >= KERNEL_HALF or end <= start:
        return Mapping(kernel, KERNEL_HALF, ADDRESS_END, bias, kernel=True)
    if kernel.word == 4 and start >= UPPER_HALF_32 and end <= ADDRESS_END_32:
        return Mapping(kernel, start & ~(GIGABYTE - 1), ADDRESS_END_32, bias, kernel=True)
    return Mapping(kernel, start, end, bias, kernel=True)


def kernel_mappings(
    kernel: Module,
    bias: int = 0,
    loaded: Sequence[KernelModule] = (),
    files: abc.Mapping[str, Module] | None = None,
) -> list[Mapping]:
    """The kernel's mapping with its `loaded` modules cut out of it, each mapped at its
    text: from its file (`files`, by name: symbols/kernel_object.py) when that fits in
    the text, else by name alone (`unread_module`). `loaded` must be sorted and
    disjoint, and not overlap the kernel's own code (Analyzer.place_kernel_modules
    makes it so)."""
    whole = kernel_mapping(kernel, bias)
    inside = [m for m in loaded if whole.start <= m.base and m.end <= whole.end]
    if not inside:
        return [whole]
    edges = [whole.start, *(x for m in inside for x in (m.base, m.end)), whole.end]
    pieces = [
        Mapping(kernel, start, end, bias, kernel=True)
        for start, end in zip(edges[::2], edges[1::2], strict=True)
    ]
    modules = [
        Mapping(_module_of(m, files or {}), m.base, m.end, m.base, kernel=True) for m in inside
    ]
    return [*(p for p in pieces if p.start < p.end), *modules]


def _module_of(loaded: KernelModule, files: abc.Mapping[str, Module]) -> Module:
    file = files.get(loaded.name)
    if file is not None and file.extent[1] <= loaded.size:
        return file
    return unread_module(loaded)


def user_mapping(user: Module, bias: int = 0, taken: Mapping | None = None) -> list[Mapping]:
    """A user program as the whole lower half (shared libraries are not mapped yet), but
    for the part `taken` by a kernel linked low."""
    whole = Mapping(user, 0, KERNEL_HALF, bias)
    if taken is None or taken.start >= KERNEL_HALF:
        return [whole]
    parts = [(0, taken.start), (taken.end, KERNEL_HALF)]
    return [Mapping(user, start, end, bias) for start, end in parts if start < end]


def file_mappings(
    maps: Iterable[FileMapping],
    module_for: abc.Callable[[FileMapping], Module | None],
    word: int = 8,
) -> list[Mapping]:
    """A process's executable file mappings, each with the host copy `module_for` finds
    (placed so that the file offset the mapping starts at lands on its start), or, with
    none, a module that knows only the file's name (`unread_file`, its code `word`
    bytes wide: 4 for a 32-bit process). Mappings outside the lower half, empty, or
    overlapping one before them are left out: guest data is hostile."""
    placed: list[Mapping] = []
    for found in sorted(maps, key=lambda m: m.start):
        if not 0 <= found.start < found.end <= KERNEL_HALF:
            continue
        if placed and placed[-1].end > found.start:
            continue
        module = module_for(found)
        bias = module.bias_in(found) if module is not None else None
        if module is None or bias is None:
            module, bias = unread_file(found, word), found.start - found.offset
        placed.append(Mapping(module, found.start, found.end, bias, found))
    return placed


class AddressSpace:
    """The mappings one sample can run in, found by address (they must not overlap).

    `use_orc`: unwind a module that has ORC tables (a Linux kernel) with them, and with
    its DWARF CFI only where ORC says nothing."""

    def __init__(self, mappings: Iterable[Mapping], use_orc: bool = True) -> None:
        self.use_orc = use_orc
        self.mappings = tuple(sorted(mappings, key=lambda m: m.start))
        for before, after in zip(self.mappings, self.mappings[1:], strict=False):
            if after.start < before.end:
                raise ValueError(f"{after.module.name} overlaps {before.module.name}")
        self._starts = [m.start for m in self.mappings]
        self.code = ModuleCode(self)
        self.return_sites = ReturnSites(self)
        #: Rows by guest address: asked for every frame of every sample, and a
        #: profile's PCs repeat (a kernel's ORC search is some twenty Python probes).
        self._rows: dict[int, UnwindRow | None] = {}
        #: Words by guest address: asked at every frame-pointer step where modules of
        #: both words are mapped (a 32-bit program under a 64-bit kernel).
        self._words: dict[int, int | None] = {}
        self._all_words = frozenset(m.module.word for m in self.mappings)
        #: Where the kernel's half starts: a 32-bit kernel's upper gigabytes, else x86-64's.
        #: A kernel mapped up to the top covers a half; its modules cut it into pieces.
        kernel = [m.start for m in self.mappings if m.kernel]
        whole = any(m.kernel and m.end in (ADDRESS_END, ADDRESS_END_32) for m in self.mappings)
        self._kernel_floor = min(kernel) if whole else KERNEL_HALF

    def mapping_at(self, address: int) -> Mapping | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        mapping = self.mappings[index]
        return mapping if address < mapping.end else None

    def row_for(self, address: int) -> UnwindRow | None:
        """The CFI row for a guest address (unwind.unwinder.CfiLookup)."""
        row = self._rows.get(address, False)
        if row is False:
            if len(self._rows) >= MAX_ROWS:
                self._rows.clear()
            row = self._rows[address] = self._row_at(address)
        return row  # type: ignore[return-value]

    def _row_at(self, address: int) -> UnwindRow | None:
        mapping = self.mapping_at(address)
        if mapping is None:
            return None
        module, file_address = mapping.module, mapping.file_address(address)
        if self.use_orc and module.orc is not None:
            row = module.orc.row_for(file_address)
            if row is not None:
                return row
        return module.cfi.row_for(file_address)

    def word_size(self, address: int) -> int | None:
        """The word of the module mapped at `address` (8, or 4 for i386 code), None
        where none is (unwind.unwinder.CfiLookup)."""
        word = self._words.get(address, 0)
        if word == 0:
            if len(self._words) >= MAX_ROWS:
                self._words.clear()
            mapping = self.mapping_at(address)
            word = self._words[address] = mapping.module.word if mapping is not None else None
        return word

    def words(self) -> frozenset[int]:
        """The words of the modules mapped (unwind.unwinder.CfiLookup)."""
        return self._all_words

    def starts_function(self, address: int) -> bool:
        """Whether a symbol of the module mapped there (an assembly label included)
        starts at `address`."""
        found = self.symbols_at(address)
        return found is not None and found[0].starts_at(address - found[1])

    def function_start(self, address: int) -> int | None:
        """Where the symbol around `address` (an enclosing function's, not a label's)
        starts, in the module mapped there."""
        found = self.symbols_at(address)
        named = found[0].lookup(address - found[1]) if found is not None else None
        return None if named is None else address - named[1]

    def symbols_at(self, address: int) -> tuple[SymbolTable, int] | None:
        """The symbols of the module mapped at `address` and its bias (SymbolSource)."""
        mapping = self.mapping_at(address)
        return (mapping.module.symbols, mapping.bias) if mapping is not None else None

    @property
    def kernel_floor(self) -> int:
        """Where the kernel's half starts: x86-64's, or a 32-bit kernel's upper gigabytes."""
        return self._kernel_floor

    def in_kernel(self, address: int) -> bool:
        """Whether `address` is the kernel's (SymbolSource): in a kernel mapping, or in
        none and at or above where the kernel's upper half starts."""
        mapping = self.mapping_at(address)
        return mapping.kernel if mapping is not None else address >= self._kernel_floor

    def file_at(self, address: int) -> MappedFile | None:
        """The file a process map puts at `address` (SymbolSource)."""
        mapping = self.mapping_at(address)
        if mapping is None or mapping.source is None:
            return None
        offset = address - mapping.start + mapping.source.offset
        return MappedFile(mapping.module.name, offset, mapping.source)


class ModuleCode:
    """The mapped modules' code bytes read at guest addresses (a MemoryReader); the
    frame-pointer unwinder and the return-site check read instructions here."""

    def __init__(self, space: AddressSpace) -> None:
        self._space = space

    def read(self, address: int, size: int) -> bytes:
        mapping = self._space.mapping_at(address)
        if mapping is None:
            raise MemoryFault(address, size)
        try:
            return mapping.module.code.read(mapping.file_address(address), size)
        except MemoryFault:
            raise MemoryFault(address, size) from None

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


#: Unwind rows kept per address space, by address.
MAX_ROWS = 1 << 14
#: Return-site answers kept per address space (a profile meets a few thousand).
MAX_RETURN_SITES = 1 << 14


class ReturnSites:
    """Whether an address can be a return address, remembered: asked for every frame of
    every sample, and the modules' code never changes."""

    def __init__(self, space: AddressSpace) -> None:
        self._space = space
        self._known: dict[int, bool | None] = {}

    def check(self, address: int) -> bool | None:
        """True if a call ends right before `address` in a mapped module's code; False if
        a module is mapped there but this is not after a call (or not its code): garbage
        or a torn stack; None when no module is mapped there."""
        if address in self._known:
            return self._known[address]
        if len(self._known) >= MAX_RETURN_SITES:
            self._known.clear()
        known = self._known[address] = self._decode(address)
        return known

    def _decode(self, address: int) -> bool | None:
        mapping = self._space.mapping_at(address)
        if mapping is None or not mapping.module.has_code:
            return None
        if mapping.module.orc is not None:
            # A Linux kernel rewrites its code at boot (alternatives, paravirt and static
            # calls): where the file has `call *pv_ops` the guest runs a shorter direct
            # call, so the file cannot judge its return addresses. Its ORC is exact.
            return None
        try:
            self._space.code.read(address - 1, 1)
        except MemoryFault:
            return False
        return ISAS[mapping.module.isa].follows_call(self._space.code, address)
