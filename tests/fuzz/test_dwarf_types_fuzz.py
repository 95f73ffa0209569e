"""Hostile DWARF types: the example guest's struct layout read from a damaged ELF is a
layout (maybe empty), never an exception or an endless loop; the adapter made from it
reads guest memory only through MemoryFault-raising reads, names bounded."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmpprof.errors import MemoryFault
from qmpprof.guest.adapter import NAME_LIMIT
from qmpprof.guest.dwarf_types import KernelLayout, read_layout
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow, RegisterSet
from tests.fuzz.budget import cases, counted
from tests.fuzz.elf_edit import sections
from tests.fuzz.file_budget import file_cases
from tests.unit.conftest import build_elf

DWARF = (".debug_info", ".debug_abbrev", ".debug_str", ".debug_line_str", ".symtab")


class Target:
    def __init__(self, elf: Path, scratch: Path) -> None:
        self.data = elf.read_bytes()
        self.scratch = scratch
        spans = sections(self.data)
        self.regions = [(s.offset, s.size) for s in spans if s.name in DWARF and s.size]
        self.regions += [(s.header, 64) for s in spans if s.name in DWARF]


@pytest.fixture(scope="module")
def layout_elf(tmp_path_factory: pytest.TempPathFactory) -> Target:
    out = tmp_path_factory.mktemp("dwarf-fuzz")
    elf = build_elf("os_layout.c", out, "-g", "-O0", "-no-pie")
    layout = read_layout(elf, {"cpu_current"}, {"process"})
    assert {"pid", "name"} <= layout.structs["process"].keys()
    return Target(elf, out / "damaged.elf")


@settings(max_examples=file_cases(25), suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 20), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
        min_size=1,
        max_size=4,
    )
)
@counted
def test_dwarf_type_layout_of_damaged_elf(
    layout_elf: Target, edits: list[tuple[int, float, int]]
) -> None:
    data = bytearray(layout_elf.data)
    for region, where, value in edits:
        offset, size = layout_elf.regions[region % len(layout_elf.regions)]
        data[offset + int(where * size)] = value
    layout_elf.scratch.write_bytes(data)
    layout = read_layout(layout_elf.scratch, {"cpu_current"}, {"process"})
    assert isinstance(layout, KernelLayout)
    for members in layout.structs.values():
        for member in members.values():
            assert member.offset >= 0 and (member.size is None or member.size >= 0)
    adapter = ExampleGuestAdapter.from_kernel(layout_elf.scratch)
    if adapter is not None:
        assert adapter.fields.name_size <= NAME_LIMIT


@settings(max_examples=cases(300))
@given(
    seed=st.integers(0, 1 << 64),
    pid_offset=st.integers(0, 1 << 64),
    name_offset=st.integers(0, 1 << 64),
    name_size=st.integers(0, 1 << 40),
    vcpu=st.integers(0, 1 << 16),
)
@counted
def test_example_adapter_over_random_guest_memory(
    seed: int, pid_offset: int, name_offset: int, name_size: int, vcpu: int
) -> None:
    """Pointers, offsets and sizes from hostile DWARF and memory: a process, or
    MemoryFault naming the address to fetch."""
    rng = random.Random(seed)
    base = rng.choice([0, 0x1000, (1 << 64) - 0x3000])
    memory = WindowMemory(
        [
            MemoryWindow(base, rng.randbytes(0x2000)),
            MemoryWindow(rng.getrandbits(64), rng.randbytes(rng.randrange(64))),
        ]
    )
    adapter = ExampleGuestAdapter(base + rng.randrange(0x1000), pid_offset, name_offset, name_size)
    registers = RegisterSet(vcpu, {"rip": 0, "rsp": 0, "rbp": 0}, 8, 0, False, 64)
    try:
        process = adapter.process(registers, memory)
    except MemoryFault as fault:
        assert fault.size <= max(NAME_LIMIT, 8)
        return
    assert process is not None
    assert len(process.name) <= NAME_LIMIT


@settings(max_examples=cases(300))
@given(
    windows=st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.binary(max_size=64)), max_size=4),
    reads=st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, 1 << 62)), max_size=8),
)
@counted
def test_window_memory_reads(
    windows: list[tuple[int, bytes]], reads: list[tuple[int, int]]
) -> None:
    memory = WindowMemory(MemoryWindow(base, data) for base, data in windows)
    for address, size in reads + [(base, len(data)) for base, data in windows]:
        with contextlib.suppress(MemoryFault):
            assert len(memory.read(address, size)) == size
        with contextlib.suppress(MemoryFault):
            assert 0 <= memory.read_u64(address) < 1 << 64
