"""qmpprof's compiled CFI against binutils' `readelf --debug-dump=frames-interp`, row for row.

readelf is the oracle: for every FDE it prints the table of rules at each location
(the CFA rule and every register the CIE or FDE mentions). Each FDE of ours is
compiled on its own (so .debug_frame twins of .eh_frame FDEs are checked too) and
must give readelf's CFA and register cells at every row, with no register rule
readelf does not show.

Inside `make test`: a deterministic subset of real binaries' FDEs (every 16th, plus
every FDE using an instruction other than the everyday ones). QMPPROF_ORACLE_FULL=1:
every row of libc, libstdc++, gdb, qemu-system-x86_64 and python3.11 (figures printed).

An i386 file's rows are named in readelf's i386 words (`I386`), an AArch64 file's in its
AArch64 words (`AARCH64`): our registers are numbered in one numbering
(unwind/numbering.py), so each is named by the file's number it was translated from.
AArch64's return column (x30) has "same value" as its rule where the CIE gives none
(cfi_program.py), which readelf shows as no rule ("u").
"""

from __future__ import annotations

import bisect
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.errors import BadCfi
from qmpprof.isa.aarch64 import AARCH64 as AARCH64_ISA
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi import elf_isa
from qmpprof.unwind.cfi_entries import FdeEntry, parse_section
from qmpprof.unwind.cfi_program import compile_fde
from qmpprof.unwind.numbering import AARCH64_REGISTERS, OTHER
from tests.unit.conftest import build_elf

