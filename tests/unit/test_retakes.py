"""--nonblocking's retakes (record/sampler.py retake_torn) over ticks captured from the
example guest while it ran (user workload, two vCPUs): stacks that tore while they were
read, the ticks taken at once after them, and a tick with nothing torn
(data/samples/torn_ticks.qmpcap, recorded by data/samples/record_torn.py, memory kept).

Every sample is examined again from the memory it kept, as `report --reunwind` does,
so the torn check runs on the guest's real bytes; `take` hands out the ticks that
followed, in their order.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.console.summary import render_summary, retakes_line
from qmpprof.model import KERNEL_ONLY, CapturedSample, Process, RecordStats
from qmpprof.profile import Profile
from qmpprof.record.qmpcap import read_capture
from qmpprof.record.sampler import MAX_RETAKES, retake_torn, switched_task
from tests.unit.data.qmp import guest_setup

FIXTURE = Path(__file__).parent / "data" / "samples" / "torn_ticks.qmpcap"
Tick = list[CapturedSample]


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    guest_setup.built_guest()
    return guest_setup.guest_analyzer()


@pytest.fixture(scope="module")
def ticks(analyzer: Analyzer) -> list[Tick]:
    """The recorded ticks, in order (a tick's samples share their time), each sample
    examined again from its memory."""
    with read_capture(FIXTURE) as capture:
        recorded = list(capture.samples())
    examined = []
    for _, grouped in itertools.groupby(recorded, key=lambda sample: sample.raw.time):
        tick = list(grouped)
        again = [analyzer.examine(sample.raw).sample for sample in tick]
        same = all(a.stack == s.stack for a, s in zip(again, tick, strict=True))
        assert same, "the example guest was rebuilt since: re-record with record_torn.py"
        examined.append(again)
    return examined


def torn_vcpus(analyzer: Analyzer, tick: Tick) -> set[int]:
    return {sample.raw.vcpu for sample in tick if analyzer.is_torn(sample)}


def group(analyzer: Analyzer, ticks: list[Tick], retakes_to_recover: int) -> list[Tick]:
    """A torn tick and the two taken after it, whose torn vCPUs came back whole after
    `retakes_to_recover` retakes."""
    for at in range(len(ticks) - 2):
        torn = torn_vcpus(analyzer, ticks[at])
        after = [torn & torn_vcpus(analyzer, tick) for tick in ticks[at + 1 : at + 3]]
        recovering = [torn] * (retakes_to_recover - 1) + [set()]
        if torn and after[:retakes_to_recover] == recovering:
            return ticks[at : at + 3]
    raise AssertionError(f"no tick recovering after {retakes_to_recover} retakes recorded")


class Takes:
    """`take` for retake_torn: the recorded ticks in turn, counted, each with the vCPUs
    it is asked to unwind (as the sampler's take, which reads all and unwinds those)."""

    def __init__(self, ticks: list[Tick]) -> None:
        self._ticks: Iterator[Tick] = iter(ticks)
        self.taken = 0
        self.asked: list[set[int]] = []

    async def __call__(self, vcpus: Collection[int] | None) -> Tick:
        assert vcpus is not None, "a retake unwinds only the vCPUs it is for"
        self.taken += 1
        self.asked.append(set(vcpus))
        return [sample for sample in next(self._ticks) if sample.raw.vcpu in vcpus]


def test_the_capture_time_check_is_the_torn_flag_symbolization_sets(
    analyzer: Analyzer, ticks: list[Tick]
) -> None:
    samples = [sample for tick in ticks for sample in tick]
    torn = [analyzer.is_torn(sample) for sample in samples]
    assert torn == [analyzer.symbolize(sample).torn for sample in samples]
    assert any(torn) and not all(torn)


async def test_a_torn_vcpu_is_taken_again_and_the_whole_one_published(
    analyzer: Analyzer, ticks: list[Tick]
) -> None:
    first, second, _ = group(analyzer, ticks, retakes_to_recover=1)
    torn = torn_vcpus(analyzer, first)
    stats, takes = RecordStats(), Takes([second])
    published = await retake_torn(first, takes, analyzer.is_torn, stats)
    assert [s.raw.vcpu for s in published] == [s.raw.vcpu for s in first]
    for mine, was, again in zip(published, first, second, strict=True):
        assert mine is (again if was.raw.vcpu in torn else was)
        assert not analyzer.is_torn(mine)
    assert (stats.retaken, stats.retakes, stats.still_torn, takes.taken) == (len(torn), 1, 0, 1)
    assert takes.asked == [torn]


async def test_a_stack_torn_again_is_taken_once_more(analyzer: Analyzer, ticks: list[Tick]) -> None:
    first, second, third = group(analyzer, ticks, retakes_to_recover=2)
    torn = torn_vcpus(analyzer, first)
    stats, takes = RecordStats(), Takes([second, third])
    published = await retake_torn(first, takes, analyzer.is_torn, stats, MAX_RETAKES)
    for mine, was, again in zip(published, first, third, strict=True):
        assert mine is (again if was.raw.vcpu in torn else was)
    assert torn_vcpus(analyzer, published) == set()
    assert (stats.retaken, stats.retakes, stats.still_torn) == (len(torn), 2, 0)
    assert takes.asked == [torn, torn]


async def test_retakes_run_out_and_the_last_torn_take_is_published(
    analyzer: Analyzer, ticks: list[Tick]
) -> None:
    first, second, _ = group(analyzer, ticks, retakes_to_recover=2)
    torn = torn_vcpus(analyzer, first)
    stats, takes = RecordStats(), Takes([second])
    published = await retake_torn(first, takes, analyzer.is_torn, stats, retakes=1)
    for mine, was, again in zip(published, first, second, strict=True):
        assert mine is (again if was.raw.vcpu in torn else was)
    assert torn_vcpus(analyzer, published) == torn
    assert (stats.retaken, stats.retakes, stats.still_torn) == (len(torn), 1, len(torn))


async def test_without_retakes_the_torn_are_published_and_counted(
    analyzer: Analyzer, ticks: list[Tick]
) -> None:
    first = group(analyzer, ticks, retakes_to_recover=1)[0]
    stats, takes = RecordStats(), Takes([])
    assert await retake_torn(first, takes, analyzer.is_torn, stats, retakes=0) == first
    torn = len(torn_vcpus(analyzer, first))
    assert (stats.retaken, stats.retakes, stats.still_torn, takes.taken) == (0, 0, torn, 0)


async def test_a_whole_tick_costs_no_retake(analyzer: Analyzer, ticks: list[Tick]) -> None:
    (whole,) = [tick for tick in ticks if not torn_vcpus(analyzer, tick)][:1]
    stats, takes = RecordStats(), Takes([])
    assert await retake_torn(whole, takes, analyzer.is_torn, stats) == whole
    assert stats == RecordStats() and takes.taken == 0


def test_a_task_whose_page_tables_are_not_loaded_was_switched_under_the_sample(
    ticks: list[Tick],
) -> None:
    """ProcessMaps answers () for a task whose mm is not what CR3 holds; a kernel
    thread or idle context (no pid) has no maps to compare, and a guest without maps
    read (None) is never judged."""
    sample = ticks[0][0]
    named = replace(sample, process=Process(7, "crunch", 7))
    assert switched_task(replace(named, raw=replace(named.raw, file_maps=())))
    assert not switched_task(replace(named, raw=replace(named.raw, file_maps=None)))
    kernel = replace(sample, process=KERNEL_ONLY)
    assert not switched_task(replace(kernel, raw=replace(kernel.raw, file_maps=())))


def test_the_summary_says_what_was_retaken_and_what_stayed_torn() -> None:
    assert retakes_line(RecordStats(samples=100)) is None
    stats = RecordStats(ticks=50, samples=100, retaken=7, retakes=8, still_torn=1, elapsed_s=1)
    console = Console(record=True, width=300)
    render_summary(Profile(), stats, console)
    assert (
        "torn stacks retaken: 7 vCPU samples (7.0%) tore while read and were taken again, "
        "in 8 more register reads (the VM running); 1 still torn after the retakes"
    ) in console.export_text()
