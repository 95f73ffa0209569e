"""Golden-file tests of what people read: the end-of-recording summary, `dump`'s text and
JSON, and a frame of `top`, drawn through rich's recording console from real samples of
the example guest (tests/unit/saved_samples.py).

The files are in tests/unit/data/snapshots/. After a deliberate change to an output,
regenerate them with `QMPPROF_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_snapshots.py`
and have a human read the diff before committing it: a golden file is only as right as
the eyes that checked it.
"""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console, RenderableType

from qmpprof.console.summary import render_summary
from qmpprof.console.top import Listing, ViewState, plain_snapshot, render
from qmpprof.model import Ending, EndReason, RecordStats, Sample
from qmpprof.output.dump import dump_json, dump_text
from qmpprof.profile import Grouping, Profile
from qmpprof.top_stats import SortKey, TopStats
from tests.unit.saved_samples import load_samples

SNAPSHOTS = Path(__file__).parent / "data" / "snapshots"
UPDATE = os.environ.get("QMPPROF_UPDATE_SNAPSHOTS") == "1"
WIDTH = 100
SAMPLES = load_samples("example_user")
#: The figures of a recording like the one the samples come from (1.5 s at 40 Hz, two
#: vCPUs), with a few ticks late and missed so that every count shows.
STATS = RecordStats(
    requested=60, ticks=48, samples=96, late=3, missed=12, paused_s=0.0912, elapsed_s=1.5
)


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"no {path}: QMPPROF_UPDATE_SNAPSHOTS=1 writes it (then review it)")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed (see the docstring)"


def recording_console() -> Console:
    """A console as wide as a terminal, that keeps what it prints (and shows none of it)."""
    return Console(record=True, width=WIDTH, file=io.StringIO())


def drawn(renderable: RenderableType) -> str:
    console = recording_console()
    console.print(renderable)
    return console.export_text()


def profile_of(samples: list[Sample], grouping: Grouping = Grouping.THREAD) -> Profile:
    profile = Profile(grouping=grouping)
    for sample in samples:
        profile.add(sample)
    return profile


def test_summary() -> None:
    console = recording_console()
    note = "kernel.elf: 2 functions without usable CFI (e.g. isr_stub: unknown CFA instruction)"
    render_summary(profile_of(SAMPLES), STATS, console, [note], limit=5)
    assert_snapshot("summary.txt", console.export_text())


def test_summary_by_program() -> None:
    """`--group-by comm`: crunch's two processes are one program, one root."""
    console = recording_console()
    render_summary(profile_of(SAMPLES, Grouping.COMM), STATS, console, limit=5)
    assert_snapshot("summary_programs.txt", console.export_text())


def test_summary_of_a_recording_that_went_wrong() -> None:
    console = recording_console()
    stats = RecordStats(
        requested=60,
        ticks=40,
        samples=80,
        failed=5,
        skipped_paused=4,
        abandoned=2,
        paused_s=0.25,
        elapsed_s=1.5,
        ended_by=Ending(EndReason.QEMU_EXITED),
        last_error="TickOverrun: the tick outlived its time budget in 'stop'",
    )
    render_summary(profile_of(SAMPLES[:80]), stats, console, limit=3)
    assert_snapshot("summary_failures.txt", console.export_text())


def first_ticks(count: int) -> list[Sample]:
    times = sorted({sample.time for sample in SAMPLES})[:count]
    return [sample for sample in SAMPLES if sample.time in times]


def test_dump_text() -> None:
    assert_snapshot("dump.txt", dump_text(first_ticks(3)))


def test_dump_json() -> None:
    assert_snapshot("dump.json", dump_json(first_ticks(1)) + "\n")


def top_stats() -> TopStats:
    stats = TopStats()
    for _ in {sample.time for sample in SAMPLES}:
        stats.count_tick()
    for sample in SAMPLES:
        stats.add(sample)
    return stats


@pytest.mark.parametrize(
    ("name", "state"),
    [
        ("top_functions.txt", ViewState(rows=8)),
        (
            "top_processes.txt",
            ViewState(sort=SortKey.TOTAL, listing=Listing.PROCESSES, paused=True),
        ),
        ("top_programs.txt", ViewState(sort=SortKey.TOTAL, listing=Listing.PROGRAMS)),
        ("top_help.txt", ViewState(help=True)),
    ],
)
def test_top_frame(name: str, state: ViewState) -> None:
    assert_snapshot(name, drawn(render(top_stats(), STATS, state, "/run/vm/qmp.sock")))


def test_top_without_a_terminal() -> None:
    text = plain_snapshot(top_stats(), STATS, ViewState(rows=8), "/run/vm/qmp.sock")
    assert_snapshot("top_plain.txt", text + "\n")


def test_top_says_what_nonblocking_did_about_torn_stacks() -> None:
    torn = replace(STATS, paused_s=0.0, retaken=7, retakes=6, still_torn=1)
    header = plain_snapshot(top_stats(), torn, ViewState(rows=8), "/run/vm/qmp.sock")
    assert header.splitlines()[0] == (
        "32.0 ticks/s  late 3  failed 0  VM paused 0.0%  retaken 7  still torn 1  "
        "— qmpprof top /run/vm/qmp.sock"
    )


def test_p_goes_from_functions_to_processes_to_programs_and_back() -> None:
    seen = [Listing.FUNCTIONS]
    for _ in range(3):
        seen.append(seen[-1].next())
    assert seen == [Listing.FUNCTIONS, Listing.PROCESSES, Listing.PROGRAMS, Listing.FUNCTIONS]
