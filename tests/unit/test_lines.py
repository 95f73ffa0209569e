"""Source lines and inlined calls from DWARF, against binutils' addr2line -f -i."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from qmpprof.model import Frame, FrameAddress, FrameKind, Mode, Sample, StopReason
from qmpprof.output.dump import dump_json
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
    lookup = SourceLookup({elf.name: (elf, 0)})
    inlined_seen = 0
    for address in range(symbol.address, symbol.address + symbol.size):
        ours = [(s.function or "?", str(s.line)) for s in lookup.expand(elf.name, "outer", address)]
        expected = addr2line(elf, address)
        if expected and expected[0][1].endswith(":0"):
            continue  # addr2line's "no line" rows
        assert ours == expected, f"at {address:#x}"
        inlined_seen += len(ours) > 1
    assert inlined_seen > 0, "the compiler inlined nothing: the test checks too little"


def test_dump_json_lists_inlined_calls_as_frames_like_addr2line(tmp_path: Path) -> None:
    elf = build_elf("inlined.c", tmp_path, "-O2", "-g")
    symbol = load_symbols(elf).find("outer")
    assert symbol is not None
    addresses = range(symbol.address, symbol.address + symbol.size)
    address = next(a for a in addresses if len(addr2line(elf, a - 1)) == 3)
    # a return address just after that instruction: not a leaf, nothing is hidden
    frame = Frame(
        FrameAddress(address, FrameKind.RETURN), "outer", address - symbol.address, elf.name
    )
    leaf = Frame(FrameAddress(symbol.address, FrameKind.INSTRUCTION), "outer", 0, elf.name)
    sample = Sample(0.0, 0, Mode.USER, (leaf, frame), StopReason.END_OF_STACK)
    frames = json.loads(dump_json([sample], SourceLookup({elf.name: (elf, 0)}), lines=True))[
        "vcpus"
    ][0]["frames"]
    expected = addr2line(elf, address - 1)
    assert [(f["function"], f"{f['file']}:{f['line']}") for f in frames[1:]] == expected
    assert [f["inlined"] for f in frames] == [False, True, True, False]
    assert {f["address"] for f in frames[1:]} == {f"{address:#x}"}
    assert frames[1]["offset"] is None and frames[3]["offset"] == address - symbol.address
