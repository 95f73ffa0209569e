"""Source lines and inlined calls from DWARF, read one compilation unit at a time.

A kernel's .debug_info can be 500 MB while a dump needs a handful of addresses. So the
DWARF sections are mapped, not read; the compilation unit (CU) holding an address is
found from .debug_aranges (qmpprof.symbols.aranges), or failing that from every CU's top
entry (scanned once); that CU's line program is decoded once (qmpprof.symbols.line_program),
and of its entries only those that may hold the address: the subtree of an entry whose
ranges miss it, or that holds no code, is jumped over by its DW_AT_sibling.

The file is untrusted: every count and size is bounded, the entries are walked forwards
only (a DW_AT_sibling pointing backwards is not followed, so cannot make a loop), and a CU
whose DWARF cannot be decoded contributes no lines. Its frames still show, named from the
symbol table.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from elftools.dwarf.die import DIE
from elftools.dwarf.dwarfinfo import DebugSectionDescriptor
from elftools.elf.elffile import ELFFile

from qmpprof.model import FileMapping
from qmpprof.symbols.aranges import ArangeIndex, read_aranges
from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS
from qmpprof.symbols.line_program import ProgramShape, decode_rows

#: What pyelftools raises on malformed input (it has no single error type of its own).
_MALFORMED = ELF_PARSE_ERRORS
MAX_UNITS = 200_000
MAX_ENTRIES_PER_UNIT = 2_000_000
MAX_DEPTH = 256
MAX_PIECES = 4096
#: Decoded line rows take about 100 times the program's bytes.
MAX_LINE_PROGRAM_BYTES = 8 << 20
MAX_ARANGES_BYTES = 16 << 20
MAX_NAME_HOPS = 4
#: Addresses whose inlined calls a CU remembers (a dump asks for each frame's once).
MAX_CACHED_ADDRESSES = 4096
#: Entries whose subtrees hold no code, so no inlined call: jumped over.
_NO_CODE = frozenset(
    {
        "DW_TAG_structure_type",
        "DW_TAG_class_type",
        "DW_TAG_union_type",
        "DW_TAG_enumeration_type",
        "DW_TAG_subroutine_type",
        "DW_TAG_array_type",
    }
)
#: DW_AT_sibling forms counted from the CU's start (DW_FORM_ref_addr from the section's).
_UNIT_REFERENCES = frozenset(
    {"DW_FORM_ref1", "DW_FORM_ref2", "DW_FORM_ref4", "DW_FORM_ref8", "DW_FORM_ref_udata"}
)


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class InlinedCall:
    """A function inlined into its caller: covers `pieces` ([low, high) each, the entry
    first), called from `call_site`; `depth` orders nested calls."""

    pieces: tuple[tuple[int, int], ...]
    function: str
    call_site: SourceLine | None
    depth: int

    def covers(self, address: int) -> bool:
        return any(low <= address < high for low, high in self.pieces)


def _no_calls(address: int) -> list[InlinedCall]:
    return []


class LineTable:
    """Address → source line, and the inlined calls covering an address (one CU).

    `find_inlined` lists the calls covering an address, in file order; it runs once per
    address asked for."""

    def __init__(
        self,
        rows: list[tuple[int, SourceLine | None]],
        find_inlined: Callable[[int], list[InlinedCall]] = _no_calls,
    ) -> None:
        rows.sort(key=lambda row: row[0])
        self._addresses = [address for address, _ in rows]
        self._lines = [line for _, line in rows]
        self._find_inlined = find_inlined
        self._inlined: dict[int, list[InlinedCall]] = {}

    def line_for(self, address: int) -> SourceLine | None:
        index = bisect.bisect_right(self._addresses, address) - 1
        return self._lines[index] if index >= 0 else None

    def inlined_at(self, address: int) -> list[InlinedCall]:
        """The inlined calls covering `address`, innermost first."""
        if address not in self._inlined:
            if len(self._inlined) >= MAX_CACHED_ADDRESSES:
                self._inlined.clear()
            hits = self._find_inlined(address)
            self._inlined[address] = sorted(hits, key=lambda call: -call.depth)
        return self._inlined[address]


EMPTY = LineTable([])


class _Window:
    """A file-like view of one section of a mapped file: pyelftools reads through it
    only the bytes it parses, instead of copying the whole section into memory."""

    def __init__(self, data: mmap.mmap, start: int, size: int) -> None:
        self._data = data
        self._start = min(start, len(data))
        self._end = min(start + size, len(data))
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        begin = self._start + self._position
        end = self._end if size < 0 else min(self._end, begin + size)
        chunk = self._data[begin:end] if begin < end else b""
        self._position += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    @property
    def size(self) -> int:
        return self._end - self._start


class _MappedElf(ELFFile):
    """An ELFFile whose DWARF sections are windows on a mapping of the file.

    Compressed sections and relocatable files go the ordinary way (read and copied).
    If pyelftools stops calling this hook, everything still works, with more memory."""

    def __init__(self, data: mmap.mmap, stream: IO[bytes]) -> None:
        super().__init__(stream)
        self._mapped = data

    def _read_dwarf_section(self, section: Any, relocate_dwarf_sections: bool) -> Any:
        if section.compressed or self["e_type"] == "ET_REL" or self.has_phantom_bytes():
            return super()._read_dwarf_section(section, relocate_dwarf_sections)
        window = _Window(self._mapped, section["sh_offset"], section["sh_size"])
        return DebugSectionDescriptor(
            stream=window,  # type: ignore[arg-type]
            name=section.name,
            global_offset=section["sh_offset"],
            size=window.size,
            address=section["sh_addr"],
        )


class ModuleLines:
    """The source lines of one ELF file, decoded one CU at a time on demand."""

    def __init__(self, path: Path) -> None:
        self._dwarf = open_mapped_dwarf(path)
        self._aranges: ArangeIndex | None = None
        self._units: list[tuple[int, int, int]] | None = None
        self._tables: dict[int, LineTable] = {}

    def table_for(self, address: int) -> LineTable:
        """The lines and inlined calls of the CU holding `address` (EMPTY if none)."""
        if self._dwarf is None:
            return EMPTY
        offset = self._unit_offset(address)
        if offset is None:
            return EMPTY
        if offset not in self._tables:
            self._tables[offset] = _unit_table(self._dwarf, offset)
        return self._tables[offset]

    @property
    def units_decoded(self) -> int:
        """How many CUs were decoded so far (the rest of the file was not touched)."""
        return len(self._tables)

    def _unit_offset(self, address: int) -> int | None:
        if self._aranges is None:
            self._aranges = _read_aranges(self._dwarf)
        offset = self._aranges.unit_at(address)
        if offset is not None or self._aranges.entries:
            # With .debug_aranges, an address it does not hold has no CU (assembly
            # without DWARF, as a kernel's entry code is): scanning every CU's ranges
            # instead costs minutes on a distribution vmlinux and finds nothing.
            return offset
        if self._units is None:
            self._units = _unit_ranges(self._dwarf)
        end = bisect.bisect_right(self._units, (address, 1 << 64, 0))
        # CUs rarely overlap: the piece starting closest below wins, a few back are checked.
        for low, high, offset in reversed(self._units[max(0, end - 8) : end]):
            if low <= address < high:
                return offset
        return None


def open_mapped_dwarf(path: Path) -> Any:
    """The DWARF of `path` over a mapping of the file; None when it has none or is unusable."""
    try:
        with path.open("rb") as stream:
            data = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
            elf = _MappedElf(data, stream)
            if not elf.has_dwarf_info():
                return None
            # Every section is a window on `data` or a copy now: the file can close.
            return elf.get_dwarf_info(follow_links=False)
    except OSError:
        return None
    except _MALFORMED:
        return None


def _read_aranges(dwarf: Any) -> ArangeIndex:
    section = dwarf.debug_aranges_sec
    if section is None or section.size > MAX_ARANGES_BYTES:
        return ArangeIndex([])
    section.stream.seek(0)
    return read_aranges(section.stream.read(section.size), dwarf.config.little_endian)


def _unit_ranges(dwarf: Any) -> list[tuple[int, int, int]]:
    """(low, high, CU offset) of every CU that says which addresses it covers, sorted."""
    found: list[tuple[int, int, int]] = []
    try:
        for number, unit in enumerate(dwarf.iter_CUs()):
            if number >= MAX_UNITS:
                break
            top = unit.get_top_DIE()
            found += [(low, high, unit.cu_offset) for low, high in _pieces(top, unit, dwarf)]
    except _MALFORMED:
        pass
    return sorted(found)


def _unit_table(dwarf: Any, offset: int) -> LineTable:
    try:
        unit = dwarf.get_CU_at(offset)
        program = dwarf.line_program_for_CU(unit)
        names = _file_names(program)
        rows = _line_rows(program, names)
    except _MALFORMED:
        return EMPTY
    return LineTable(rows, lambda address: _inlined_calls(dwarf, unit, names, address))


def _line_rows(program: Any, names: Any) -> list[tuple[int, SourceLine | None]]:
    if program is None:
        return []
    start, end = program.program_start_offset, program.program_end_offset
    if not 0 <= end - start <= MAX_LINE_PROGRAM_BYTES:
        return []
    program.stream.seek(start)
    code = program.stream.read(end - start)
    header, structs = program.header, program.structs
    shape = ProgramShape(
        minimum_instruction_length=header["minimum_instruction_length"],
        maximum_operations_per_instruction=header["maximum_operations_per_instruction"],
        line_base=header["line_base"],
        line_range=header["line_range"],
        opcode_base=header["opcode_base"],
        standard_opcode_lengths=tuple(header["standard_opcode_lengths"]),
        address_size=structs.address_size,
        little_endian=structs.little_endian,
    )
    # Rows repeat a few thousand (file, line) pairs: one SourceLine each.
    lines: dict[tuple[int, int], SourceLine] = {}
    rows: list[tuple[int, SourceLine | None]] = []
    for address, file, line, end_sequence in decode_rows(code, shape):
        if end_sequence:
            rows.append((address, None))
            continue
        source = lines.get((file, line))
        if source is None:
            source = lines[file, line] = SourceLine(names(file), line)
        rows.append((address, source))
    return rows


def _file_names(program: Any) -> Any:
    files = program.header.file_entry if program is not None else []
    offset = 0 if program is not None and program.header.version >= 5 else 1

    def name(index: int) -> str:
        position = index - offset
        if 0 <= position < len(files) and isinstance(files[position].name, bytes):
            return Path(files[position].name.decode("utf-8", "replace")).name
        return "?"

    return name


def _entries_near(dwarf: Any, unit: Any, address: int) -> Iterator[tuple[Any, int, list[Any]]]:
    """The CU's entries that may hold `address`, in file order, with their nesting depth
    and [low, high) pieces. Each entry read is read once: the subtree of one whose pieces
    miss `address`, or that holds no code, is jumped over when its DW_AT_sibling points
    forwards within the CU, and read through otherwise."""
    stream = unit.dwarfinfo.debug_info_sec.stream
    offset, end, depth = unit.cu_die_offset, unit.cu_offset + unit.size, 0
    for _ in range(MAX_ENTRIES_PER_UNIT):
        if offset >= end:
            return
        die = DIE(cu=unit, stream=stream, offset=offset)
        if die.size <= 0:
            return
        offset += die.size
        if die.is_null():
            depth -= 1
            if depth <= 0:
                return
            continue
        wanted = die.has_children or die.tag == "DW_TAG_inlined_subroutine"
        pieces = _pieces(die, unit, dwarf) if wanted else []
        yield die, depth, pieces
        if not die.has_children:
            continue
        sibling = (
            _sibling(die, unit, offset, end) if depth and _holds_no(address, die, pieces) else None
        )
        if sibling is not None:
            offset = sibling
        else:
            depth = min(depth + 1, MAX_DEPTH)


def _holds_no(address: int, die: Any, pieces: list[tuple[int, int]]) -> bool:
    """Whether no inlined call covering `address` can be below `die`."""
    if die.tag in _NO_CODE:
        return True
    if pieces:
        return not any(low <= address < high for low, high in pieces)
    # A subprogram without code: a declaration, or the abstract tree of an inlined one.
    return die.tag == "DW_TAG_subprogram"  # type: ignore[no-any-return]


def _sibling(die: Any, unit: Any, after: int, end: int) -> int | None:
    """Where `die`'s next sibling starts, if it says so and that is forwards in the CU."""
    link = die.attributes.get("DW_AT_sibling")
    if link is None or not isinstance(link.value, int):
        return None
    if link.form in _UNIT_REFERENCES:
        target = unit.cu_offset + link.value
    elif link.form == "DW_FORM_ref_addr":
        target = link.value
    else:
        return None
    return target if after < target < end else None


