"""The analysis backlog yields to the sampler: nothing it expects to end past the
deadline, everything at the end, and never more than MAX_PENDING samples waiting."""

import time

from qmpprof.model import (
    CapturedSample,
    FrameAddress,
    FrameKind,
    RawSample,
    RegisterSet,
    StopReason,
    UnwoundStack,
)
from qmpprof.record.backlog import MARGIN_S, MAX_PENDING, Backlog


def raw(n: int) -> CapturedSample:
    regs = RegisterSet(n, {"rip": n, "rsp": 0, "rbp": 0}, cs=8, cpl=0, halted=False, bits=64)
    leaf = FrameAddress(n, FrameKind.INSTRUCTION)
    return CapturedSample(
        RawSample(float(n), regs), UnwoundStack((leaf,), StopReason.NO_STACK), None
    )


class StepClock:
    """A clock that moves only when an analysis runs: each takes `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        return self.now


def test_no_work_when_the_next_tick_is_due_and_everything_at_the_end() -> None:
    done: list[int] = []
    backlog = Backlog(lambda sample: done.append(sample.raw.vcpu))
    backlog.add([raw(0), raw(1), raw(2)])
    backlog.work_until(time.monotonic())
    assert done == [] and len(backlog) == 3
    backlog.work_until(time.monotonic() + 60)
    assert done == [0, 1, 2]
    backlog.add([raw(3)])
    backlog.work_until(None)
    assert done == [0, 1, 2, 3] and len(backlog) == 0


def test_an_analysis_starts_only_if_it_should_end_before_the_deadline() -> None:
    clock = StepClock(step=0.001)
    done: list[int] = []

    def analyse(sample: CapturedSample) -> None:
        done.append(sample.raw.vcpu)
        clock.now += clock.step

    backlog = Backlog(analyse, clock)
    backlog.add([raw(n) for n in range(10)])
    backlog.work_until(1.0)  # time for all: each takes 1 ms and is timed doing so
    assert done == list(range(10))
    backlog.add([raw(n) for n in range(10, 20)])
    # 2.5 ms left: two analyses fit, a third would end past the deadline.
    backlog.work_until(clock.now + 2 * clock.step + MARGIN_S + clock.step / 2)
    assert done == list(range(12))


def test_beyond_max_pending_the_oldest_are_analysed_even_when_a_tick_is_due() -> None:
    done: list[int] = []
    backlog = Backlog(lambda sample: done.append(sample.raw.vcpu))
    backlog.add([raw(n) for n in range(MAX_PENDING + 3)])
    backlog.work_until(time.monotonic())
    assert done == [0, 1, 2] and len(backlog) == MAX_PENDING


def test_after_a_slow_analysis_the_idle_time_is_used_again_some_ticks_later() -> None:
    clock = StepClock(step=0.05)  # the first analysis is slow (symbols, cold caches)
    done: list[int] = []

    def analyse(sample: CapturedSample) -> None:
        done.append(sample.raw.vcpu)
        clock.now += clock.step
        clock.step = 0.0001

    backlog = Backlog(analyse, clock)
    backlog.add([raw(0)])
    backlog.work_until(None)
    backlog.add([raw(1)])
    idle_ticks = 0
    while len(done) < 2 and idle_ticks < 1000:
        backlog.work_until(clock.now + 0.001)  # 1 ms to the next tick, every tick
        idle_ticks += 1
    assert done == [0, 1] and 1 < idle_ticks < 100
