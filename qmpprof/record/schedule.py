"""When to take each sample: a jittered grid anchored at the start, so it never drifts."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """The next tick: its deadline, and how many earlier slots were given up."""

    deadline: float
    missed: int


class Schedule:
    """Slot n is due at start + n * period, moved by up to ±jitter * period.

    The jitter keeps samples from locking onto a periodic guest timer. A slot whose
    time has passed by more than a period is given up (counted as missed) instead of
    being taken late in a burst. However many slots were missed, finding the next one
    takes a few steps: a long stall at a high rate is arithmetic, not a loop.
    """

    def __init__(
        self, start: float, period: float, jitter: float = 0.1, seed: int | None = None
    ) -> None:
        if not (math.isfinite(period) and period > 0):
            raise ValueError(f"period must be positive and finite: {period}")
        self.start = start
        self.period = period
        self.jitter = min(max(jitter, 0.0), 0.5)
        self._rng = random.Random(seed)
        self._index = -1

    def next_slot(self, now: float) -> Slot:
        first = self._index + 1
        index = max(first, self._last_index_missed_by(now))
        deadline = self._deadline(index)
        while deadline + self.period < now:  # a few steps at most: jitter is under a period
            index += 1
            deadline = self._deadline(index)
        self._index = index
        return Slot(deadline, index - first)

    def _last_index_missed_by(self, now: float) -> int:
        """A slot at or before the first one `now` can still take: every slot before it
        is missed whatever its jitter, since its deadline is at most half a period late."""
        behind = (now - self.start) / self.period - 2
        return math.floor(behind) if math.isfinite(behind) else self._index + 1

    def is_late(self, deadline: float, started: float) -> bool:
        """A tick that began more than half a period after its deadline is late."""
        return started - deadline > self.period / 2

    def _deadline(self, index: int) -> float:
        offset = self._rng.uniform(-self.jitter, self.jitter) if index else 0.0
        return self.start + (index + offset) * self.period