def _inlined_calls(dwarf: Any, unit: Any, names: Any, address: int) -> list[InlinedCall]:
    calls = []
    try:
        for die, depth, pieces in _entries_near(dwarf, unit, address):
            if die.tag != "DW_TAG_inlined_subroutine":
                continue
            if any(low <= address < high for low, high in pieces):
                calls.append(InlinedCall(tuple(pieces), _name(die), _call_site(die, names), depth))
    except _MALFORMED:
        return []
    return calls


def _pieces(die: Any, unit: Any, dwarf: Any) -> list[tuple[int, int]]:
    """[low, high) pieces of an entry, in the order listed: low_pc/high_pc or DW_AT_ranges."""
    attributes = die.attributes
    low, high = attributes.get("DW_AT_low_pc"), attributes.get("DW_AT_high_pc")
    if low is not None and high is not None:
        end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
        return [(low.value, end)] if low.value < end else []
    listed = attributes.get("DW_AT_ranges")
    ranges = dwarf.range_lists() if listed is not None else None
    if ranges is None or listed.form != "DW_FORM_sec_offset":
        return []
    top = unit.get_top_DIE().attributes.get("DW_AT_low_pc")
    base = top.value if top is not None else 0
    pieces = []
    for entry in ranges.get_range_list_at_offset(listed.value, cu=unit)[:MAX_PIECES]:
        if hasattr(entry, "base_address"):
            base = entry.base_address
            continue
        begin, end = entry.begin_offset, entry.end_offset
        if not getattr(entry, "is_absolute", False):
            begin, end = base + begin, base + end
        if begin < end:
            pieces.append((begin, end))
    return pieces


