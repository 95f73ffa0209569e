"""32-bit x86 (i386) unwinding against GDB and readelf, on real i386 programs.

data/i386/chain.c (cfi_chain.c's chain with a `_start` of its own) is built several
ways (i386_builds.py); GDB stops on every instruction of the chain and records the
registers, stack bytes and its own frames (gdb_capture.py). Unwinding those bytes
offline, by the CFI of the ELF32 file or by frame pointers, must give GDB's frames:
with the vCPU's word 4, and through an AddressSpace under a 64-bit vCPU too (a 32-bit
program under a 64-bit kernel: the module's ELF class decides). Each build's CFI, and
hand-written CFI with every DW_CFA instruction and i386 register numbers, must agree
with `readelf --debug-dump=frames-interp` row for row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.address_space import AddressSpace, user_mapping
from qmpprof.isa.x86 import I386 as I386_ISA
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import KERNEL_HALF, MemoryWindow, Recovery, StopReason
from qmpprof.modules import load_module
from qmpprof.symbols.image import load_code
from qmpprof.unwind import rules as r
from qmpprof.unwind.callsite import follows_call
from qmpprof.unwind.cfi import CfiTable, load_cfi
from qmpprof.unwind.cfi_entries import parse_section
from qmpprof.unwind.unwinder import CfiLookup, Strategy, unwind, word_for
from tests.unit.conftest import CHAIN_FUNCTIONS, build_elf, capture_with_gdb
from tests.unit.i386_builds import (
    CHAIN_BUILDS,
    FRAMED_FUNCTIONS,
    build_chain,
    build_i386,
)
from tests.unit.test_cfi_instructions import EVERY_INSTRUCTION
from tests.unit.test_cfi_readelf import (
    I386,
    assert_agrees,
    describe_row,
    expected_rows,
    readelf_entries,
    readelf_instructions,
)
from tests.unit.test_symbols import nm_functions

Stop = dict[str, object]
#: (build name) -> (its ELF, GDB's stops on every instruction of the chain)
Captured = Callable[[str], tuple[Path, list[Stop]]]
FRAME_POINTER_BUILDS = ("O0-fp", "O0-fp-endbr32")


@pytest.fixture(scope="session")
def i386_captures(tmp_path_factory: pytest.TempPathFactory) -> Captured:
    """Each build and GDB's stops, made once a session (about 0.3 s of GDB each)."""

    @functools.cache
    def capture(name: str) -> tuple[Path, list[Stop]]:
        out = tmp_path_factory.mktemp(f"i386-{name}")
        elf = build_chain(name, out)
        return elf, capture_with_gdb(elf, CHAIN_FUNCTIONS, out / "stops.jsonl")

    return capture


def registers_of(stop: Stop) -> list[int | None]:
    """GDB's registers in our numbering: a 32-bit vCPU's, EAX as rax... (no r8-r15)."""
    registers = stop["registers"]
    assert isinstance(registers, dict) and stop["bits"] == 32
    return [registers.get(name) for name in r.DWARF_REGISTER_NAMES]


def stack_of(stop: Stop) -> WindowMemory:
    return WindowMemory(
        [MemoryWindow(int(str(stop["stack_base"])), bytes.fromhex(str(stop["stack"])))]
    )


def unwound(
    stop: Stop,
    cfi: CfiLookup | None,
    strategy: Strategy,
    code: MemoryReader | None,
    word: int = 4,
) -> list[int]:
    result = unwind(registers_of(stop), stack_of(stop), cfi, strategy, code, word=word)
    return [frame.address for frame in result.frames]


def gdb_frames(stop: Stop) -> list[int]:
    return cast(list[int], stop["frames"])


def assert_all_agree(name: str, stops: list[Stop], ours: Callable[[Stop], list[int]]) -> None:
    wrong = [(gdb_frames(stop), mine) for stop in stops if (mine := ours(stop)) != stop["frames"]]
    for theirs, mine in wrong[:3]:
        print(f"{name}\n  gdb:  {[hex(a) for a in theirs]}\n  ours: {[hex(a) for a in mine]}")
    assert not wrong, f"{len(wrong)} of {len(stops)} stops differ from GDB ({name})"


def in_functions(elf: Path, names: str) -> Callable[[Stop], bool]:
    """Whether a stop's pc lies in one of the functions `names` (comma-separated)."""
    functions = nm_functions(elf)
    spans = [functions[name] for name in names.split(",")]
    return lambda stop: any(start <= gdb_frames(stop)[0] < start + size for start, size in spans)


@pytest.mark.parametrize("name", sorted(CHAIN_BUILDS))
def test_cfi_unwind_matches_gdb_at_every_instruction(i386_captures: Captured, name: str) -> None:
    elf, stops = i386_captures(name)
    assert len(stops) > 60, "GDB stopped too rarely: the capture did not work"
    # leaf, keeps_registers, variable_array, realigned, main and _start at the deepest
    assert max(len(gdb_frames(stop)) for stop in stops) == 6
    table, code = load_cfi(elf), load_code(elf)
    assert_all_agree(name, stops, lambda stop: unwound(stop, table, Strategy.AUTO, code))


