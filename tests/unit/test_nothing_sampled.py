"""Why a recording took no sample (record/sampler.py why_nothing_sampled): the one line
record, top and serve end with when the VM gave them nothing (pure)."""

from __future__ import annotations

from qmpprof.model import Ending, EndReason, RecordStats
from qmpprof.record.sampler import why_nothing_sampled


def test_a_recording_with_samples_is_fine() -> None:
    assert why_nothing_sampled(RecordStats(ticks=3, samples=3, skipped_paused=500)) is None


def test_paused_by_someone_else_throughout() -> None:
    why = why_nothing_sampled(RecordStats(skipped_paused=990))
    assert why == (
        "no sample taken: the VM was paused by someone else throughout "
        "(990 ticks skipped; it is left paused)"
    )


def test_paused_throughout_then_qemu_exited() -> None:
    stats = RecordStats(skipped_paused=12, ended_by=Ending(EndReason.QEMU_EXITED))
    why = why_nothing_sampled(stats)
    assert why is not None and why.startswith("no sample taken: the VM was paused")
    assert why.endswith(f"; {stats.ended_by}")


def test_a_signal_is_not_repeated_as_the_reason() -> None:
    stats = RecordStats(skipped_paused=4, ended_by=Ending(EndReason.INTERRUPTED, "SIGINT"))
    assert why_nothing_sampled(stats) == (
        "no sample taken: the VM was paused by someone else throughout "
        "(4 ticks skipped; it is left paused)"
    )


def test_every_tick_failed() -> None:
    stats = RecordStats(failed=20, skipped_paused=2)
    assert why_nothing_sampled(stats) == (
        "no sample taken in 22 ticks (2 skipped while the VM was paused by others, 20 failed)"
    )


def test_no_tick_at_all_is_not_this_error() -> None:
    """Ctrl-C, `q` in top or QEMU exiting before the first tick: nothing was tried."""
    assert why_nothing_sampled(RecordStats()) is None
    assert why_nothing_sampled(RecordStats(ended_by=Ending(EndReason.QEMU_EXITED))) is None
