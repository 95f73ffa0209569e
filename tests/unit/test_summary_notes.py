"""The summary says what went wrong around the samples: functions without usable CFI,
ticks abandoned over their time budget, process maps that could not be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from qmpprof.commands.common import TargetOptions, build_analyzer, cfi_problems
from qmpprof.commands.record import maps_problems
from qmpprof.console.summary import SUMMARY_PROCESSES, render_summary
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


def test_a_guest_that_forks_and_execs_gets_its_busiest_processes_and_a_count() -> None:
    """One label per pid: a shell loop's hundreds of `true` processes are counted, not
    listed; the busiest come first, with their shares."""
    profile = Profile()
    profile.processes.update({"gzip (133)": 300, "perl (134)": 200})
    profile.processes.update({f"true ({pid})": 1 for pid in range(1000, 1500)})
    console = Console(record=True, width=200)
    render_summary(profile, RecordStats(), console, [], limit=1)
    lines = [line for line in console.export_text().splitlines() if "processes:" in line]
    assert len(lines) == 1 and lines[0].startswith("processes: gzip (133) 30.0%, perl (134) 20.0%")
    rest = 500 - (SUMMARY_PROCESSES - 2)
    assert lines[0].count("true (") == SUMMARY_PROCESSES - 2
    assert lines[0].endswith(f", {rest} more {rest / 10:.1f}%")