@pytest.mark.parametrize("name", FRAME_POINTER_BUILDS)
def test_frame_pointer_unwind_matches_gdb(i386_captures: Captured, name: str) -> None:
    """Every instruction of the framed functions, the unframed spots of leaves
    (`push %ebp`, `mov %esp,%ebp`, `ret`, `endbr32`) included."""
    elf, stops = i386_captures(name)
    framed = list(filter(in_functions(elf, FRAMED_FUNCTIONS), stops))
    assert len(framed) > 50
    code = load_code(elf)
    assert_all_agree(name, framed, lambda stop: unwound(stop, None, Strategy.FP, code))
    # 8-byte slots read from the same stacks are another chain: the word matters.
    wide = [unwound(stop, None, Strategy.FP, code, word=8) for stop in framed]
    assert sum(ours != gdb_frames(stop) for ours, stop in zip(wide, framed, strict=True)) > 40


@pytest.mark.parametrize("name", ["O2-omit-fp", "O0-fp"])
def test_a_32_bit_program_under_a_64_bit_vcpu_unwinds_by_its_module(
    i386_captures: Captured, name: str
) -> None:
    """A compat-mode program sampled in a 64-bit kernel: the vCPU's word is 8, the
    module's ELF class says 4, and its frames are unwound with 4-byte words."""
    elf, stops = i386_captures(name)
    module = load_module(elf, "chain")
    assert module.word == 4
    space = AddressSpace(user_mapping(module))
    assert space.word_size(gdb_frames(stops[0])[0]) == 4
    assert space.word_size(KERNEL_HALF + 0x1000) is None
    assert_all_agree(name, stops, lambda s: unwound(s, space, Strategy.AUTO, space.code, 8))
    if name == "O0-fp":
        framed = list(filter(in_functions(elf, FRAMED_FUNCTIONS), stops))
        assert_all_agree(name, framed, lambda s: unwound(s, space, Strategy.FP, space.code, 8))


def test_every_return_address_gdb_sees_follows_a_call(i386_captures: Captured) -> None:
    """The return-site check reads i386 calls (e8 rel32, ff /2) as it reads x86-64's."""
    elf, stops = i386_captures("O2-omit-fp")
    space = AddressSpace(user_mapping(load_module(elf, "chain")))
    returns = {address for stop in stops for address in gdb_frames(stop)[1:]}
    assert len(returns) >= 4
    assert all(space.return_sites.check(address) is True for address in returns)
    code = load_code(elf)
    assert not any(follows_call(code, gdb_frames(stop)[0]) for stop in stops[:3])


def test_rows_of_an_elf32_file_are_i386_rows(i386_captures: Captured) -> None:
    elf, _ = i386_captures("O2-omit-fp")
    leaf = nm_functions(elf)["leaf"][0]
    row = load_cfi(elf).row_for(leaf)
    assert row is not None
    assert row.word == 4 and row.return_column == r.RIP
    assert row.cfa == r.CfaRule(r.RSP, 4, None, 4)  # esp+4, in our numbering
    assert dict(row.rules)[r.RIP] == r.SavedAt(-4, 4)
    # The x86-64 build of the same source keeps 8-byte rows.
    wide = build_elf("cfi_chain.c", elf.parent, "-O2", "-g", "-static")
    wide_row = load_cfi(wide).row_for(nm_functions(wide)["leaf"][0])
    assert wide_row is not None and wide_row.word == 8
    assert load_module(wide).word == 8


def test_an_i386_table_survives_the_derived_cache(i386_captures: Captured) -> None:
    elf, _ = i386_captures("O2-omit-fp")
    leaf = nm_functions(elf)["leaf"][0]
    table = load_cfi(elf)
    again = CfiTable.from_plain(table.plain())
    assert again.row_for(leaf) == table.row_for(leaf)
    row = again.row_for(leaf)
    assert row is not None and row.word == 4
    cies, kept, problems = table.plain()
    older = [cie[:-1] for cie in cies]  # kept before CIEs had a word: read the file again
    with pytest.raises(ValueError):
        CfiTable.from_plain((older, kept, problems))


def test_x86_64_cfi_in_an_elf32_i386_file_stays_x86_64(tmp_path: Path) -> None:
    """A 64-bit kernel carried in an elf32-i386 file (for multiboot loaders) keeps
    x86-64's return column, 16: its CIEs are read as x86-64's."""
    elf = build_elf("cfi_chain.c", tmp_path, "-O2", "-static")
    with elf.open("rb") as stream:
        section = ELFFile(stream).get_section_by_name(".eh_frame")
        assert section is not None
        data, address = section.data(), section["sh_addr"]
    fdes = parse_section(data, address, True, 4, I386_ISA).fdes
    assert fdes and all(fde.cie.word == 8 for fde in fdes)


@pytest.mark.parametrize("name", sorted(CHAIN_BUILDS))
def test_chain_cfi_agrees_with_readelf(i386_captures: Captured, name: str) -> None:
    elf, _ = i386_captures(name)
    assert_agrees(elf, select=False)


