"""The .debug_aranges reader, against binutils' readelf --debug-dump=aranges."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.symbols.aranges import read_aranges
from tests.unit.conftest import build_elf

BUILDS = {
    "dwarf32": ("-O2", "-g", "-ffunction-sections"),
    "dwarf64": ("-O2", "-g", "-gdwarf64", "-ffunction-sections"),
    "dwarf4": ("-O1", "-gdwarf-4"),
}


def readelf_aranges(elf: Path) -> list[tuple[int, int, int]]:
    """(address, length, CU offset) of every range readelf prints, its terminators left out."""
    out = subprocess.run(
        ["readelf", "--debug-dump=aranges", str(elf)], capture_output=True, text=True, check=True
    ).stdout
    ranges, unit = [], None
    for line in out.splitlines():
        words = line.split()
        if line.strip().startswith("Offset into .debug_info:"):
            unit = int(words[-1], 16)
        elif len(words) == 2 and all(c in "0123456789abcdef" for c in "".join(words)):
            address, length = (int(word, 16) for word in words)
            if (address, length) != (0, 0):
                assert unit is not None
                ranges.append((address, length, unit))
    return ranges


def section_bytes(elf: Path, name: str) -> bytes:
    with elf.open("rb") as stream:
        section = ELFFile(stream).get_section_by_name(name)
        assert section is not None
        return bytes(section.data())


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_ranges_are_readelfs(tmp_path: Path, build: str) -> None:
    elf = build_elf("symbols.c", tmp_path, *BUILDS[build])
    expected = readelf_aranges(elf)
    assert len(expected) >= 1
    index = read_aranges(section_bytes(elf, ".debug_aranges"))
    assert index.entries == sorted(expected, key=lambda entry: entry[0])
    for address, length, unit in expected:
        assert index.unit_at(address) == unit
        assert index.unit_at(address + length - 1) == unit
    starts = {address for address, _, _ in expected}
    ends = {address + length for address, length, _ in expected}
    for end in ends - starts:
        assert index.unit_at(end) is None


def test_a_truncated_section_keeps_the_ranges_before_the_cut(tmp_path: Path) -> None:
    elf = build_elf("symbols.c", tmp_path, *BUILDS["dwarf32"])
    data = section_bytes(elf, ".debug_aranges")
    whole = read_aranges(data).entries
    for cut in range(len(data)):
        entries = read_aranges(data[:cut]).entries
        assert set(entries) <= set(whole)
