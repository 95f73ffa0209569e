"""Hostile DWARF: source lines and inlined calls of a corrupted ELF never raise and never
loop. The ELF is inlined.c built by gcc; the cases mutate bytes of its DWARF sections,
and the sizes and offsets its section headers give them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.line_program import ProgramShape, decode_rows
from qmpprof.symbols.lines import SourceLookup
from tests.fuzz.budget import cases, counted
from tests.fuzz.file_budget import file_cases
from tests.unit.conftest import build_elf

DWARF = (".debug_info", ".debug_abbrev", ".debug_line", ".debug_aranges", ".debug_str")
#: ELF64 section header: sh_offset at +24, sh_size at +32.
HEADER_FIELDS = (24, 32)


class Target:
    """The pristine ELF, where its DWARF sections and their headers are, and the file
    each case writes its mutation to."""

    def __init__(self, elf: Path, scratch: Path) -> None:
        self.data = elf.read_bytes()
        self.scratch = scratch
        with elf.open("rb") as stream:
            parsed = ELFFile(stream)
            self.sections = {}
            for index, section in enumerate(parsed.iter_sections()):
                if section.name in DWARF:
                    header = parsed["e_shoff"] + index * parsed["e_shentsize"]
                    self.sections[section.name] = (section["sh_offset"], section["sh_size"], header)
        symbol = load_symbols(elf).find("outer")
        assert symbol is not None
        self.addresses = [symbol.address + step for step in range(0, symbol.size, 3)]

    def write(self, data: bytearray) -> Path:
        self.scratch.write_bytes(data)
        return self.scratch


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Target:
    out = tmp_path_factory.mktemp("lines-fuzz")
    target = Target(build_elf("inlined.c", out, "-O2", "-g"), out / "mutated.elf")
    assert set(target.sections) >= {".debug_info", ".debug_abbrev", ".debug_line"}
    return target


def expand_everywhere(path: Path, addresses: list[int]) -> None:
    lookup = SourceLookup({"m": (path, 0)})
    for address in addresses:
        frames = lookup.expand("m", "outer", address)
        assert frames[-1].function == "outer" and not frames[-1].inlined
        assert all(frame.inlined for frame in frames[:-1])


section_names = st.sampled_from(DWARF)


@settings(max_examples=file_cases(40), suppress_health_check=[HealthCheck.too_slow])
@given(
    name=section_names,
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=8),
)
@counted
def test_mutated_dwarf_bytes(target: Target, name: str, edits: list[tuple[float, int]]) -> None:
    if name not in target.sections:
        return
    offset, size, _ = target.sections[name]
    data = bytearray(target.data)
    for where, value in edits:
        data[offset + int(where * size)] = value
    expand_everywhere(target.write(data), target.addresses)


@settings(max_examples=file_cases(20), suppress_health_check=[HealthCheck.too_slow])
@given(
    name=section_names,
    field=st.sampled_from(HEADER_FIELDS),
    value=st.one_of(st.integers(0, 1 << 16), st.integers(0, (1 << 64) - 1)),
)
@counted
def test_mutated_section_sizes_and_offsets(
    target: Target, name: str, field: int, value: int
) -> None:
    if name not in target.sections:
        return
    data = bytearray(target.data)
    struct.pack_into("<Q", data, target.sections[name][2] + field, value)
    expand_everywhere(target.write(data), target.addresses)


@settings(max_examples=cases(500))
@given(
    program=st.binary(max_size=256),
    minimum=st.integers(0, 255),
    per_instruction=st.integers(0, 4),
    line_base=st.integers(-128, 127),
    line_range=st.integers(0, 255),
    opcode_base=st.integers(0, 255),
    lengths=st.lists(st.integers(0, 255), max_size=16),
    address_size=st.sampled_from([0, 1, 4, 8, 200]),
)
@counted
def test_random_line_programs(
    program: bytes,
    minimum: int,
    per_instruction: int,
    line_base: int,
    line_range: int,
    opcode_base: int,
    lengths: list[int],
    address_size: int,
) -> None:
    """Any bytes under any header: rows, at most one per byte, and nothing raised."""
    shape = ProgramShape(
        minimum,
        per_instruction,
        line_base,
        line_range,
        opcode_base,
        tuple(lengths),
        address_size,
        little_endian=True,
    )
    rows = decode_rows(program, shape)
    assert len(rows) <= len(program)
