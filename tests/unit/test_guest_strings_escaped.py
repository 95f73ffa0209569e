"""A guest that names a process like markup or script: every output shows it literally.

The capture is crafted (a .qmpcap written with the capture writer) from real pieces: the
register dump saved from the example guest and a real ELF's function addresses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from qmpprof.model import (
    CapturedSample,
    FrameAddress,
    FrameKind,
    Process,
    RawSample,
    Recording,
    StopReason,
    UnwoundStack,
)
from qmpprof.record.qmpcap import CaptureWriter
from qmpprof.symbols.elf import load_symbols
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"
HOSTILE = "[bold red]x</text><script>alert(1)</script>"


def crafted_capture(path: Path, elf: Path) -> None:
    registers = parse_all((DATA / "regs_guest_longmode.txt").read_text())[0]
    table = load_symbols(elf)
    leaf, caller = (table.find(name) for name in ("leaf", "middle"))
    assert leaf is not None and caller is not None
    frames = (
        FrameAddress(leaf.address + 1, FrameKind.INSTRUCTION),
        FrameAddress(caller.address + 5, FrameKind.RETURN),
    )
    recording = Recording(started=0.0, duration_s=1.0, period_s=0.01, kernel=str(elf))
    with CaptureWriter(path, recording, keep_memory=False) as writer:
        for _ in range(3):
            writer.add(
                CapturedSample(
                    RawSample(0.0, registers),
                    UnwoundStack(frames, StopReason.END_OF_STACK),
                    Process(7, HOSTILE),
                )
            )


def test_the_name_appears_literally_everywhere(tmp_path: Path, symbols_elf: Path) -> None:
    capture = tmp_path / "crafted.qmpcap"
    crafted_capture(capture, symbols_elf)
    outputs = {fmt: tmp_path / f"out.{fmt}" for fmt in ("folded", "svg", "speedscope.json")}
    args = [arg for path in outputs.values() for arg in ("-o", str(path))]
    done = subprocess.run(
        [sys.executable, "-m", "qmpprof", "report", str(capture), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    label = f"{HOSTILE} (7)"
    assert label in done.stdout  # the terminal summary, not interpreted as rich markup
    assert outputs["folded"].read_text().startswith(label + ";")
    svg = ET.parse(outputs["svg"]).getroot()
    assert label in {g.get("data-n") for g in svg.iter("{http://www.w3.org/2000/svg}g")}
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}script"))) == 1
    speedscope = json.loads(outputs["speedscope.json"].read_text())
    assert any(label in profile["name"] for profile in speedscope["profiles"])
