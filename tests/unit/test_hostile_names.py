"""Symbol and process names that hold ESC, BEL, line breaks and rich markup: every
terminal output (summary, dump, top, progress) and the folded file show them spelled
out; no raw control character of theirs reaches the terminal.

The ELF is real: symbols.c built by gcc, its symbols renamed by objcopy --redefine-sym.
The registers are the example guest's, saved from QEMU.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.console import progress
from qmpprof.console.top import Listing, ViewState, plain_snapshot, render
from qmpprof.model import (
    CapturedSample,
    FrameAddress,
    FrameKind,
    Process,
    RawSample,
    Recording,
    RecordStats,
    Sample,
    StopReason,
    UnwoundStack,
)
from qmpprof.modules import load_module
from qmpprof.output.dump import dump_json, dump_text
from qmpprof.record.qmpcap import CaptureWriter
from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.lines import SourceLookup
from qmpprof.target.registers import parse_all
from qmpprof.top_stats import TopStats
from qmpprof.visible import visible
from tests.unit.conftest import DATA, build_elf

#: Clears the screen, retitles the terminal (OSC ... BEL), forges a line.
LEAF = "\x1b[2J\x1b]0;owned\x07leaf\nforged: 100%"
#: Tab, a colour, rich markup, a carriage return and a backspace.
MIDDLE = "mid\tdle\x1b[31m[bold]red[/bold]\r\x08"
#: What a guest can put in a 16-byte process name, and a right-to-left override.
PROCESS = Process(7, "\x1b[2J\x07p\n[bold]x\u202e")
#: SGR (colours, bold): the only escape sequences rich writes for a non-live render.
STYLING = re.compile(r"\x1b\[[0-9;]*m")


def raw_controls(text: str, allowed: str = "\n") -> set[str]:
    """The control, format and separator characters in `text` other than `allowed`."""
    return {
        char
        for char in text
        if unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp"} and char not in allowed
    }


@pytest.fixture(scope="module")
def hostile_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("objcopy") is None:
        pytest.fail("objcopy (binutils) is needed to rename symbols (make test installs it)")
    out = tmp_path_factory.mktemp("hostile")
    built = build_elf("symbols.c", out, "-O1", "-g")
    renamed = out / "hostile.elf"
    subprocess.run(
        [
            "objcopy",
            f"--redefine-sym=leaf={LEAF}",
            f"--redefine-sym=middle={MIDDLE}",
            str(built),
            str(renamed),
        ],
        check=True,
    )
    return renamed


def stack(elf: Path) -> UnwoundStack:
    table = load_symbols(elf)
    leaf, caller = table.find(LEAF), table.find(MIDDLE)
    assert leaf is not None and caller is not None, "objcopy did not rename the symbols"
    frames = (
        FrameAddress(leaf.address + 1, FrameKind.INSTRUCTION),
        FrameAddress(caller.address + 5, FrameKind.RETURN),
    )
    return UnwoundStack(frames, StopReason.END_OF_STACK)


def raw_sample() -> RawSample:
    return RawSample(0.0, parse_all((DATA / "regs_guest_longmode.txt").read_text())[0])


@pytest.fixture(scope="module")
def sample(hostile_elf: Path) -> Sample:
    analyzer = Analyzer(load_module(hostile_elf))
    symbolized = analyzer.symbolize(CapturedSample(raw_sample(), stack(hostile_elf), PROCESS))
    assert [f.function for f in symbolized.frames] == [LEAF, MIDDLE]
    return symbolized


def test_the_summary_and_the_folded_file_of_report(hostile_elf: Path, tmp_path: Path) -> None:
    capture, folded = tmp_path / "hostile.qmpcap", tmp_path / "out.folded"
    recording = Recording(0.0, 1.0, 0.01, kernel=str(hostile_elf))
    with CaptureWriter(capture, recording, keep_memory=False) as writer:
        for _ in range(3):
            writer.add(CapturedSample(raw_sample(), stack(hostile_elf), PROCESS))
    done = subprocess.run(
        [sys.executable, "-m", "qmpprof", "report", str(capture), "-o", str(folded)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert raw_controls(done.stdout + done.stderr) == set()
    assert visible(LEAF) in done.stdout and visible(PROCESS.label()) in done.stdout
    text = folded.read_text()
    assert raw_controls(text) == set()
    (line,) = text.splitlines()
    frames, count = line.rsplit(" ", 1)
    assert count == "3"
    leaf = visible(LEAF).replace(";", ":")  # the separator cannot be in a name
    assert frames.split(";") == [visible(PROCESS.label()), visible(MIDDLE), leaf]


def test_dump_text_has_one_line_per_frame(sample: Sample, hostile_elf: Path) -> None:
    text = dump_text([sample], SourceLookup({hostile_elf.name: (hostile_elf, 0)}), lines=True)
    assert raw_controls(text) == set()
    lines = text.splitlines()
    assert len(lines) == 1 + 2 + 1  # the vCPU, two frames, the stop reason
    assert visible(PROCESS.label()) in lines[0]
    assert f"{visible(LEAF)}+0x1" in lines[1] and f"{visible(MIDDLE)}+0x" in lines[2]


def test_dump_json_keeps_the_names_and_escapes_them(sample: Sample, hostile_elf: Path) -> None:
    text = dump_json([sample], SourceLookup({hostile_elf.name: (hostile_elf, 0)}))
    assert raw_controls(text) == set()
    (vcpu,) = json.loads(text)["vcpus"]
    assert vcpu["process"]["name"] == PROCESS.name
    assert [f["function"] for f in vcpu["frames"]] == [LEAF, MIDDLE]


def top_stats(sample: Sample) -> TopStats:
    stats = TopStats()
    stats.count_tick()
    stats.add(sample)
    return stats


@pytest.mark.parametrize("processes", [False, True], ids=["functions", "processes"])
def test_a_rendered_top_frame(sample: Sample, processes: bool) -> None:
    console = Console(
        record=True, file=io.StringIO(), force_terminal=True, color_system="truecolor", width=300
    )
    state = ViewState(listing=Listing.PROCESSES if processes else Listing.FUNCTIONS)
    console.print(render(top_stats(sample), RecordStats(), state, "\x1b]0;title\x07"))
    written = console.file.getvalue()  # type: ignore[attr-defined]
    assert raw_controls(STYLING.sub("", written)) == set()
    shown = console.export_text(styles=False)
    assert "[bold]" in shown  # markup in a name is text
    names = [PROCESS.label()] if processes else [LEAF, MIDDLE]
    assert all(visible(name) in shown for name in names)


def test_top_without_a_terminal(sample: Sample) -> None:
    text = plain_snapshot(top_stats(sample), RecordStats(), ViewState(), "title")
    assert raw_controls(text) == set()
    assert visible(LEAF) in text and visible(PROCESS.label()) in text


def test_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)  # a line on every update
    out = io.StringIO()
    with progress.RecordProgress(Console(file=out, force_terminal=False), 10.0) as shown:
        shown.update(RecordStats(ticks=5, failed=1, last_error=LEAF))
    assert out.getvalue().startswith("progress: 5 samples")
    assert raw_controls(out.getvalue()) == set()
