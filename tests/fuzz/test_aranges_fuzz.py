"""Hostile .debug_aranges: the struct reader never raises, never loops, reads no range
past the section's end, and every lookup gives a CU offset it read or None. The section
is symbols.c's as gcc builds it (DWARF 32 and 64); each case mutates it in memory."""

from __future__ import annotations

import struct

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.symbols.aranges import ArangeIndex, read_aranges
from tests.fuzz.budget import cases, counted
from tests.unit.conftest import build_elf


@pytest.fixture(scope="module")
def sections(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    out = tmp_path_factory.mktemp("aranges-fuzz")
    found = []
    for flags in (("-gdwarf-5",), ("-gdwarf64",)):
        elf = build_elf("symbols.c", out, "-O2", "-g", "-ffunction-sections", *flags)
        with elf.open("rb") as stream:
            section = ELFFile(stream).get_section_by_name(".debug_aranges")
            assert section is not None
            found.append(bytes(section.data()))
    return found


def check(data: bytes, addresses: list[int]) -> None:
    index = read_aranges(data)
    assert isinstance(index, ArangeIndex)
    # a range is 16 bytes at least (8 for 4-byte addresses): no more than the data holds
    assert len(index.entries) <= len(data) // 8
    units = {unit for _, _, unit in index.entries}
    for start, length, _ in index.entries[:50]:
        addresses += [start, start + length - 1, start + length]
    for address in addresses:
        assert index.unit_at(address) in units | {None}


@settings(max_examples=cases(300))
@given(
    which=st.integers(0, 1),
    edits=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=8),
    cut=st.floats(0, 1),
    addresses=st.lists(st.integers(0, (1 << 64) - 1), max_size=4),
)
@counted
def test_mutated_aranges(
    sections: list[bytes],
    which: int,
    edits: list[tuple[float, int]],
    cut: float,
    addresses: list[int],
) -> None:
    data = bytearray(sections[which])
    for where, value in edits:
        data[int(where * len(data))] = value
    check(bytes(data[: int(cut * len(data)) + 1]), addresses)


@settings(max_examples=cases(300))
@given(
    length=st.one_of(st.integers(0, 64), st.sampled_from([0xFFFFFFF0, 0xFFFFFFFF, 1 << 31])),
    wide=st.integers(0, (1 << 64) - 1),
    version=st.integers(0, 6),
    address_size=st.sampled_from([0, 1, 2, 4, 8, 255]),
    segment_size=st.sampled_from([0, 4, 8]),
    tail=st.binary(max_size=96),
)
@counted
def test_forged_set_headers(
    length: int, wide: int, version: int, address_size: int, segment_size: int, tail: bytes
) -> None:
    """Headers with lengths, address and segment sizes the reader must refuse or bound."""
    header = struct.pack("<I", length)
    if length == 0xFFFFFFFF:
        header += struct.pack("<Q", wide)
    header += struct.pack("<HIBB", version, 0, address_size, segment_size)
    check(header + tail, [0, 1 << 63])
    check((header + tail) * 3, [0])
