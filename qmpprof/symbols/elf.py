"""Function symbols of one ELF file, looked up by address with bisection."""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import itertools
import re
import struct
import sys
from array import array
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from qmpprof.symbols.derived import FileKey, derived, kind_for
from qmpprof.symbols.elf_file import open_elf

_T = TypeVar("_T")
_STT_NOTYPE, _STT_OBJECT, _STT_FUNC = 0, 1, 2
_CODE_TYPES = frozenset({_STT_NOTYPE, _STT_FUNC})
#: Arm's mapping symbols ($x: A64 code from here, $d: data, $a and $t: A32 and T32, each
#: maybe with a suffix, "$x.12"): they mark what the bytes are, they name no function.
_MAPPING_SYMBOL = re.compile(r"\$[adtx](?:\..*)?", re.DOTALL)
_SHF_EXECINSTR = 0x4
#: Section indexes from here up are special (absolute, common, ...), not sections.
_SHN_LORESERVE = 0xFF00


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int
    size: int
    #: An assembly label (no size in the ELF): its size is the rest of its section.
    label: bool = False


#: A symbol table as plain data (the derived cache's): starts, names, sizes, the indexes
#: of labels, and each label inside a sized function with that function's index.
PlainTable = tuple[list[int], list[str], list[int], list[int], list[tuple[int, int]]]
#: A numeric column packed for the derived cache: 64-bit words, or a list where a value
#: does not fit.
PackedColumn = bytes | list[int]
#: A symbol table packed (`SymbolTable.packed`): its names run together and where each
#: starts, its starts and sizes, then labels and enclosing functions as in PlainTable.
#: Loading one makes a few objects instead of three per symbol.
PackedTable = tuple[str, bytes, PackedColumn, PackedColumn, list[int], list[tuple[int, int]]]


def pack(values: Iterable[int]) -> PackedColumn:
    """`values` as 64-bit words, or a list when one is negative or wider."""
    listed = list(values)
    try:
        return array("Q", listed).tobytes()
    except OverflowError:
        return listed


def unpack(column: object) -> Sequence[int]:
    """A `pack`ed column. Raises TypeError or ValueError for anything else."""
    if isinstance(column, bytes):
        return array("Q", column)
    if isinstance(column, list) and all(isinstance(value, int) for value in column):
        return column
    raise TypeError("not a packed column")


class PackedNames(Sequence[str]):
    """Names run together in one string, each made a str only when asked for."""

    def __init__(self, text: str, starts: Sequence[int]) -> None:
        """Name i is text[starts[i]:starts[i + 1]]. Raises ValueError when `starts` does
        not span `text`."""
        if not starts or starts[0] != 0 or starts[-1] != len(text):
            raise ValueError("names and where they start do not fit")
        self._text, self._starts = text, starts

    @classmethod
    def of(cls, names: Iterable[str]) -> PackedNames:
        listed = list(names)
        return cls("".join(listed), array("Q", itertools.accumulate(map(len, listed), initial=0)))

    def plain(self) -> tuple[str, bytes]:
        return self._text, array("Q", self._starts).tobytes()

    @classmethod
    def from_plain(cls, text: object, starts: object) -> PackedNames:
        """From `plain()`'s data; raises TypeError or ValueError for data of another shape."""
        if not isinstance(text, str) or not isinstance(starts, bytes):
            raise TypeError("packed names are a string and where each starts")
        return cls(text, array("Q", starts))

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("name index out of range")
        return self._text[self._starts[index] : self._starts[index + 1]]

    def index(self, value: Any, start: int = 0, stop: int = sys.maxsize) -> int:
        """The first index of `value`: found by searching the text (in C), not by making
        each name a string to compare."""
        if not isinstance(value, str) or not value or start or stop != sys.maxsize:
            return super().index(value, start, stop)
        at = self._text.find(value)
        while at >= 0:
            index = bisect.bisect_right(self._starts, at) - 1  # the names before are shorter
            if self._starts[index] == at and self._starts[index + 1] == at + len(value):
                return index
            at = self._text.find(value, at + 1)
        raise ValueError(f"{value!r} is not a name here")


