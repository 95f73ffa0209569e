"""Hostile CFI: corrupt .eh_frame/.debug_frame sections, random CFA programs and
expressions, and random stacks never raise anything but qmpprof's errors, and every
unwind ends with a StopReason.

The sections are those of cfi_instructions.S (every DW_CFA_* instruction, in both
sections) and of cfi_chain.c as gcc builds it; they are read once, and each case
mutates the bytes in memory and parses only them (small: a case takes a millisecond).
Every test runs twice: over x86-64 files, and over their i386 (ELF32) twins
(data/i386/), whose CFI is renumbered and unwound with 4-byte words.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadCfi, MemoryFault, UnsupportedExpression
from qmpprof.isa.base import Isa
from qmpprof.isa.x86 import X86_64
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, StopReason
from qmpprof.unwind.cfi import CfiTable, elf_isa, load_cfi
from qmpprof.unwind.cfi_entries import FdeEntry, parse_section
from qmpprof.unwind.cfi_program import compile_fde
from qmpprof.unwind.dwarf_expr import decode_expression, evaluate
from qmpprof.unwind.numbering import from_i386
from qmpprof.unwind.rules import REGISTER_COUNT, RIP, RSP
from qmpprof.unwind.unwinder import Strategy, unwind
from tests.fuzz.budget import cases, counted
from tests.unit.conftest import build_elf
from tests.unit.i386_builds import build_chain, build_i386

STACK = 0x7FFF_0000
#: too_slow again: this list replaces the profile's (tests/conftest.py).
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
MEMORY = WindowMemory([MemoryWindow(STACK, bytes(range(256)) * 4)])
ARCHITECTURES = ["x86-64", "i386", "aarch64"]
AARCH64_GCC = "aarch64-linux-gnu-gcc"


@dataclasses.dataclass(frozen=True)
class Section:
    name: str
    data: bytes
    address: int
    starts: list[int]  # where its FDEs start: the addresses each case looks up
    address_size: int = 8
    isa: Isa = X86_64  # an i386 file's: I386

    @property
    def word(self) -> int:
        return self.isa.word

    def table(self, data: bytes) -> CfiTable:
        eh_frame = self.name == ".eh_frame"
        found = parse_section(data, self.address, eh_frame, self.address_size, self.isa)
        return CfiTable(found.fdes, found.problems)


def sections_of(elf: Path) -> list[Section]:
    found = []
    with elf.open("rb") as stream:
        file = ELFFile(stream)
        address_size, isa = file.elfclass // 8, elf_isa(file)
        for name in (".eh_frame", ".debug_frame"):
            section = file.get_section_by_name(name)
            if section is not None:
                data, address = section.data(), section["sh_addr"]
                fdes = parse_section(data, address, name == ".eh_frame", address_size, isa).fdes
                starts = [fde.start for fde in fdes]
                found.append(Section(name, data, address, starts, address_size, isa))
    return found


@pytest.fixture(scope="module", params=ARCHITECTURES)
def sections(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[Section]:
    out = tmp_path_factory.mktemp("cfi-fuzz")
    if request.param == "i386":
        every = build_i386("i386/cfi_instructions.S", out, "-DBOTH_SECTIONS")
        chain = build_chain("O2-omit-fp", out)
        debug_only = build_chain("O2-omit-fp-debug-frame-only", out)
    elif request.param == "aarch64":  # signed return addresses, Debian's arm64 libc
        flags = ("-O2", "-g", "-static", "-mbranch-protection=standard")
        every = build_elf("cfi_chain.c", out, *flags, cc=AARCH64_GCC)
        chain = build_elf(
            "cfi_chain.c", out, "-O1", "-g", "-fno-omit-frame-pointer", cc=AARCH64_GCC
        )
        no_eh = ("-fno-asynchronous-unwind-tables", "-fno-unwind-tables")  # arm64's default
        debug_only = build_elf("cfi_chain.c", out, "-O2", "-g", *no_eh, cc=AARCH64_GCC)
    else:
        every = build_elf("cfi_instructions.S", out, "-nostdlib", "-static", "-DBOTH_SECTIONS")
        chain = build_elf("cfi_chain.c", out, "-O2", "-g")
        debug_only = build_elf("cfi_chain.c", out, "-O2", "-g", "-fno-asynchronous-unwind-tables")
    found = sections_of(every) + sections_of(chain) + sections_of(debug_only)
    assert {s.name for s in found} == {".eh_frame", ".debug_frame"}
    assert {s.word for s in found} == {4 if request.param == "i386" else 8}
    return found


def use_everything(table: CfiTable, addresses: list[int], word: int = 8, isa: Isa = X86_64) -> None:
    """Look up every address and unwind from it (all of which must not raise)."""
    table.uncompiled().summary()
    for address in addresses:
        table.row_for(address)
        table.row_for(address + 1)
        regs: list[int | None] = [STACK + 64] * REGISTER_COUNT
        regs[RIP], regs[RSP] = address + 1, STACK
        result = unwind(regs, MEMORY, table, Strategy.CFI, word=word, isa=isa)
        assert isinstance(result.stop, StopReason)
        if word == 4:
            assert all(frame.address < 1 << 32 for frame in result.frames)


@settings(max_examples=cases(100), deadline=None, suppress_health_check=FIXTURES)
@given(which=st.integers(min_value=0), cut=st.floats(min_value=0, max_value=1))
@counted
def test_truncated_sections(sections: list[Section], which: int, cut: float) -> None:
    section = sections[which % len(sections)]
    table = section.table(section.data[: int(len(section.data) * cut)])
    use_everything(table, section.starts, section.word, section.isa)


@settings(max_examples=cases(150), deadline=None, suppress_health_check=FIXTURES)
@given(
    which=st.integers(min_value=0),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8),
)
@counted
def test_corrupted_sections(
    sections: list[Section], which: int, flips: list[tuple[float, int]]
) -> None:
    section = sections[which % len(sections)]
    mutated = bytearray(section.data)
    for where, value in flips:
        mutated[min(int(where * len(mutated)), len(mutated) - 1)] = value
    use_everything(section.table(bytes(mutated)), section.starts, section.word, section.isa)


def a_real_fde(sections: list[Section]) -> FdeEntry:
    section = sections[0]
    eh_frame = section.name == ".eh_frame"
    found = parse_section(
        section.data, section.address, eh_frame, section.address_size, section.isa
    )
    return found.fdes[0]


@settings(max_examples=cases(300), deadline=None, suppress_health_check=FIXTURES)
@given(cie_program=st.binary(max_size=24), fde_program=st.binary(max_size=48))
@counted
def test_random_cfa_programs(
    sections: list[Section], cie_program: bytes, fde_program: bytes
) -> None:
    """Any instruction bytes in a CIE and an FDE: BadCfi or rows an unwind can use."""
    fde = a_real_fde(sections)
    cie = dataclasses.replace(fde.cie, instructions=cie_program)
    fde = dataclasses.replace(fde, cie=cie, instructions=fde_program)
    with contextlib.suppress(BadCfi):
        compile_fde(fde)
    use_everything(CfiTable([fde]), [fde.start, fde.start + 3], fde.cie.word)


def test_cie_without_cfa_register(sections: list[Section]) -> None:
    """DW_CFA_def_cfa_offset with no register ever named: counted, never a TypeError."""
    fde = a_real_fde(sections)
    cie = dataclasses.replace(fde.cie, instructions=b"\x0e\x10\x90\x01")  # offset 16; ra at -8
    fde = dataclasses.replace(fde, cie=cie, instructions=b"\x41\x0e\x18")
    table = CfiTable([fde])
    assert table.uncompiled().functions == 1
    regs: list[int | None] = [STACK] * REGISTER_COUNT
    regs[RIP] = fde.start + 2
    assert unwind(regs, MEMORY, table, Strategy.CFI).stop is StopReason.NO_UNWIND_INFO


@settings(max_examples=cases(300), deadline=None)
@given(block=st.binary(max_size=32), base=st.integers(0, 2**64 - 1))
@counted
def test_random_expressions(block: bytes, base: int) -> None:
    regs: list[int | None] = [(base + 8 * n) % 2**64 for n in range(REGISTER_COUNT)]
    with contextlib.suppress(UnsupportedExpression, MemoryFault):
        evaluate(decode_expression(block), regs, MEMORY, (STACK,))


@settings(max_examples=cases(300), deadline=None)
@given(block=st.binary(max_size=32), base=st.integers(0, 2**32 - 1))
@counted
def test_random_i386_expressions(block: bytes, base: int) -> None:
    """i386 register numbers, 4-byte addresses and words: a 32-bit value or our error."""
    regs: list[int | None] = [(base + 4 * n) % 2**32 for n in range(REGISTER_COUNT)]
    with contextlib.suppress(UnsupportedExpression, MemoryFault):
        value = evaluate(decode_expression(block, 4, from_i386), regs, MEMORY, (STACK,), 4)
        assert 0 <= value < 1 << 32


@pytest.fixture(scope="module", params=ARCHITECTURES)
def static_elf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz")
    if request.param == "i386":
        return build_chain("O2-omit-fp", out)
    if request.param == "aarch64":
        flags = ("-O2", "-g", "-static", "-mbranch-protection=standard")
        return build_elf("cfi_chain.c", out, *flags, cc=AARCH64_GCC)
    return build_elf("cfi_chain.c", out, "-O2", "-g", "-static")


@pytest.fixture(scope="module")
def static_table(static_elf: Path) -> tuple[CfiTable, list[int], Isa]:
    """The file's table, where its .eh_frame's FDEs start, and its instruction set."""
    (section,) = (s for s in sections_of(static_elf) if s.name == ".eh_frame")
    return load_cfi(static_elf), section.starts, section.isa


@settings(max_examples=cases(200), deadline=None, suppress_health_check=FIXTURES)
@given(
    stack=st.one_of(
        st.binary(max_size=2048),
        st.binary(min_size=8, max_size=64).map(lambda pattern: pattern * 32),  # cyclic
    ),
    pc_index=st.integers(min_value=0),
    depth=st.integers(min_value=1, max_value=300),
)
@counted
def test_random_stacks_with_real_cfi(
    static_table: tuple[CfiTable, list[int], Isa], stack: bytes, pc_index: int, depth: int
) -> None:
    table, starts, isa = static_table
    regs: list[int | None] = [STACK + 64] * REGISTER_COUNT
    regs[RIP] = starts[pc_index % len(starts)] + 1
    regs[RSP] = STACK
    memory = WindowMemory([MemoryWindow(STACK, stack)])
    result = unwind(regs, memory, table, Strategy.AUTO, max_depth=depth, word=isa.word, isa=isa)
    assert 1 <= len(result.frames) <= depth
    assert isinstance(result.stop, StopReason)
