"""The sampling schedule: anchored, jittered, and never bunching late ticks."""

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
