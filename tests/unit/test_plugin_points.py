"""The lists things plug into: output formats, commands, and how a recording ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.cli import COMMANDS, build_parser
from qmpprof.model import Ending, EndReason
from qmpprof.output.flamegraph import SCRIPT, STYLE
from qmpprof.output.writers import FORMATS, Format, OutputFormat, infer_format


def test_every_format_is_listed_once() -> None:
    assert sorted(o.format.value for o in FORMATS) == sorted(f.value for f in Format)


@pytest.mark.parametrize("output", FORMATS, ids=lambda o: o.format.value)
def test_each_ending_picks_its_format(output: OutputFormat) -> None:
    for suffix in output.suffixes:
        assert infer_format(Path(f"profile{suffix.upper()}"), None) is output.format


def test_every_command_parses_its_help_line() -> None:
    parser = build_parser()
    for command in COMMANDS:
        extra = ["a.qmpcap"] if command.name == "report" else []
        assert parser.parse_args([command.name, *extra]).command == command.name


def test_the_flame_graph_script_and_style_are_read_from_the_package() -> None:
    assert "use strict" in SCRIPT and ".frame" in STYLE


@pytest.mark.parametrize(
    ("ending", "line"),
    [
        (Ending(EndReason.QEMU_EXITED), "QEMU exited"),
        (Ending(EndReason.TICKS_OVERRAN, count=5), "5 ticks in a row outlived their budget"),
        (Ending(EndReason.TICKS_FAILED, "boom", 5), "5 failed samples in a row (boom)"),
        (Ending(EndReason.INTERRUPTED, "SIGTERM"), "interrupted (SIGTERM)"),
        (Ending(EndReason.MONITOR_STUCK, "QEMU's monitor stopped"), "QEMU's monitor stopped"),
    ],
)
def test_an_ending_reads_as_before_the_enum(ending: Ending, line: str) -> None:
    assert str(ending) == line
