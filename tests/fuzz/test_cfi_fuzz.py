"""Hostile input: corrupt CFI sections and random stacks never raise and never loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, StopReason
from qmpprof.unwind.cfi import CfiTable, load_cfi, parse_cfi_section
from qmpprof.unwind.rules import REGISTER_COUNT, RIP, RSP
from qmpprof.unwind.unwinder import Strategy, unwind
from tests.unit.conftest import build_elf

STACK = 0x7FFF_0000
FIXTURES = [HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def real_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("cfi_chain.c", tmp_path_factory.mktemp("fuzz"), "-O2", "-g", "-static")


@pytest.fixture(scope="module")
def eh_frame(real_elf: Path) -> tuple[bytes, int, list[int]]:
    with real_elf.open("rb") as stream:
        section = ELFFile(stream).get_section_by_name(".eh_frame")
        data, address = section.data(), section["sh_addr"]
    starts = [fde.start for fde in parse_cfi_section(data, address, eh_frame=True)]
    return data, address, starts


def lookups_never_raise(table: CfiTable, addresses: list[int]) -> None:
    for address in addresses:
        table.row_for(address)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.floats(min_value=0, max_value=1))
def test_truncated_eh_frame(eh_frame: tuple[bytes, int, list[int]], cut: float) -> None:
    data, address, starts = eh_frame
    table = CfiTable(parse_cfi_section(data[: int(len(data) * cut)], address, eh_frame=True))
    lookups_never_raise(table, starts[::7])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=12))
def test_corrupted_eh_frame(
    eh_frame: tuple[bytes, int, list[int]], flips: list[tuple[float, int]]
) -> None:
    data, address, starts = eh_frame
    mutated = bytearray(data)
    for where, value in flips:
        mutated[min(int(where * len(data)), len(data) - 1)] = value
    table = CfiTable(parse_cfi_section(bytes(mutated), address, eh_frame=True))
    lookups_never_raise(table, starts[::7])


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stack=st.one_of(
        st.binary(max_size=2048),
        st.binary(min_size=8, max_size=64).map(lambda pattern: pattern * 32),  # cyclic
    ),
    pc_index=st.integers(min_value=0),
    depth=st.integers(min_value=1, max_value=300),
)
def test_random_stacks_with_real_cfi(
    real_elf: Path,
    eh_frame: tuple[bytes, int, list[int]],
    stack: bytes,
    pc_index: int,
    depth: int,
) -> None:
    starts = eh_frame[2]
    regs: list[int | None] = [STACK + 64] * REGISTER_COUNT
    regs[RIP] = starts[pc_index % len(starts)] + 1
    regs[RSP] = STACK
    memory = WindowMemory([MemoryWindow(STACK, stack)])
    result = unwind(regs, memory, _table(real_elf), Strategy.AUTO, max_depth=depth)
    assert 1 <= len(result.frames) <= depth
    assert isinstance(result.stop, StopReason)


_TABLES: dict[Path, CfiTable] = {}


def _table(elf: Path) -> CfiTable:
    if elf not in _TABLES:
        _TABLES[elf] = load_cfi(elf)
    return _TABLES[elf]
