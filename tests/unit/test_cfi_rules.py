"""Compiled CFI rows against binutils' `readelf --debug-dump=frames-interp`, and the
expression evaluator on the expressions compilers emit."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from qmpprof.memory import WindowMemory
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.dwarf_expr import Op, evaluate
from tests.unit.conftest import build_elf

DWARF_NUMBERS = {name: n for n, name in enumerate((*r.DWARF_REGISTER_NAMES[:16], "ra"))}
_FDE = re.compile(r"FDE cie=\w+ pc=([0-9a-f]+)\.\.([0-9a-f]+)")


def readelf_rows(elf: Path) -> list[tuple[int, dict[str, str]]]:
    """(location, {column: cell}) for every row readelf prints inside an FDE's range."""
    text = subprocess.run(
        ["readelf", "--debug-dump=frames-interp", str(elf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows: list[tuple[int, dict[str, str]]] = []
    columns: list[str] = []
    start = end = 0
    for line in text.splitlines():
        if (fde := _FDE.search(line)) is not None:
            start, end = int(fde.group(1), 16), int(fde.group(2), 16)
            columns = []
        elif line.strip().startswith("LOC"):
            columns = line.split()[1:]
        elif columns and re.match(r"^[0-9a-f]{16} ", line):
            cells = _cells(line)
            location = int(cells[0], 16)
            if start <= location < end:
                rows.append((location, dict(zip(columns, cells[1:], strict=True))))
    return rows


def _cells(line: str) -> list[str]:
    """Split a row; readelf prints a register-in-register rule as two words, `r9 (r9)`."""
    cells: list[str] = []
    for word in line.split():
        if word.startswith("(") and cells:
            cells[-1] += f" {word}"
        else:
            cells.append(word)
    return cells


def register_name(number: int) -> str:
    return next(name for name, n in DWARF_NUMBERS.items() if n == number)


def describe_cfa(rule: r.CfaRule) -> str:
    if rule.expression is not None:
        return "exp"
    name = register_name(rule.register)
    return f"{name}{rule.offset:+d}"


def describe_register(row: r.UnwindRow, column: str) -> str:
    rules = dict(row.rules)
    rule = rules.get(row.return_column if column == "ra" else DWARF_NUMBERS[column])
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
            name = register_name(register)
            return f"r{register} ({name})"
        case r.SavedAtExpression():
            return "exp"
        case r.ValueOfExpression():
            return "vexp"
    return f"?{rule}"


@pytest.mark.parametrize(
    "flags",
    [
        ("-O2", "-fomit-frame-pointer"),
        ("-O0",),
        ("-O2", "-fno-asynchronous-unwind-tables"),
        ("-O2", "-static"),
        ("-O1", "-fno-omit-frame-pointer"),
    ],
    ids=lambda flags: "".join(flags),
)
def test_every_row_matches_readelf(tmp_path: Path, flags: tuple[str, ...]) -> None:
    elf = build_elf("cfi_chain.c", tmp_path, "-g", *flags)
    table = load_cfi(elf)
    expected = readelf_rows(elf)
    assert expected, "readelf printed no rows"
    for location, cells in expected:
        row = table.row_for(location)
        assert row is not None, f"no row at {location:#x}"
        ours = {"CFA": describe_cfa(row.cfa)}
        ours.update({column: describe_register(row, column) for column in cells if column != "CFA"})
        assert ours == cells, f"row at {location:#x}"


def test_plt_expression_from_a_real_binary(tmp_path: Path) -> None:
    """The PLT's CFA is rsp + 8, plus 8 once the entry has pushed its index."""
    elf = build_elf("symbols.c", tmp_path, "-O2")
    table = load_cfi(elf)
    plt_rows = [(loc, cells) for loc, cells in readelf_rows(elf) if cells["CFA"] == "exp"]
    if not plt_rows:
        pytest.skip("this toolchain emits no PLT expression")
    row = table.row_for(plt_rows[0][0])
    assert row is not None and row.cfa.expression is not None
    regs: list[int | None] = [0] * r.REGISTER_COUNT
    regs[r.RSP] = 0x7000
    empty = WindowMemory([])
    results = set()
    for low_bits in range(16):
        regs[r.RIP] = 0x1030 + low_bits
        results.add(row.cfa.compute(regs, empty) - 0x7000)
    assert results == {8, 16}


def test_expression_operations() -> None:
    regs: list[int | None] = [None] * r.REGISTER_COUNT
    regs[7] = 100
    memory = WindowMemory([])
    program = (
        Op("DW_OP_breg7", (8,)),
        Op("DW_OP_lit3", ()),
        Op("DW_OP_shl", ()),
        Op("DW_OP_lit2", ()),
        Op("DW_OP_minus", ()),
    )
    # (rsp + 8) shifted left by 3? No: breg pushes rsp+8, lit3 shl shifts it, lit2 minus.
    assert evaluate(program, regs, memory) == ((108 << 3) - 2)
    branch = (
        Op("DW_OP_lit1", ()),
        Op("DW_OP_bra", (3,)),
        Op("DW_OP_lit7", ()),
        Op("DW_OP_lit9", ()),
    )
    assert evaluate(branch, regs, memory) == 9
