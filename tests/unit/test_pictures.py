"""The README's pictures (docs/images/, written by `make pictures` from a real run of the
Linux demo guest) are there, are what their names say (a PNG, SVG that parses) and show
qmpprof's output: the summary's table and `top`'s, with the demo's workloads in them."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"
#: The largest a picture may be (the README loads all three).
MAX_BYTES = 300_000


def svg_lines(name: str) -> list[str]:
    """The text lines of a terminal picture rich drew: one <text> element per run of a
    style, placed at a height (y) and a column (x over the width of a character, which
    textLength gives: runs of spaces alone are left out); spaces are no-break spaces."""
    root = ET.parse(IMAGES / name).getroot()
    assert root.tag == f"{SVG}svg"
    runs = [
        (float(e.get("y", "0")), float(e.get("x", "0")), float(length), "".join(e.itertext()))
        for e in root.iter(f"{SVG}text")
        if (length := e.get("textLength")) is not None
    ]
    assert runs, f"{name} has no terminal text"
    char = next(length / len(text) for _, _, length, text in runs if text)
    rows: dict[float, list[str]] = {}
    for y, x, _, text in runs:
        row = rows.setdefault(y, [])
        column = round(x / char)
        row.extend(" " * (column + len(text) - len(row)))
        row[column : column + len(text)] = text.replace("\xa0", " ")
    return ["".join(row).rstrip() for _, row in sorted(rows.items())]


@pytest.mark.parametrize("name", ["flamegraph.png", "summary.svg", "top.svg"])
def test_pictures_are_small(name: str) -> None:
    assert 0 < (IMAGES / name).stat().st_size < MAX_BYTES


def test_flame_graph_is_a_png_1200_pixels_wide() -> None:
    data = (IMAGES / "flamegraph.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width == 1200 and 200 < height < 2000


def test_summary_shows_the_counts_and_the_heaviest_stacks() -> None:
    lines = svg_lines("summary.svg")
    assert any(" ticks (" in line and " vCPU samples) in " in line for line in lines)
    assert any(line.startswith("processes: ") and "crunch (" in line for line in lines)
    header = next(line for line in lines if "stack (leaf ← root)" in line)
    assert "%" in header and "samples" in header
    assert any("crunch_loop ← main" in line for line in lines)


def test_top_shows_its_header_and_table() -> None:
    lines = svg_lines("top.svg")
    assert any("ticks/s" in line and "qmpprof top" in line for line in lines)
    header = next(line for line in lines if "%Own" in line)
    assert header.split() == ["%Own", "%Total", "Own", "Total", "Function", "(module)"]
    assert any(line.rstrip().endswith("(crunch)") for line in lines)
    assert any("q quit" in line for line in lines)
