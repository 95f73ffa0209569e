"""Compiled CFI rows against binutils' `readelf --debug-dump=frames-interp`, and the
expression evaluator on the expressions compilers emit."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.memory import WindowMemory
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.dwarf_expr import Op, evaluate
from tests.unit.conftest import build_elf
from tests.unit.test_cfi_readelf import describe_row, expected_rows, readelf_entries


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
    """Through the whole table: lookup, overlapping sections, the address cache."""
    elf = build_elf("cfi_chain.c", tmp_path, "-g", *flags)
    table = load_cfi(elf)
    entries = readelf_entries(elf)
    cies = {(e.section, e.offset): e for e in entries if e.cie is None}
    fdes = [expected_rows(e, cies) for e in entries if e.cie is not None and e.end > e.start]
    assert any(fde.rows for fde in fdes), "readelf printed no rows"
    for fde in fdes:
        for location, cells in fde.rows:
            row = table.row_for(location)
            assert row is not None, f"no row at {location:#x}"
            assert describe_row(row, fde.columns) == cells, f"row at {location:#x}"


def test_plt_expression_from_a_real_binary(tmp_path: Path) -> None:
    """The PLT's CFA is rsp + 8, plus 8 once the entry has pushed its index."""
    elf = build_elf("symbols.c", tmp_path, "-O2")
    table = load_cfi(elf)
    rows = [row for entry in readelf_entries(elf) if entry.cie is not None for row in entry.rows]
    plt_rows = [(loc, cells) for loc, cells in rows if cells["CFA"] == "exp"]
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
