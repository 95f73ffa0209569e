"""The live view's statistics (top_stats.py) over 96 samples of the example guest's user
workload on two vCPUs (tests/unit/saved_samples.py), checked against counts taken
straight from the samples."""

from __future__ import annotations

from collections import Counter

import pytest

from qmpprof.model import Mode, Sample
from qmpprof.top_stats import Row, SortKey, TopStats
from tests.unit.saved_samples import load_samples

SAMPLES = load_samples("example_user")


def fed(stats: TopStats, samples: list[Sample] = SAMPLES) -> TopStats:
    """`stats` after one tick per sampling instant and every sample added."""
    for _ in {sample.time for sample in samples}:
        stats.count_tick()
    for sample in samples:
        stats.add(sample)
    return stats


def keys(sample: Sample) -> list[tuple[str, str]]:
    return [(frame.label(), frame.module or "?") for frame in sample.frames]


def test_the_saved_samples_are_what_these_tests_assume() -> None:
    assert len(SAMPLES) == 96
    assert Counter(s.mode for s in SAMPLES) == {Mode.IDLE: 59, Mode.KERNEL: 21, Mode.USER: 16}
    assert Counter(s.vcpu for s in SAMPLES) == {0: 48, 1: 48}
    busy = [s for s in SAMPLES if s.mode is not Mode.IDLE]
    assert Counter(s.label() for s in busy) == {
        "crunch (1)": 13,
        "crunch (2)": 11,
        "pulse (3)": 4,
        "[kernel]": 9,
    }


def test_every_sample_counts_in_modes_and_busy_ones_per_vcpu() -> None:
    stats = fed(TopStats())
    assert stats.ticks == 48
    assert stats.modes == Counter(s.mode for s in SAMPLES)
    busy = Counter(s.vcpu for s in SAMPLES if s.mode is not Mode.IDLE)
    assert stats.vcpus == busy
    assert sum(stats.vcpus.values()) == 21 + 16


def test_own_is_the_leaf_and_total_counts_a_function_once_a_sample() -> None:
    stats = fed(TopStats())
    shown = [s for s in SAMPLES if s.mode is not Mode.IDLE]
    assert stats.own == Counter(keys(s)[0] for s in shown)
    assert stats.total == Counter(key for s in shown for key in set(keys(s)))
    assert stats.processes == Counter(s.label() for s in shown)
    assert all(stats.total[key] >= count for key, count in stats.own.items())


def test_idle_samples_show_only_when_asked() -> None:
    hidden, shown = fed(TopStats()), fed(TopStats(show_idle=True))
    assert sum(shown.own.values()) == 96
    assert sum(hidden.own.values()) == 96 - 59
    assert hidden.modes == shown.modes


@pytest.mark.parametrize(
    ("hiding", "mode"),
    [(TopStats(show_kernel=False), Mode.KERNEL), (TopStats(show_user=False), Mode.USER)],
    ids=["kernel", "user"],
)
def test_hiding_a_mode_keeps_its_samples_in_the_mode_and_vcpu_counts(
    hiding: TopStats, mode: Mode
) -> None:
    stats = fed(hiding)
    assert stats.modes == Counter(s.mode for s in SAMPLES)
    kept = [s for s in SAMPLES if s.mode not in (mode, Mode.IDLE)]
    assert stats.own == Counter(keys(s)[0] for s in kept)
    assert stats.vcpus == Counter(s.vcpu for s in SAMPLES if s.mode is not Mode.IDLE)


def test_a_process_filter_counts_that_process_only() -> None:
    stats = fed(TopStats(process_filter="crunch"))
    crunch = [s for s in SAMPLES if s.process is not None and s.process.name == "crunch"]
    assert len(crunch) == 13 + 11
    assert stats.processes == {"crunch (1)": 13, "crunch (2)": 11}
    assert stats.modes == Counter(s.mode for s in crunch)
    assert stats.ticks == 48  # percentages stay of the whole CPU time


def test_rows_sort_by_own_total_or_name_and_stop_at_the_limit() -> None:
    stats = fed(TopStats())
    by_own = stats.function_rows(SortKey.OWN, 100)
    assert len(by_own) == len(stats.total)
    assert [(-r.own, -r.total, r.name) for r in by_own] == sorted(
        (-r.own, -r.total, r.name) for r in by_own
    )
    by_total = stats.function_rows(SortKey.TOTAL, 100)
    assert [(-r.total, -r.own, r.name) for r in by_total] == sorted(
        (-r.total, -r.own, r.name) for r in by_total
    )
    by_name = stats.function_rows(SortKey.NAME, 100)
    assert [r.name for r in by_name] == sorted(r.name for r in by_name)
    assert stats.function_rows(SortKey.OWN, 5) == by_own[:5]


def test_the_hottest_rows_of_the_example_guest() -> None:
    """Read off the saved samples: the user workload's busiest code."""
    stats = fed(TopStats())
    top = stats.function_rows(SortKey.TOTAL, 3)
    assert top[0] == Row("_start", "crunch.elf", 0, 24)
    processes = stats.process_rows(SortKey.OWN, 2)
    assert processes == [Row("crunch (1)", "", 13, 13), Row("crunch (2)", "", 11, 11)]


def test_percent_is_of_one_cpu_so_two_busy_cpus_make_200() -> None:
    stats = fed(TopStats())
    assert stats.percent(48) == 100.0
    assert stats.percent(96) == 200.0
    assert TopStats().percent(5) == 0.0  # no tick yet


def test_reset_forgets_counts_and_keeps_filters() -> None:
    stats = fed(TopStats(process_filter="pulse", show_kernel=False))
    assert stats.ticks and stats.modes
    stats.reset()
    assert stats == TopStats(process_filter="pulse", show_kernel=False)
