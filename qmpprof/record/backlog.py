"""Analysis that waits for the sampler's idle time, so it never delays the next tick."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from qmpprof.model import CapturedSample

#: Start one more analysis only if it should end this long before the next tick.
MARGIN_S = 0.0001
#: What one analysis is taken to cost until one has been timed.
FIRST_GUESS_S = 0.0005
#: How fast the cost estimate forgets a slow analysis (a new symbol, a cold cache): it is
#: the slowest recent one, shrunk by this factor at each tick.
COST_DECAY = 0.95
#: Beyond this many samples waiting, the oldest are analysed even when the next tick is
#: due. Each holds a stack window (16 KiB by default): at rates the idle time cannot keep
#: up with, memory stays bounded and the sampler takes fewer ticks instead.
MAX_PENDING = 2048


class Backlog:
    """Captured samples waiting to be analysed by `analyse`, in order."""

    def __init__(
        self,
        analyse: Callable[[CapturedSample], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._analyse = analyse
        self._clock = clock
        self._pending: deque[CapturedSample] = deque()
        self._cost = FIRST_GUESS_S

    def add(self, samples: list[CapturedSample]) -> None:
        self._pending.extend(samples)

    def work_until(self, deadline: float | None) -> None:
        """Analyse pending samples while each should end before `deadline`
        (time.monotonic) and beyond MAX_PENDING regardless; all if `deadline` is None."""
        self._cost *= COST_DECAY
        while self._pending:
            if (
                deadline is not None
                and len(self._pending) <= MAX_PENDING
                and self._clock() + self._cost + MARGIN_S > deadline
            ):
                return
            self._analyse_oldest()

    def _analyse_oldest(self) -> None:
        started = self._clock()
        self._analyse(self._pending.popleft())
        self._cost = max(self._clock() - started, self._cost)

    def __len__(self) -> int:
        return len(self._pending)
