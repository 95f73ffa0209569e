"""CFI tables: .eh_frame and .debug_frame compiled into sorted, cached unwind rows.

The CIEs and FDEs are decoded by qmpprof itself (cfi_entries.py, cfi_program.py), not
by pyelftools: released pyelftools versions decode DW_CFA_GNU_args_size (0.33 raises)
and DW_CFA_def_cfa_sf (scaled by the wrong factor) wrongly, so qmpprof's unwinding
would depend on which version pip picked. pyelftools only finds the sections.

Each FDE's rows are compiled to our closed rule types (rules.py) the first time an
address inside it is looked up, then kept. Lookup is a bisection over FDE start
addresses, then over the FDE's rows, with a cache of recently seen addresses in
front. Corrupt CFI never raises: an FDE that cannot be compiled covers nothing and
is counted with its reason (CfiTable.uncompiled), and where .eh_frame and
.debug_frame both describe a function, the other one stands in for it.

A file's CFI is read as its instruction set's (qmpprof.isa.isa_of_elf): an i386 (ELF32,
EM_386) file's rows have word 4, an AArch64 file's name its registers (see
cfi_entries.py and cfi_program.py); every other file's are x86-64's.
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadCfi
from qmpprof.isa.base import Isa
from qmpprof.isa.registry import isa_of_elf
from qmpprof.symbols.derived import FileKey, derived
from qmpprof.symbols.elf import collector_paused
from qmpprof.symbols.elf_file import ELF_PARSE_ERRORS, open_elf
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi_entries import Cie, FdeEntry, parse_section
from qmpprof.unwind.cfi_program import compile_fde

CACHE_LIMIT = 1 << 14


@dataclass(slots=True)
class _Fde:
    entry: FdeEntry
    start: int
    end: int
    # Shared empty tuples until needed: a kernel has 50,000 FDEs, few ever compiled.
    starts: Sequence[int] = ()
    rows: list[r.UnwindRow] | None = None  # None: not compiled yet; []: cannot be
    problem: str | None = None
    stand_ins: tuple[_Fde, ...] = ()  # overlapping FDEs of the other section

    def compiled(self) -> bool:
        """Compile on first use; whether this FDE has rows."""
        if self.rows is None:
            try:
                self.starts, self.rows = compile_fde(self.entry)
            except BadCfi as err:
                self.starts, self.rows, self.problem = [], [], str(err)
        return bool(self.rows)


@dataclass(frozen=True, slots=True)
class Uncompiled:
    """FDEs whose instructions could not be compiled, and why.

    `functions`: FDEs that cover nothing now (no usable stand-in); unwinding through
    them falls back to frame pointers (--unwind auto) or stops (no-unwind-info).
    `replaced`: FDEs that failed while the other section's FDE stands in for them.
    `reasons`: (reason, count) of every failed FDE, most frequent first.
    `section_problems`: entries that could not be read at all (their functions are
    unknown, so they are not in `functions`).
    """

    functions: int
    replaced: int
    reasons: tuple[tuple[str, int], ...]
    section_problems: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.functions or self.replaced or self.section_problems)

    def summary(self) -> str:
        """One line, e.g. `3 functions without usable CFI (3 truncated)`."""
        reasons = ", ".join(f"{count} {reason}" for reason, count in self.reasons[:3])
        text = f"{self.functions} functions without usable CFI"
        if reasons:
            text += f" ({reasons}{', ...' if len(self.reasons) > 3 else ''})"
        if self.replaced:
            text += f"; {self.replaced} more replaced by their .debug_frame/.eh_frame twin"
        if self.section_problems:
            text += f"; {len(self.section_problems)} unreadable CFI entries"
        return text


#: A table as plain data (the derived cache's): each CIE's fields once; each FDE kept,
#: by start, as (start, end, CIE index, instructions, their address, its stand-ins as
#: the same five); the problems.
PlainFde = tuple[int, int, int, bytes, int]
PlainKept = tuple[int, int, int, bytes, int, list[PlainFde]]
PlainCfi = tuple[list[tuple[Any, ...]], list[PlainKept], list[str]]


class CfiTable:
    """Unwind rows of one module, by address (link address = guest address). A table
    loaded from the derived cache makes each FDE's objects on its first lookup: a
    kernel has 50,000 FDEs and a profile reaches a few hundred."""

    def __init__(self, fdes: list[FdeEntry], problems: list[str] | None = None) -> None:
        wrapped = [_Fde(entry, entry.start, entry.end) for entry in fdes]
        kept = _without_overlaps(sorted(wrapped, key=lambda f: f.start))
        self._set([f.start for f in kept], list(kept), [], [], problems or ())

    @classmethod
    def from_plain(cls, plain: PlainCfi) -> CfiTable:
        """A table from `plain()`'s data; raises TypeError or ValueError for data of
        another shape."""
        cie_fields, kept, problems = plain
        if any(len(entry) != 6 for entry in kept) or any(
            len(cie) != _CIE_FIELDS for cie in cie_fields
        ):
            raise ValueError("CFI entries of another shape")
        table = cls.__new__(cls)
        starts, cies = [entry[0] for entry in kept], [Cie(*fields) for fields in cie_fields]
        table._set(starts, [None] * len(kept), kept, cies, problems)
        return table

    def _set(
        self,
        starts: list[int],
        fdes: list[_Fde | None],
        plain: list[PlainKept],
        cies: list[Cie],
        problems: Sequence[str],
    ) -> None:
        """`fdes[i]` is None until made from `plain[i]` (a table from the cache)."""
        self._starts, self._fdes, self._plain, self._cies = starts, fdes, plain, cies
        self._cache: dict[int, r.UnwindRow | None] = {}
        self._problems = tuple(problems)

    def plain(self) -> PlainCfi:
        cies: dict[Cie, int] = {}

        def entry(fde: _Fde) -> PlainFde:
            e = fde.entry
            return (
                e.start,
                e.end,
                cies.setdefault(e.cie, len(cies)),
                e.instructions,
                e.instructions_address,
            )

        kept = [(*entry(fde), [entry(s) for s in fde.stand_ins]) for fde in self._all()]
        return [_fields(cie) for cie in cies], kept, list(self._problems)

    def entries(self) -> list[FdeEntry]:
        """Every FDE the table uses first where FDEs overlap, by start."""
        return [fde.entry for fde in self._all()]

    def __len__(self) -> int:
        return len(self._fdes)

    def row_for(self, address: int) -> r.UnwindRow | None:
        """The row covering `address`, or None where no (usable) FDE covers it."""
        cached = self._cache.get(address, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        row = self._cache[address] = self._find(address)
        return row

    def starts_function(self, address: int) -> bool:
        """A table alone knows no symbols (unwind.unwinder.CfiLookup)."""
        return False

    def function_start(self, address: int) -> int | None:
        """A table alone knows no symbols (unwind.unwinder.CfiLookup)."""
        return None

    def word_size(self, address: int) -> int | None:
        """A table alone knows no module's word (unwind.unwinder.CfiLookup): the
        unwind's own `word` applies to its frame-pointer steps."""
        return None

    def words(self) -> frozenset[int]:
        """None known (unwind.unwinder.CfiLookup)."""
        return frozenset()

    def _find(self, address: int) -> r.UnwindRow | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        fde = self._fde(index)
        if address >= fde.end:
            return None
        if not fde.compiled():
            fde = next(
                (s for s in fde.stand_ins if s.start <= address < s.end and s.compiled()), fde
            )
        if not fde.rows:
            return None
        row_index = bisect.bisect_right(fde.starts, address) - 1
        return fde.rows[row_index] if row_index >= 0 else None

    def uncompiled(self, compile_all: bool = True) -> Uncompiled:
        """The FDEs that cannot be compiled. `compile_all` compiles every FDE not compiled
        yet (about 0.1 ms each: gdb's 20,000 take 1.5 s); without it, only the FDEs
        lookups have reached so far are counted (free)."""
        reasons: Counter[str] = Counter()
        functions = replaced = 0
        for fde in self._all():
            if (fde.rows is None and not compile_all) or fde.compiled():
                continue
            assert fde.problem is not None
            reasons[fde.problem] += 1
            if any(stand_in.compiled() for stand_in in fde.stand_ins):
                replaced += 1
            else:
                functions += 1
        return Uncompiled(functions, replaced, tuple(reasons.most_common()), self._problems)

    def _all(self) -> Iterator[_Fde]:
        return (self._fde(index) for index in range(len(self._fdes)))

    def _fde(self, index: int) -> _Fde:
        fde = self._fdes[index]
        if fde is None:
            start, end, cie, code, at, stand_ins = self._plain[index]
            fde = _Fde(FdeEntry(start, end, self._cies[cie], code, at), start, end)
            fde.stand_ins = tuple(self._stand_in(*fields) for fields in stand_ins)
            self._fdes[index] = fde
        return fde

    def _stand_in(self, start: int, end: int, cie: int, code: bytes, at: int) -> _Fde:
        return _Fde(FdeEntry(start, end, self._cies[cie], code, at), start, end)