#: readelf's x86-64 register names (binutils dwarf.c), index = DWARF number.
READELF_NAMES = (
    *r.DWARF_REGISTER_NAMES[:16],
    "rip",
    *(f"xmm{n}" for n in range(16)),
    *(f"st{n}" for n in range(8)),
    *(f"mm{n}" for n in range(8)),
    "rflags",
    *("es", "cs", "ss", "ds", "fs", "gs"),
)
#: readelf's i386 register names (binutils dwarf.c), index = i386 DWARF number; None
#: where it has none (it prints `rN`).
READELF_I386_NAMES = (
    *("eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "eip", "eflags", None),
    *(f"st{n}" for n in range(8)),
    None,
    None,
    *(f"xmm{n}" for n in range(8)),
    *(f"mm{n}" for n in range(8)),
    *("fcw", "fsw", "mxcsr", "es", "cs", "ss", "ds", "fs", "gs", None, None, "tr", "ldtr"),
)
#: The i386 DWARF number of each of our (x86-64) numbers an i386 register becomes.
_I386_NUMBERS = {0: 0, 2: 1, 1: 2, 3: 3, 7: 4, 6: 5, 4: 6, 5: 7, r.RIP: 8}


@dataclass(frozen=True)
class Naming:
    """How readelf names the registers of one architecture, from our numbers."""

    names: tuple[str | None, ...]  # by the file's own DWARF numbers
    number: Callable[[int], int]  # our number -> the file's DWARF number
    #: The return column's rule is "same value" where the CIE says nothing (AArch64).
    implicit_return: bool = False

    def name(self, register: int, return_column: int = -1) -> str:
        if register == return_column:
            return "ra"
        number = self.number(register)
        name = self.names[number] if 0 <= number < len(self.names) else None
        return name or f"r{number}"


def _i386_number(register: int) -> int:
    if register >= OTHER:
        return register - OTHER
    return _I386_NUMBERS.get(register, -1)


def _aarch64_number(register: int) -> int:
    if register >= OTHER:
        return register - OTHER
    return AARCH64_REGISTERS.index(register) if register in AARCH64_REGISTERS else -1


X86_64 = Naming(READELF_NAMES, lambda register: register)
I386 = Naming(READELF_I386_NAMES, _i386_number)
#: readelf's AArch64 names (binutils dwarf.c): x0-x30, sp, and the SIMD registers v0-v31
#: at 64-95.
AARCH64 = Naming(
    (*(f"x{n}" for n in range(31)), "sp", *(None,) * 32, *(f"v{n}" for n in range(32))),
    _aarch64_number,
    implicit_return=True,
)
LIBS = Path("/usr/lib/x86_64-linux-gnu")
SUBSET_BINARIES = (LIBS / "libc.so.6", LIBS / "libstdc++.so.6")
FULL_BINARIES = (
    *SUBSET_BINARIES,
    Path("/usr/bin/gdb"),
    Path("/usr/bin/qemu-system-x86_64"),
    Path("/usr/bin/python3.11"),
)
EVERYDAY = {
    "DW_CFA_advance_loc",
    "DW_CFA_advance_loc1",
    "DW_CFA_def_cfa_offset",
    "DW_CFA_offset",
    "DW_CFA_nop",
    "DW_CFA_def_cfa",
    "DW_CFA_def_cfa_register",
}
SUBSET_STRIDE = 16

_HEADER = re.compile(
    r"^([0-9a-f]{8,16}) [0-9a-f]+ ([0-9a-f]+) "
    r"(CIE|FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+))"
)
_SECTION = re.compile(r"^Contents of the (\S+) section")
_ROW = re.compile(r"^(?:[0-9a-f]{16}|[0-9a-f]{8}) ")  # 64- and 32-bit files' locations


@dataclass
class ReadelfEntry:
    """A CIE or FDE as readelf prints it: its columns and its rows."""

    section: str
    offset: int
    cie: int | None  # offset of its CIE (FDEs only)
    start: int = 0
    end: int = 0
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    instructions: set[str] = field(default_factory=set)


def readelf(elf: Path, *options: str) -> str:
    if shutil.which("readelf") is None:
        pytest.fail("readelf (binutils) is the CFI oracle; make test installs it")
    result = subprocess.run(["readelf", *options, str(elf)], capture_output=True, text=True)
    assert result.stdout, f"readelf printed nothing for {elf}: {result.stderr}"
    return result.stdout


def readelf_entries(elf: Path) -> list[ReadelfEntry]:
    """Every CIE and FDE of `elf` with the table readelf interprets for it."""
    entries: list[ReadelfEntry] = []
    section = ""
    in_table = False  # rows follow a LOC line up to the next blank line
    for line in readelf(elf, "--debug-dump=frames-interp").splitlines():
        if (heading := _SECTION.match(line)) is not None:
            section = heading.group(1).rstrip(":")
        elif (header := _HEADER.match(line)) is not None:
            entries.append(_entry(section, header))
        elif line.strip().startswith("LOC") and entries:
            entries[-1].columns = line.split()[1:]
            in_table = True
        elif not line.strip():
            in_table = False
        elif in_table and _ROW.match(line) and entries and entries[-1].columns:
            cells = _cells(line)
            entries[-1].rows.append(
                (int(cells[0], 16), dict(zip(entries[-1].columns, cells[1:], strict=True)))
            )
    return entries


def _entry(section: str, header: re.Match[str]) -> ReadelfEntry:
    offset = int(header.group(1), 16)
    if header.group(4) is None:
        return ReadelfEntry(section, offset, None)
    start, end = int(header.group(5), 16), int(header.group(6), 16)
    return ReadelfEntry(section, offset, int(header.group(4), 16), start, end)


def _cells(line: str) -> list[str]:
    """Split a row; readelf prints a register-in-register rule as two words, `r9 (r9)`."""
    cells: list[str] = []
    for word in line.split():
        if word.startswith("(") and cells:
            cells[-1] += f" {word}"
        else:
            cells.append(word)
    return cells


def readelf_instructions(elf: Path, fdes: list[ReadelfEntry]) -> None:
    """Note which DW_CFA_* instructions each FDE uses (readelf's raw dump)."""
    by_key = {(fde.section, fde.offset): fde for fde in fdes}
    current: ReadelfEntry | None = None
    section = ""
    for line in readelf(elf, "--debug-dump=frames").splitlines():
        if (heading := _SECTION.match(line)) is not None:
            section = heading.group(1).rstrip(":")
        elif (header := _HEADER.match(line)) is not None:
            current = by_key.get((section, int(header.group(1), 16)))
        elif current is not None and line.startswith("  DW_CFA_"):
            current.instructions.add(line.split()[0].rstrip(":"))


def expected_rows(fde: ReadelfEntry, cies: dict[tuple[str, int], ReadelfEntry]) -> ReadelfEntry:
    """The FDE's rows inside its range; an FDE without instructions has its CIE's row."""
    if not fde.rows:
        cie = cies[(fde.section, fde.cie or 0)]
        fde.columns = cie.columns
        fde.rows = [(fde.start, dict(cells)) for _, cells in cie.rows[-1:]]
    last: dict[int, dict[str, str]] = {}
    for location, cells in fde.rows:
        if fde.start <= location < fde.end:
            last[location] = cells  # a zero advance: the later row is the one in force
    fde.rows = sorted(last.items())
    return fde


def naming_of(elf: Path) -> Naming:
    """readelf's register names for the CFI of `elf`."""
    with elf.open("rb") as stream:
        isa = elf_isa(ELFFile(stream))
    return {"i386": I386, AARCH64_ISA.name: AARCH64}.get(isa.name, X86_64)


def register_name(number: int, return_column: int, naming: Naming = X86_64) -> str:
    return naming.name(number, return_column)


def describe_cfa(rule: r.CfaRule, naming: Naming = X86_64) -> str:
    if rule.expression is not None:
        return "exp"
    return f"{register_name(rule.register, -1, naming)}{rule.offset:+d}"


def describe_rule(rule: r.RegisterRule | None, naming: Naming = X86_64) -> str:
    match rule:
        case None | r.Undefined():
            return "u"
        case r.SameValue():
            return "s"
        case r.SavedAt(offset=offset):
            return f"c{offset:+d}"
        case r.ValueAt(offset=offset):
            return f"v{offset:+d}"
        case r.InRegister(register=register):
            return f"r{naming.number(register)} ({register_name(register, -1, naming)})"
        case r.SavedAtExpression():
            return "exp"
        case r.ValueOfExpression():
            return "vexp"
    return f"?{rule}"


def describe_row(row: r.UnwindRow, columns: list[str], naming: Naming = X86_64) -> dict[str, str]:
    """Our row in readelf's words, for readelf's columns (and any rule it lacks)."""
    rules = {register_name(n, row.return_column, naming): rule for n, rule in row.rules}
    cells = {"CFA": describe_cfa(row.cfa, naming)}
    cells.update(
        {column: describe_rule(rules.get(column), naming) for column in columns if column != "CFA"}
    )
    cells.update(
        {
            name: f"extra {describe_rule(rule, naming)}"
            for name, rule in rules.items()
            if name not in columns
        }
    )
    return cells


def our_fdes(elf: Path) -> dict[tuple[str, int, int], FdeEntry]:
    """Our FDEs of both sections, by (section, start, end)."""
    found: dict[tuple[str, int, int], FdeEntry] = {}
    with elf.open("rb") as stream:
        file = ELFFile(stream)
        address_size, isa = file.elfclass // 8, elf_isa(file)
        for name in (".eh_frame", ".debug_frame"):
            section = file.get_section_by_name(name)
            if section is None:
                continue
            data, address = section.data(), section["sh_addr"]
            entries = parse_section(data, address, name == ".eh_frame", address_size, isa)
            assert not entries.problems, entries.problems
            found.update({(name, fde.start, fde.end): fde for fde in entries.fdes})
    return found


@dataclass
class Comparison:
    fdes: int = 0
    rows: int = 0
    mismatches: list[str] = field(default_factory=list)


def compare(elf: Path, select: bool) -> Comparison:
    """Our rows against readelf's for every FDE of `elf` (or the subset, if `select`)."""
    entries = readelf_entries(elf)
    cies = {(e.section, e.offset): e for e in entries if e.cie is None}
    fdes = [e for e in entries if e.cie is not None and e.end > e.start]
    if select:
        readelf_instructions(elf, fdes)
        fdes = [
            f for i, f in enumerate(fdes) if i % SUBSET_STRIDE == 0 or f.instructions - EVERYDAY
        ]
    ours = our_fdes(elf)
    naming = naming_of(elf)
    result = Comparison()
    for fde in fdes:
        result.fdes += 1
        entry = ours.get((fde.section, fde.start, fde.end))
        if entry is None:
            result.mismatches.append(f"{fde.section} FDE {fde.start:#x}: we have no such FDE")
            continue
        compare_fde(expected_rows(fde, cies), entry, result, naming)
    return result


def compare_fde(
    fde: ReadelfEntry, entry: FdeEntry, result: Comparison, naming: Naming = X86_64
) -> None:
    try:
        starts, rows = compile_fde(entry)
    except BadCfi as err:
        result.mismatches.append(f"{fde.section} FDE {fde.start:#x}: not compiled ({err})")
        return
    for location, cells in fde.rows:
        result.rows += 1
        index = bisect.bisect_right(starts, location) - 1
        ours = describe_row(rows[index], fde.columns, naming) if index >= 0 else {}
        if naming.implicit_return:
            ours = _as_readelf_shows_no_rule(ours, cells)
        if ours != cells:
            result.mismatches.append(f"{fde.section} {location:#x}: readelf {cells}, ours {ours}")


def _as_readelf_shows_no_rule(ours: dict[str, str], cells: dict[str, str]) -> dict[str, str]:
    """Our "same value" for a return column no instruction named: readelf's "u", or no
    column at all (AArch64's x30, cfi_program.py)."""
    if ours.get("ra") == "s" and cells.get("ra") == "u":
        return {**ours, "ra": "u"}
    if ours.get("ra") == "extra s" and "ra" not in cells:
        return {name: cell for name, cell in ours.items() if name != "ra"}
    return ours


def assert_agrees(elf: Path, select: bool) -> Comparison:
    result = compare(elf, select)
    assert result.rows > 0, f"readelf showed no rows for {elf}"
    assert not result.mismatches, f"{len(result.mismatches)} rows differ:\n" + "\n".join(
        result.mismatches[:10]
    )
    return result


@pytest.mark.slow
@pytest.mark.parametrize("elf", SUBSET_BINARIES, ids=lambda path: path.name)
def test_system_libraries_agree_with_readelf(elf: Path) -> None:
    if not elf.exists():
        pytest.fail(f"{elf} is missing (the oracle needs this machine's libraries)")
    result = assert_agrees(elf, select=True)
    assert result.fdes > 100


@pytest.mark.slow  # test_cfi_rules checks the same builds' rows in `make unit`
@pytest.mark.parametrize(
    "flags",
    [("-O2", "-fno-asynchronous-unwind-tables"), ("-O2",)],
    ids=["debug-frame-only", "eh-frame"],
)
def test_gcc_built_elf_agrees_with_readelf(tmp_path: Path, flags: tuple[str, ...]) -> None:
    elf = build_elf("cfi_chain.c", tmp_path, "-g", "-static", *flags)
    assert_agrees(elf, select=False)


@pytest.mark.skipif(
    not os.environ.get("QMPPROF_ORACLE_FULL"), reason="QMPPROF_ORACLE_FULL=1 runs it"
)
@pytest.mark.parametrize("elf", FULL_BINARIES, ids=lambda path: path.name)
def test_every_row_of_real_binaries_agrees_with_readelf(elf: Path) -> None:
    started = time.perf_counter()
    result = compare(elf, select=False)
    seconds = time.perf_counter() - started
    agreeing = result.rows - len(result.mismatches)
    print(
        f"\n{elf}: {result.fdes} FDEs, {result.rows} rows, "
        f"{100 * agreeing / max(result.rows, 1):.3f} % agree, {seconds:.1f} s"
    )
    assert not result.mismatches, "\n".join(result.mismatches[:10])


AARCH64_GCC = "aarch64-linux-gnu-gcc"


@pytest.mark.parametrize(
    "flags",
    [
        ("-O2", "-mbranch-protection=standard"),
        ("-O1", "-fno-omit-frame-pointer", "-mbranch-protection=pac-ret+leaf"),
        ("-O2", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"),
    ],
    ids=["signed-returns", "frame-records-signed-leaves", "debug-frame-only"],
)
def test_aarch64_gcc_built_elf_agrees_with_readelf(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """AArch64 CFI (Debian's cross gcc, its arm64 libc linked in): return addresses
    signed (DW_CFA_AARCH64_negate_ra_state), x30 the return column."""
    elf = build_elf("cfi_chain.c", tmp_path, "-g", "-static", *flags, cc=AARCH64_GCC)
    result = assert_agrees(elf, select=False)
    assert result.fdes > 100  # libc's too
