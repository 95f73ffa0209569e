"""Symbolization of a real ELF built from data/symbols.c, checked against binutils' nm."""

import subprocess
from pathlib import Path

import pytest

from qmpprof.errors import BadElf
from qmpprof.model import FrameAddress, FrameKind
from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.symbolizer import Symbolizer


def nm_functions(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of text symbols, as nm prints them."""
    out = subprocess.run(
        ["nm", "-S", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT":
            found[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return found


def test_every_function_nm_knows_is_found_at_start_middle_and_end(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    functions = nm_functions(symbols_elf)
    for name in ("leaf", "middle", "helper", "main"):
        address, size = functions[name]
        for probe in (address, address + size // 2, address + size - 1):
            hit = table.lookup(probe)
            assert hit is not None and hit[0].name == name
            assert hit[1] == probe - address


def test_return_address_names_the_calling_function(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    address, size = nm_functions(symbols_elf)["middle"]
    symbolizer = Symbolizer([table])
    # A return address just past the end of `middle` still belongs to the call in `middle`.
    frame = symbolizer.symbolize(FrameAddress(address + size, FrameKind.RETURN))
    assert frame.function == "middle"
    assert frame.offset == size
    unknown = symbolizer.symbolize(FrameAddress(0x10, FrameKind.INSTRUCTION))
    assert unknown.function is None and unknown.label() == "0x10"


def test_a_text_file_is_a_bad_elf(tmp_path: Path) -> None:
    not_elf = tmp_path / "kernel.txt"
    not_elf.write_text("hello\n")
    with pytest.raises(BadElf, match="not a readable ELF"):
        load_symbols(not_elf)


def test_a_missing_file_is_a_bad_elf(tmp_path: Path) -> None:
    with pytest.raises(BadElf, match="No such file"):
        load_symbols(tmp_path / "missing.elf")


def test_no_symbol_claims_addresses_beyond_its_section(symbols_elf: Path) -> None:
    table = load_symbols(symbols_elf)
    assert table.lookup(0xFFFFFFFF80100000) is None