def _name(die: Any) -> str:
    """The inlined function's name, from its abstract origin (or that one's declaration)."""
    for _ in range(MAX_NAME_HOPS):
        name = die.attributes.get("DW_AT_name")
        if name is not None and isinstance(name.value, bytes):
            return str(name.value.decode("utf-8", "replace"))
        link = next(
            (a for a in ("DW_AT_abstract_origin", "DW_AT_specification") if a in die.attributes),
            None,
        )
        if link is None:
            break
        die = die.get_DIE_from_attribute(link)
    return "?"


def _call_site(die: Any, names: Any) -> SourceLine | None:
    file = die.attributes.get("DW_AT_call_file")
    line = die.attributes.get("DW_AT_call_line")
    if file is None or line is None:
        return None
    return SourceLine(names(file.value), line.value)


@dataclass(frozen=True)
class SourceFrame:
    """One line of a source-level stack: a function (maybe inlined) at a source line."""

    function: str | None
    line: SourceLine | None
    inlined: bool


class SourceLookup:
    """Source lines and inlined calls for frames of several modules, each module's DWARF
    opened on first use and decoded one CU at a time.

    `modules`: each module's ELF file and load bias (guest address = file address +
    bias, as a KASLR kernel runs), by the name frames carry; `mapped`: the same for a
    file a process map placed (a shared library, at another bias in each process)."""

    def __init__(
        self,
        modules: dict[str, tuple[Path, int]],
        mapped: Callable[[FileMapping], tuple[Path, int] | None] | None = None,
    ) -> None:
        self._files = modules
        self._mapped = mapped
        self._modules: dict[Path, ModuleLines] = {}

    def expand(
        self,
        module: str | None,
        function: str | None,
        address: int,
        mapping: FileMapping | None = None,
    ) -> list[SourceFrame]:
        """The frame at `address` (a lookup address, in the guest) as source frames,
        innermost first: the inlined functions covering it, then the function itself.

        A vCPU stopped at the first instruction of an inlined call is inside it: GDB,
        stopped by an interrupt (as qmpprof stops a VM), lists that call; it hides one
        only when a breakpoint stopped it there."""
        found = self._mapped(mapping) if mapping is not None and self._mapped else None
        if found is None and module is not None:
            found = self._files.get(module)
        if found is None:
            return [SourceFrame(function, None, inlined=False)]
        path, bias = found
        address -= bias
        table = self._table(path, address)
        line = table.line_for(address)
        calls = table.inlined_at(address)
        frames = []
        for call in calls:
            frames.append(SourceFrame(call.function, line, inlined=True))
            line = call.call_site
        frames.append(SourceFrame(function, line, inlined=False))
        return frames

    def _table(self, path: Path, address: int) -> LineTable:
        if path not in self._modules:
            self._modules[path] = ModuleLines(path)
        return self._modules[path].table_for(address)
