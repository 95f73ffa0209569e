"""Source lines and inlined calls from DWARF, for `dump --lines`.

The line tables of every compilation unit are read once into one sorted table of
(address, file, line); a lookup is a bisection. Inlined calls come from the
DW_TAG_inlined_subroutine entries: an address inside one is shown as that function,
inlined at the caller's call_file:call_line.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.common.exceptions import DWARFError, ELFError
from elftools.elf.elffile import ELFFile


@dataclass(frozen=True)
class SourceLine:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class InlinedCall:
    """A function inlined into its caller: covers [low, high), called from `call_site`."""

    low: int
    high: int
    function: str
    call_site: SourceLine | None
    depth: int


class LineTable:
    """Address → source line, and the inlined calls covering an address."""

    def __init__(self, rows: list[tuple[int, SourceLine | None]], inlined: list[InlinedCall]):
        rows.sort(key=lambda row: row[0])
        self._addresses = [address for address, _ in rows]
        self._lines = [line for _, line in rows]
        self._inlined = inlined

    def line_for(self, address: int) -> SourceLine | None:
        index = bisect.bisect_right(self._addresses, address) - 1
        return self._lines[index] if index >= 0 else None

    def inlined_at(self, address: int) -> list[InlinedCall]:
        """The inlined calls covering `address`, innermost first."""
        hits = [call for call in self._inlined if call.low <= address < call.high]
        return sorted(hits, key=lambda call: -call.depth)


def load_lines(path: Path) -> LineTable:
    """The line table and inlined calls of an ELF; empty when it has no DWARF."""
    try:
        with path.open("rb") as stream:
            elf = ELFFile(stream)
            if not elf.has_dwarf_info():
                return LineTable([], [])
            dwarf = elf.get_dwarf_info()
            return LineTable(_line_rows(dwarf), _inlined_calls(dwarf))
    except (OSError, ELFError, DWARFError, ValueError, KeyError, IndexError):
        return LineTable([], [])


def _line_rows(dwarf: Any) -> list[tuple[int, SourceLine | None]]:
    rows: list[tuple[int, SourceLine | None]] = []
    for unit in dwarf.iter_CUs():
        program = dwarf.line_program_for_CU(unit)
        if program is None:
            continue
        names = _file_names(program)
        for entry in program.get_entries():
            state = entry.state
            if state is None:
                continue
            line = None if state.end_sequence else SourceLine(names(state.file), state.line)
            rows.append((state.address, line))
    return rows


def _file_names(program: Any) -> Any:
    files = program.header.file_entry
    offset = 0 if program.header.version >= 5 else 1

    def name(index: int) -> str:
        position = index - offset
        if 0 <= position < len(files):
            return Path(files[position].name.decode("utf-8", "replace")).name
        return "?"

    return name


def _inlined_calls(dwarf: Any) -> list[InlinedCall]:
    calls: list[InlinedCall] = []
    ranges = dwarf.range_lists()
    for unit in dwarf.iter_CUs():
        names = _file_names(dwarf.line_program_for_CU(unit))
        for die in unit.iter_DIEs():
            if die.tag == "DW_TAG_inlined_subroutine":
                calls += _inlined(die, names, _address_ranges(die, unit, ranges))
    return calls


def _address_ranges(die: Any, unit: Any, ranges: Any) -> list[tuple[int, int]]:
    """[low, high) pieces of a DIE: low_pc/high_pc, or a DW_AT_ranges list."""
    attributes = die.attributes
    low, high = attributes.get("DW_AT_low_pc"), attributes.get("DW_AT_high_pc")
    if low is not None and high is not None:
        end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
        return [(low.value, end)]
    listed = attributes.get("DW_AT_ranges")
    if listed is None or ranges is None or listed.form != "DW_FORM_sec_offset":
        return []
    top = unit.get_top_DIE().attributes.get("DW_AT_low_pc")
    base = top.value if top is not None else 0
    pieces = []
    for entry in ranges.get_range_list_at_offset(listed.value, cu=unit):
        if hasattr(entry, "base_address"):
            base = entry.base_address
        elif getattr(entry, "is_absolute", False):
            pieces.append((entry.begin_offset, entry.end_offset))
        else:
            pieces.append((base + entry.begin_offset, base + entry.end_offset))
    return pieces


def _inlined(die: Any, names: Any, pieces: list[tuple[int, int]]) -> list[InlinedCall]:
    if not pieces:
        return []
    origin = die.get_DIE_from_attribute("DW_AT_abstract_origin")
    name_attribute = origin.attributes.get("DW_AT_name")
    name = name_attribute.value.decode("utf-8", "replace") if name_attribute else "?"
    file = die.attributes.get("DW_AT_call_file")
    line = die.attributes.get("DW_AT_call_line")
    site = SourceLine(names(file.value), line.value) if file and line else None
    depth = 0
    parent = die.get_parent()
    while parent is not None:
        depth += 1
        parent = parent.get_parent()
    return [InlinedCall(low, high, name, site, depth) for low, high in pieces]


@dataclass(frozen=True)
class SourceFrame:
    """One line of a source-level stack: a function (maybe inlined) at a source line."""

    function: str | None
    line: SourceLine | None
    inlined: bool


class SourceLookup:
    """Source lines for frames of several modules, each module's DWARF read on first use."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self._paths = modules
        self._tables: dict[str, LineTable] = {}

    def expand(self, module: str | None, function: str | None, address: int) -> list[SourceFrame]:
        """The frame at `address` (a lookup address) as source frames, innermost first:
        the inlined functions covering it, then the function itself."""
        table = self._table(module)
        line = table.line_for(address) if table is not None else None
        frames = []
        for call in table.inlined_at(address) if table is not None else []:
            frames.append(SourceFrame(call.function, line, inlined=True))
            line = call.call_site
        frames.append(SourceFrame(function, line, inlined=False))
        return frames

    def _table(self, module: str | None) -> LineTable | None:
        if module is None or module not in self._paths:
            return None
        if module not in self._tables:
            self._tables[module] = load_lines(self._paths[module])
        return self._tables[module]