@pytest.fixture(scope="module", params=[(), ("-DBOTH_SECTIONS",)], ids=["eh-frame", "both"])
def instructions_elf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("i386-cfi-instructions")
    return build_i386("i386/cfi_instructions.S", out, *request.param)


def test_the_i386_sources_use_every_instruction(instructions_elf: Path) -> None:
    fdes = [e for e in readelf_entries(instructions_elf) if e.cie is not None]
    readelf_instructions(instructions_elf, fdes)
    used = set().union(*(fde.instructions for fde in fdes))
    assert used >= EVERY_INSTRUCTION, sorted(EVERY_INSTRUCTION - used)


def test_every_i386_instruction_agrees_with_readelf(instructions_elf: Path) -> None:
    """Every instruction's register operand renumbered (eflags, with no x86-64 twin,
    kept under its own name), 4-byte set_loc and version 4 CIEs of address size 4."""
    result = assert_agrees(instructions_elf, select=False)
    assert result.rows >= 24


def test_i386_expressions_in_cfi_name_i386_registers(instructions_elf: Path) -> None:
    """cfi_instructions.S's expressions: CFA = esp + 4 (DW_OP_breg4), ebp = *(ebp + 0)
    and ebx = ebp + 4 (DW_OP_breg5), read as our rsp and rbp, 4-byte words."""
    table = load_cfi(instructions_elf)
    entries = readelf_entries(instructions_elf)
    cies = {(e.section, e.offset): e for e in entries if e.cie is None}
    fde = next(expected_rows(e, cies) for e in entries if e.cie is not None and len(e.rows) > 9)
    location, cells = next((at, cells) for at, cells in fde.rows if cells["ebp"] == "exp")
    row = table.row_for(location)
    assert row is not None and describe_row(row, fde.columns, I386) == cells
    stack, frame = 0xFFFF_FF00, 0xFFFF_FF40
    memory = WindowMemory([MemoryWindow(stack, bytes(range(256)))])
    regs: list[int | None] = [None] * r.REGISTER_COUNT
    regs[r.RSP], regs[r.RBP] = stack, frame
    caller = row.caller_registers(regs, memory)
    assert caller[r.RSP] == stack + 4  # the CFA: esp + 4
    assert caller[r.RBP] == 0x4342_4140  # *(ebp + 0), 4 bytes
    assert caller[3] == frame + 4  # ebx: a value, not a slot
    assert caller[r.RIP] == 0x0302_0100  # *(CFA - 4)
    assert caller[1] == stack + 8  # edx: CFA + 4 (DW_CFA_val_offset_sf)
    assert caller[2] is None  # ecx: undefined


def test_a_32_bit_vcpu_has_no_syscall_edge() -> None:
    """Kernel code on a user stack with RCX holding a user address is x86-64's
    `syscall` entry; a 32-bit vCPU's registers are never read so."""
    regs: list[int | None] = [0] * r.REGISTER_COUNT
    regs[r.RIP], regs[r.RSP], regs[2] = KERNEL_HALF + 0x1000, 0x7000_0000, 0x40_1000
    memory = WindowMemory([MemoryWindow(0x7000_0000, bytes(64))])
    wide = unwind(regs, memory, None, Strategy.FP, word=8)
    assert wide.frames[1].how is Recovery.SYSTEM_CALL
    narrow = unwind(list(regs), memory, None, Strategy.FP, word=4)
    assert all(frame.how is not Recovery.SYSTEM_CALL for frame in narrow.frames)
    assert isinstance(narrow.stop, StopReason)


def test_the_word_of_a_vcpu_mode() -> None:
    assert [word_for(bits) for bits in (64, 32, 16)] == [8, 4, 4]


def test_a_cfi_table_alone_leaves_the_word_to_the_vcpu() -> None:
    assert CfiTable([]).word_size(0x1000) is None


def test_the_plt_expression_of_an_i386_library(tmp_path: Path) -> None:
    """The PLT's CFA is esp + 4, plus 4 once the entry has pushed its index: an
    expression over esp and eip, computed in 32 bits."""
    flags = ("-m32", "-ffreestanding", "-nostdlib", "-shared", "-fPIC", "-O2")
    library = build_elf("i386/plt_calls.c", tmp_path, *flags)
    table = load_cfi(library)
    rows = [
        row for entry in readelf_entries(library) if entry.cie is not None for row in entry.rows
    ]
    plt = [location for location, cells in rows if cells["CFA"] == "exp"]
    assert plt, "the linker wrote no PLT expression"
    row = table.row_for(plt[0])
    assert row is not None and row.cfa.expression is not None and row.word == 4
    regs: list[int | None] = [None] * r.REGISTER_COUNT
    regs[r.RSP] = 0x7000
    empty = WindowMemory([])
    results = set()
    for low_bits in range(16):
        regs[r.RIP] = plt[0] + low_bits
        results.add(row.cfa.compute(regs, empty) - 0x7000)
    assert results == {4, 8}
