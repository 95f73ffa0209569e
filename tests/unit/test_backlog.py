"""The analysis backlog yields to the sampler: nothing past the deadline, all at the end."""

import time

from qmpprof.model import RawSample, RegisterSet
from qmpprof.record.backlog import Backlog


def raw(n: int) -> RawSample:
    regs = RegisterSet(n, {"rip": n, "rsp": 0, "rbp": 0}, cs=8, cpl=0, halted=False, bits=64)
    return RawSample(float(n), regs)


def test_no_work_when_the_next_tick_is_due_and_everything_at_the_end() -> None:
    done: list[int] = []
    backlog = Backlog(lambda sample: done.append(sample.vcpu))
    backlog.add([raw(0), raw(1), raw(2)])
    backlog.work_until(time.monotonic())
    assert done == [] and len(backlog) == 3
    backlog.work_until(time.monotonic() + 60)
    assert done == [0, 1, 2]
    backlog.add([raw(3)])
    backlog.work_until(None)
    assert done == [0, 1, 2, 3] and len(backlog) == 0
