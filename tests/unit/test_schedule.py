"""The sampling schedule: anchored, jittered, and never bunching late ticks."""

import math

import pytest

from qmpprof.record.schedule import Schedule


def test_deadlines_stay_on_the_grid_without_drift() -> None:
    schedule = Schedule(start=100.0, period=0.01, jitter=0.1, seed=1)
    deadlines = [schedule.next_slot(now=0.0).deadline for _ in range(1000)]
    for index, deadline in enumerate(deadlines):
        assert abs(deadline - (100.0 + index * 0.01)) <= 0.001 + 1e-9
    assert deadlines == sorted(deadlines)


def test_jitter_actually_moves_deadlines() -> None:
    schedule = Schedule(start=0.0, period=1.0, jitter=0.1, seed=2)
    offsets = {round(schedule.next_slot(0.0).deadline % 1.0, 6) for _ in range(50)}
    assert len(offsets) > 10


def test_slots_far_in_the_past_are_missed_not_bunched() -> None:
    schedule = Schedule(start=0.0, period=1.0, jitter=0.0)
    assert schedule.next_slot(now=0.0).deadline == 0.0
    slot = schedule.next_slot(now=10.5)
    assert slot.missed == 9
    assert slot.deadline == 10.0
    assert schedule.next_slot(now=10.6).deadline == 11.0


def test_lateness_is_half_a_period() -> None:
    schedule = Schedule(start=0.0, period=1.0)
    assert not schedule.is_late(deadline=5.0, started=5.4)
    assert schedule.is_late(deadline=5.0, started=5.6)


def test_a_huge_backlog_is_skipped_in_one_step() -> None:
    """At a rate far beyond what a tick can take, missed slots are counted arithmetically:
    stepping through them one by one (10^13 here) would never return."""
    schedule = Schedule(start=0.0, period=1e-7, jitter=0.1, seed=3)
    schedule.next_slot(now=0.0)
    slot = schedule.next_slot(now=1e6)
    assert slot.deadline + 1e-7 >= 1e6
    assert slot.deadline <= 1e6 + 1e-7
    assert abs(slot.missed - 1e13) <= 3


def test_skipping_finds_the_same_slot_as_stepping() -> None:
    """The arithmetic jump lands on the first slot whose deadline is at most a period
    before now, as stepping slot by slot would (deadlines with no jitter are exact)."""
    for now in (0.3, 1.0, 1.99, 2.0, 2.01, 57.5, 1000.0):
        schedule = Schedule(start=0.0, period=1.0, jitter=0.0)
        schedule.next_slot(now=0.0)
        slot = schedule.next_slot(now=now)
        expected = max(1, math.ceil(now - 1.0))
        assert slot.deadline == expected, now
        assert slot.missed == expected - 1, now


def test_a_period_that_is_not_finite_is_refused() -> None:
    for period in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            Schedule(start=0.0, period=period)
