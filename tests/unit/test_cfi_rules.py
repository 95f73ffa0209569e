"""Compiled CFI rows against binutils' `readelf --debug-dump=frames-interp`, and the
expression evaluator on the expressions compilers emit."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.errors import UnsupportedExpression
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.unwind import rules as r
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.dwarf_expr import Op, decode_expression, evaluate
from qmpprof.unwind.numbering import from_i386
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


# -- i386: 4-byte words, i386 register numbers ------------------------------------------


def test_i386_rules_read_4_byte_slots_and_wrap_at_4_gib() -> None:
    stack = 0xFFFF_FFF0
    memory = WindowMemory([MemoryWindow(stack, bytes(range(1, 17)))])
    regs: list[int | None] = [None] * r.REGISTER_COUNT
    regs[r.RSP] = stack
    assert r.SavedAt(4, word=4).recover(stack, regs, memory) == 0x0807_0605
    assert r.SavedAt(4).recover(stack, regs, memory) == 0x0C0B_0A09_0807_0605
    assert r.CfaRule(r.RSP, 0x20, word=4).compute(regs, memory) == 0x10
    assert r.CfaRule(r.RSP, 0x20).compute(regs, memory) == stack + 0x20
    assert r.ValueAt(0x14, word=4).recover(stack, regs, memory) == 0x4
    # A slot at CFA - 4 with the CFA wrapped to 0 is the stack's last word.
    assert r.SavedAt(-4, word=4).recover(0, regs, memory) == 0x100F_0E0D


def test_an_i386_row_keeps_i386_callee_saved_registers() -> None:
    regs: list[int | None] = list(range(100, 100 + r.REGISTER_COUNT))
    memory = WindowMemory([MemoryWindow(200, bytes(8))])
    row = r.UnwindRow(r.CfaRule(r.RSP, 4, word=4), ((r.RIP, r.SavedAt(-4, 4)),), word=4)
    regs[r.RSP] = 200
    caller = row.caller_registers(regs, memory)
    kept = {n for n, value in enumerate(caller) if value is not None}
    assert kept == {3, 4, 5, 6, r.RSP, r.RIP}  # ebx esi edi ebp, esp = CFA, eip
    wide = r.UnwindRow(r.CfaRule(r.RSP, 8), ((r.RIP, r.SavedAt(-8)),))
    kept = {n for n, value in enumerate(wide.caller_registers(regs, memory)) if value is not None}
    assert kept == {3, 6, 12, 13, 14, 15, r.RSP, r.RIP}


def test_i386_expressions_are_renumbered_when_decoded() -> None:
    # DW_OP_breg4 (esp) 4; DW_OP_breg5 (ebp) -8; DW_OP_plus; DW_OP_breg8 (eip) 0; DW_OP_plus
    block = bytes([0x74, 4, 0x75, 0x78, 0x22, 0x78, 0, 0x22])
    ops = decode_expression(block, 4, from_i386)
    assert [op.name for op in ops] == [
        "DW_OP_breg7",
        "DW_OP_breg6",
        "DW_OP_plus",
        "DW_OP_breg16",
        "DW_OP_plus",
    ]
    assert decode_expression(block)[0].name == "DW_OP_breg4"  # x86-64's rsi, as before
    # DW_OP_bregx 1 (ecx) 0; DW_OP_regx 3 (ebx)
    assert decode_expression(bytes([0x92, 1, 0, 0x90, 3]), 4, from_i386) == (
        Op("DW_OP_bregx", (2, 0)),
        Op("DW_OP_regx", (3,)),
    )


def test_i386_registers_without_an_x86_64_twin_are_refused_when_evaluated() -> None:
    regs: list[int | None] = [0x1000] * r.REGISTER_COUNT
    memory = WindowMemory([])
    for block in (bytes([0x79, 0]), bytes([0x92, 9, 0])):  # DW_OP_breg9/bregx 9: eflags
        ops = decode_expression(block, 4, from_i386)
        with pytest.raises(UnsupportedExpression):
            evaluate(ops, regs, memory, (), 4)


def test_i386_expressions_compute_in_32_bits() -> None:
    memory = WindowMemory([MemoryWindow(0x1000, bytes(range(16)))])
    regs: list[int | None] = [None] * r.REGISTER_COUNT
    regs[r.RSP] = 0xFFFF_FFF0
    # DW_OP_breg7 0x20 wraps; DW_OP_const4u 0x1000, DW_OP_deref reads 4 bytes
    assert evaluate((Op("DW_OP_breg7", (0x20,)),), regs, memory, (), 4) == 0x10
    deref = (Op("DW_OP_const4u", (0x1004,)), Op("DW_OP_deref"))
    assert evaluate(deref, regs, memory, (), 4) == 0x0706_0504
    assert evaluate(deref, regs, memory) == 0x0B0A_0908_0706_0504
    # Signed comparisons of 32-bit values: 0xFFFFFFFF is -1 < 1.
    less = (Op("DW_OP_const4u", (0xFFFF_FFFF,)), Op("DW_OP_lit1"), Op("DW_OP_lt"))
    assert evaluate(less, regs, memory, (), 4) == 1
    assert evaluate(less, regs, memory) == 0
    negate = (Op("DW_OP_lit1"), Op("DW_OP_neg"))
    assert evaluate(negate, regs, memory, (), 4) == 0xFFFF_FFFF
    # DW_OP_addr's operand is an address of the file's size.
    assert decode_expression(bytes([0x03, 0x78, 0x56, 0x34, 0x12]), 4) == (
        Op("DW_OP_addr", (0x1234_5678,)),
    )


def test_same_value_of_a_register_with_no_slot_is_unknown() -> None:
    """A corrupt CIE's return column (an AArch64 one's rule is "same value" until told
    otherwise) names a register past every slot: its caller is unknown, not an error.
    Found by test_cfi_fuzz's corrupted AArch64 sections."""
    regs: list[int | None] = [0x1000] * r.REGISTER_COUNT
    assert r.SameValue(r.REGISTER_COUNT + 5).recover(0, regs, WindowMemory([])) is None
