"""Source lines and inlined calls from DWARF, against binutils' addr2line -f -i."""

from __future__ import annotations

import subprocess
from pathlib import Path

from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.lines import SourceLookup
from tests.unit.conftest import build_elf


def addr2line(elf: Path, address: int) -> list[tuple[str, str]]:
    """(function, file:line) pairs, innermost first, as addr2line prints them."""
    out = subprocess.run(
        ["addr2line", "-f", "-i", "-e", str(elf), f"{address:#x}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    pairs = []
    for function, where in zip(out[0::2], out[1::2], strict=False):
        file, _, line = where.rpartition(":")
        pairs.append((function, f"{Path(file).name}:{line.split()[0]}"))
    return pairs


def test_every_address_of_a_function_with_inlined_calls(tmp_path: Path) -> None:
    elf = build_elf("inlined.c", tmp_path, "-O2", "-g")
    symbol = load_symbols(elf).find("outer")
    assert symbol is not None
    lookup = SourceLookup({elf.name: elf})
    inlined_seen = 0
    for address in range(symbol.address, symbol.address + symbol.size):
        ours = [(s.function or "?", str(s.line)) for s in lookup.expand(elf.name, "outer", address)]
        expected = addr2line(elf, address)
        if expected and expected[0][1].endswith(":0"):
            continue  # addr2line's "no line" rows
        assert ours == expected, f"at {address:#x}"
        inlined_seen += len(ours) > 1
    assert inlined_seen > 0, "the compiler inlined nothing: the test checks too little"
