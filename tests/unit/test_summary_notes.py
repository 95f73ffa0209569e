"""The summary says what went wrong around the samples: functions without usable CFI,
ticks abandoned over their time budget, process maps that could not be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from qmpprof.commands.common import TargetOptions, build_analyzer, cfi_problems
from qmpprof.commands.record import maps_problems
from qmpprof.console.summary import render_summary
from qmpprof.model import RecordStats
from qmpprof.profile import Profile
from qmpprof.record.process_maps import MapsStats
from tests.unit.conftest import build_elf
from tests.unit.test_cfi_instructions import ASSEMBLE


@pytest.fixture(scope="module")
def broken_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("cfi_broken.S", tmp_path_factory.mktemp("summary"), *ASSEMBLE)


def test_functions_without_usable_cfi_are_named_per_module(broken_elf: Path) -> None:
    analyzer = build_analyzer(TargetOptions(qmp_socket="", kernel=broken_elf))
    assert cfi_problems(analyzer, compile_all=False) == []  # nothing looked up yet
    (line,) = cfi_problems(analyzer, compile_all=True)
    assert line.startswith(f"{broken_elf.name}: 2 functions without usable CFI (")
    assert "unknown CFA instruction 0x3f" in line


def test_the_summary_prints_notes_and_abandoned_ticks() -> None:
    console = Console(record=True, width=200)
    stats = RecordStats(ticks=10, samples=10, abandoned=2, elapsed_s=1.0)
    render_summary(Profile(), stats, console, ["k.elf: 1 functions without usable CFI"])
    text = console.export_text()
    assert "2 ticks abandoned over their time budget (VM resumed)" in text
    assert "k.elf: 1 functions without usable CFI" in text


def test_failed_reads_of_process_maps_and_guest_files_are_one_note() -> None:
    assert maps_problems(None) == [] and maps_problems(MapsStats(walks=40, reads=300)) == []
    stats = MapsStats(walks=40, failed=3, images=5, images_failed=2)
    assert maps_problems(stats) == [
        "process maps: 3 of 40 walks of a process's maps failed; 2 of 5 reads of files with "
        "no host copy found nothing in the guest"
    ]