class SymbolTable:
    """The code symbols of one module, sorted by address.

    A symbol covers [address, address + size); the loader gives a zero-size symbol
    (an assembly label) the rest of its section, and the lookup takes the nearest
    symbol below an address, so a label covers up to the next symbol. Kept as columns
    and made a Symbol only when looked up: a kernel has 50,000 and a sample needs a few.
    """

    def __init__(self, name: str, symbols: list[Symbol]) -> None:
        ordered = sorted(_dedupe(symbols), key=lambda s: s.address)
        labels = [index for index, symbol in enumerate(ordered) if symbol.label]
        columns = (
            [s.address for s in ordered],
            [s.name for s in ordered],
            [s.size for s in ordered],
            labels,
            _enclosing_functions(ordered),
        )
        self._set(name, columns)

    @classmethod
    def from_plain(cls, name: str, plain: PlainTable) -> SymbolTable:
        """A table from `plain()`'s data; raises TypeError or ValueError for data of
        another shape."""
        table = cls.__new__(cls)
        table._set(name, plain)
        return table

    @classmethod
    def from_packed(cls, name: str, packed: PackedTable) -> SymbolTable:
        """A table from `packed()`'s data; raises TypeError or ValueError for data of
        another shape."""
        text, name_starts, starts, sizes, labels, enclosing = packed
        names = PackedNames.from_plain(text, name_starts)
        table = cls.__new__(cls)
        table._set(name, (unpack(starts), names, unpack(sizes), labels, enclosing))
        return table

    def _set(
        self,
        name: str,
        columns: tuple[
            Sequence[int], Sequence[str], Sequence[int], list[int], list[tuple[int, int]]
        ],
    ) -> None:
        starts, names, sizes, labels, enclosing = columns
        if not len(starts) == len(names) == len(sizes):
            raise ValueError("symbol columns of different lengths")
        self.name = name
        self._starts, self._names, self._sizes = starts, names, sizes
        self._labels = frozenset(labels)
        self._enclosing = dict(enclosing)

    def plain(self) -> PlainTable:
        enclosing = list(self._enclosing.items())
        columns = (_listed(self._starts), _listed(self._names), _listed(self._sizes))
        return *columns, sorted(self._labels), enclosing

    def packed(self) -> PackedTable:
        """The table as `from_packed` takes it."""
        names = self._names if isinstance(self._names, PackedNames) else PackedNames.of(self._names)
        enclosing = list(self._enclosing.items())
        packed = (pack(self._starts), pack(self._sizes), sorted(self._labels), enclosing)
        return *names.plain(), *packed

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[Symbol]:
        """Every symbol, by address."""
        return (self._symbol(index) for index in range(len(self._starts)))

    def lookup(self, address: int) -> tuple[Symbol, int] | None:
        """The symbol covering `address` and the offset into it, or None."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        enclosing = self._enclosing.get(index)
        if enclosing is not None and address < self._starts[enclosing] + self._sizes[enclosing]:
            index = enclosing  # a label inside a function names a spot, not a function
        offset = address - self._starts[index]
        if offset >= self._sizes[index]:
            return None
        return self._symbol(index), offset

    def starts_at(self, address: int) -> bool:
        """Whether a symbol starts at `address`, an assembly label inside a function
        included: `lookup` names the function around a label, but the label may still
        be code a call enters (the kernel's `__x86_indirect_thunk_r12`, inside the
        sized `__x86_indirect_thunk_array`), as kallsyms, which has no sizes, says."""
        index = bisect.bisect_left(self._starts, address)
        return index < len(self._starts) and self._starts[index] == address

    def find(self, name: str) -> Symbol | None:
        """The symbol called `name`, if any."""
        try:
            index = self._names.index(name)  # the first: in C, not a generator's loop
        except ValueError:
            return None
        return self._symbol(index)

    def _symbol(self, index: int) -> Symbol:
        address, size = self._starts[index], self._sizes[index]
        return Symbol(self._names[index], address, size, label=index in self._labels)


def _listed(column: Sequence[_T]) -> list[_T]:
    return column if isinstance(column, list) else list(column)


def load_symbols(path: str | Path) -> SymbolTable:
    """Read the code symbols of an ELF file (.symtab, else .dynsym). Raises BadElf."""
    path = Path(path)
    with open_elf(path) as elf:
        return SymbolTable(path.name, read_code_symbols(elf))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a loader makes tens of thousands
    of objects without cycles (symbols, FDEs): the collections their allocations set off
    would traverse them again and again, a quarter of the time a kernel takes to load."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_code_symbols(elf: ELFFile) -> list[Symbol]:
    """The code symbols of an ELF file opened by `open_elf` (.symtab, else .dynsym)."""
    with collector_paused():
        return _code_symbols(elf)


def _code_symbols(elf: ELFFile) -> list[Symbol]:
    section_ends = {
        index: section["sh_addr"] + section["sh_size"]
        for index, section in enumerate(elf.iter_sections())
        if section["sh_flags"] & _SHF_EXECINSTR and 0 < index < _SHN_LORESERVE
    }
    entries = symbol_entries(elf)
    symbols = []
    for name_offset, info, section, value, size in entries:
        is_code = info & 0xF in _CODE_TYPES and section in section_ends
        name = entries.name(name_offset) if is_code else ""
        if name and not _MAPPING_SYMBOL.fullmatch(name):
            whole = size or max(section_ends[section] - value, 0)
            symbols.append(Symbol(name, value, whole, label=not size))
    return symbols


def read_object_symbols(
    elf: ELFFile, names: Collection[str], key: FileKey | None = None, code: bool = False
) -> dict[str, int]:
    """The addresses of the data symbols (STT_OBJECT) called `names`, where present, and
    with `code` of code symbols too (a label in assembly is STT_NOTYPE); kept in the
    derived cache under `key` for this set of names."""
    kind = kind_for("named-symbols" if code else "object-symbols", names)
    types = _CODE_TYPES | {_STT_OBJECT} if code else frozenset({_STT_OBJECT})
    read = functools.partial(_object_symbols, elf, names, types)
    return derived(key, kind, read, dict, _addresses)


def _addresses(plain: dict[str, int]) -> dict[str, int]:
    if not isinstance(plain, dict):
        raise TypeError("not a dict of addresses")
    return plain


def _object_symbols(elf: ELFFile, names: Collection[str], types: frozenset[int]) -> dict[str, int]:
    entries = symbol_entries(elf)
    wanted = entries.offsets_of(names)
    found: dict[str, int] = {}
    for name_offset, info, _, value, _ in entries:
        if name_offset in wanted and info & 0xF in types:
            found.setdefault(wanted[name_offset], value)
    return found


class SymbolEntries:
    """Every entry of a symbol table, unpacked from its bytes in bulk.

    pyelftools builds a parsed container per symbol: a kernel's 130,000 symbols took
    5 s that way, against a tenth of a second with struct.iter_unpack. Names are read
    from the string table only for the entries a caller keeps."""

    def __init__(self, raw: bytes, strings: bytes, is64: bool, little: bool) -> None:
        self._layout = struct.Struct(("<" if little else ">") + ("IBBHQQ" if is64 else "IIIBBH"))
        self._raw = memoryview(raw)[: len(raw) - len(raw) % self._layout.size]
        self._is64 = is64
        self._strings = strings

    def __iter__(self) -> Iterator[tuple[int, int, int, int, int]]:
        """(name offset, st_info, section index, value, size) of each entry."""
        unpacked = self._layout.iter_unpack(self._raw)
        if self._is64:
            return ((n, info, shndx, v, z) for n, info, _, shndx, v, z in unpacked)
        return ((n, info, shndx, v, z) for n, v, z, info, _, shndx in unpacked)

    def offsets_of(self, names: Collection[str]) -> dict[int, str]:
        """Every string-table offset at which one of `names` is stored: found by searching
        the bytes, not by decoding every symbol's name (a linker may store one name as
        the tail of another, so any match ending in NUL counts)."""
        offsets = {}
        for name in names:
            encoded = name.encode() + b"\0"
            at = self._strings.find(encoded)
            while at >= 0:
                offsets[at] = name
                at = self._strings.find(encoded, at + 1)
        return offsets

    def name(self, offset: int) -> str:
        """The string at `offset` of the string table ('' outside it)."""
        end = self._strings.find(b"\0", offset)
        raw = self._strings[offset : end if end >= 0 else len(self._strings)]
        return raw.decode("utf-8", "replace")


def symbol_entries(elf: ELFFile) -> SymbolEntries:
    """The entries of .symtab, else .dynsym (none when neither has any)."""
    for table_name in (".symtab", ".dynsym"):
        table = elf.get_section_by_name(table_name)
        if isinstance(table, SymbolTableSection) and table.num_symbols():
            return SymbolEntries(
                table.data(), _strings(table), elf.elfclass == 64, elf.little_endian
            )
    return SymbolEntries(b"", b"", True, True)


def _strings(table: SymbolTableSection) -> bytes:
    """The table's string table; none when it stores no bytes (NOBITS reads as zeros)."""
    strings = table.stringtable
    return b"" if strings["sh_type"] == "SHT_NOBITS" else bytes(strings.data())


def _enclosing_functions(symbols: list[Symbol]) -> list[tuple[int, int]]:
    """Each label (by index) that lies inside a sized symbol before it, with that
    symbol's index: GDB names `entry_SYSCALL_64_after_hwframe`'s code
    `entry_SYSCALL_64`, as perf does."""
    enclosing: list[tuple[int, int]] = []
    current: tuple[int, Symbol] | None = None
    for index, symbol in enumerate(symbols):
        if not symbol.label:
            current = index, symbol
        elif current is not None and symbol.address < current[1].address + current[1].size:
            enclosing.append((index, current[0]))
    return enclosing


def _dedupe(symbols: list[Symbol]) -> list[Symbol]:
    """Keep one symbol per address, preferring the tightest (the function over a label)."""
    best: dict[int, Symbol] = {}
    for symbol in symbols:
        current = best.get(symbol.address)
        if current is None or symbol.size < current.size:
            best[symbol.address] = symbol
    return list(best.values())