def _fields(cie: Cie) -> tuple[Any, ...]:
    return tuple(getattr(cie, field.name) for field in fields(cie))


#: A CIE's fields as `plain()` keeps them (a table cached before a field was added is
#: read again from its file).
_CIE_FIELDS = len(fields(Cie))


def elf_isa(elf: ELFFile) -> Isa:
    """The instruction set of the code an ELF file holds."""
    return isa_of_elf(elf["e_machine"], elf.elfclass)


def load_cfi(path: str | Path, key: FileKey | None = None) -> CfiTable:
    """The CFI of the ELF at `path` (.eh_frame first, .debug_frame where it adds), its
    entries kept in the derived cache under `key` (symbols/derived.py). Raises BadElf."""
    with collector_paused():
        read = functools.partial(_read_cfi, path)
        return derived(key, "cfi-table", read, CfiTable.plain, CfiTable.from_plain)


def _read_cfi(path: str | Path) -> CfiTable:
    fdes: list[FdeEntry] = []
    problems: list[str] = []
    with open_elf(path) as elf:
        for name in (".eh_frame", ".debug_frame"):
            found = _section_fdes(elf, name, eh_frame=name == ".eh_frame")
            fdes += found.fdes
            problems += found.problems
    return CfiTable(fdes, problems)


@dataclass(frozen=True, slots=True)
class _Found:
    fdes: list[FdeEntry]
    problems: list[str]


def _section_fdes(elf: ELFFile, name: str, eh_frame: bool) -> _Found:
    try:
        section = elf.get_section_by_name(name)
        if section is None or section["sh_type"] == "SHT_NOBITS":
            return _Found([], [])
        data, address = section.data(), section["sh_addr"]
        address_size, isa = elf.elfclass // 8, elf_isa(elf)
    except ELF_PARSE_ERRORS as err:  # corrupt section headers cost this section only
        return _Found([], [f"{name}: unreadable section ({type(err).__name__})"])
    entries = parse_section(data, address, eh_frame, address_size, isa)
    return _Found(entries.fdes, entries.problems)


def _without_overlaps(fdes: list[_Fde]) -> list[_Fde]:
    """FDEs that overlap an earlier one become its stand-ins (.eh_frame came first, so it
    wins ties; the .debug_frame twin is used when .eh_frame's cannot be compiled)."""
    kept: list[_Fde] = []
    for fde in fdes:
        if not kept or fde.start >= kept[-1].end:
            kept.append(fde)
        else:
            kept[-1].stand_ins += (fde,)
    return kept
