"""Every DW_CFA_* instruction, assembled by gcc from hand-written CFI, against readelf;
CFI that cannot be compiled is counted, covers nothing and never breaks an unwind."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, StopReason
from qmpprof.symbols.image import load_code
from qmpprof.unwind.cfi import CfiTable, load_cfi
from qmpprof.unwind.cfi_program import compile_fde
from qmpprof.unwind.rules import RBP, REGISTER_COUNT, RIP, RSP
from qmpprof.unwind.unwinder import Strategy, unwind
from tests.unit.conftest import build_elf
from tests.unit.test_cfi_readelf import (
    assert_agrees,
    our_fdes,
    readelf_entries,
    readelf_instructions,
)

ASSEMBLE = ("-nostdlib", "-static")
EVERY_INSTRUCTION = {
    "DW_CFA_advance_loc",
    "DW_CFA_advance_loc1",
    "DW_CFA_advance_loc2",
    "DW_CFA_advance_loc4",
    "DW_CFA_offset",
    "DW_CFA_restore",
    "DW_CFA_nop",
    "DW_CFA_set_loc",
    "DW_CFA_offset_extended",
    "DW_CFA_restore_extended",
    "DW_CFA_undefined",
    "DW_CFA_same_value",
    "DW_CFA_register",
    "DW_CFA_remember_state",
    "DW_CFA_restore_state",
    "DW_CFA_def_cfa",
    "DW_CFA_def_cfa_register",
    "DW_CFA_def_cfa_offset",
    "DW_CFA_def_cfa_expression",
    "DW_CFA_expression",
    "DW_CFA_offset_extended_sf",
    "DW_CFA_def_cfa_sf",
    "DW_CFA_def_cfa_offset_sf",
    "DW_CFA_val_offset",
    "DW_CFA_val_offset_sf",
    "DW_CFA_val_expression",
    "DW_CFA_MIPS_advance_loc8",
    "DW_CFA_GNU_window_save",
    "DW_CFA_GNU_args_size",
    "DW_CFA_GNU_negative_offset_extended",
}


@pytest.fixture(scope="module", params=[(), ("-DBOTH_SECTIONS",)], ids=["eh-frame", "both"])
def instructions_elf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("cfi-instructions")
    return build_elf("cfi_instructions.S", out, *ASSEMBLE, *request.param)


@pytest.fixture(scope="module")
def broken_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("cfi_broken.S", tmp_path_factory.mktemp("cfi-broken"), *ASSEMBLE)


def test_the_sources_use_every_instruction(instructions_elf: Path) -> None:
    """readelf's raw dump proves the test CFI really contains each instruction."""
    fdes = [e for e in readelf_entries(instructions_elf) if e.cie is not None]
    readelf_instructions(instructions_elf, fdes)
    used = set().union(*(fde.instructions for fde in fdes))
    assert used >= EVERY_INSTRUCTION, sorted(EVERY_INSTRUCTION - used)


def test_every_instruction_agrees_with_readelf(instructions_elf: Path) -> None:
    result = assert_agrees(instructions_elf, select=False)
    assert result.rows >= 24


def test_uncompilable_functions_are_counted_with_their_reason(broken_elf: Path) -> None:
    table = load_cfi(broken_elf)
    assert not table.uncompiled(compile_all=False)  # nothing looked up, nothing compiled
    table.row_for(0x401001)  # inside unknown_opcode
    assert table.uncompiled(compile_all=False).functions == 1
    report = table.uncompiled()
    assert report.functions == 2 and report.replaced == 0
    assert dict(report.reasons) == {
        "unknown CFA instruction 0x3f": 1,
        "no CFA rule (the CIE names no CFA register)": 1,
    }
    assert report.summary().startswith("2 functions without usable CFI (1 unknown CFA")


def test_unwinding_through_uncompilable_cfi_stops_cleanly(broken_elf: Path) -> None:
    table, code = load_cfi(broken_elf), load_code(broken_elf)
    fine, unknown_opcode, no_cfa_register = 0x401004, 0x401000, 0x401008
    assert table.row_for(fine + 1) is not None
    stack = 0x7000_0000
    memory = WindowMemory([MemoryWindow(stack, bytes(64))])
    for pc in (unknown_opcode + 1, no_cfa_register + 1):
        assert table.row_for(pc) is None
        regs: list[int | None] = [0] * REGISTER_COUNT
        regs[RIP], regs[RSP], regs[RBP] = pc, stack, stack + 16
        assert unwind(regs, memory, table, Strategy.CFI).stop is StopReason.NO_UNWIND_INFO
        auto = unwind(regs, memory, table, Strategy.AUTO, code=code)
        assert isinstance(auto.stop, StopReason)


def test_the_debug_frame_twin_stands_in_for_a_broken_eh_frame_fde(tmp_path: Path) -> None:
    elf = build_elf("cfi_instructions.S", tmp_path, *ASSEMBLE, "-DBOTH_SECTIONS")
    fdes = our_fdes(elf)
    eh_frame = next(fde for key, fde in fdes.items() if key[0] == ".eh_frame")
    twin = fdes[(".debug_frame", eh_frame.start, eh_frame.end)]
    broken = dataclasses.replace(eh_frame, instructions=b"\x3f")
    table = CfiTable([broken, twin])
    starts, rows = compile_fde(twin)
    assert table.row_for(starts[3]) == rows[3]
    report = table.uncompiled()
    assert (report.functions, report.replaced) == (0, 1)
