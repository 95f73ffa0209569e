"""When to take each sample: a jittered grid anchored at the start, so it never drifts."""

from __future__ import annotations

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
    being taken late in a burst.
    """

    def __init__(
        self, start: float, period: float, jitter: float = 0.1, seed: int | None = None
    ) -> None:
        if period <= 0:
            raise ValueError("period must be positive")
        self.start = start
        self.period = period
        self.jitter = min(max(jitter, 0.0), 0.5)
        self._rng = random.Random(seed)
        self._index = -1

    def next_slot(self, now: float) -> Slot:
        self._index += 1
        missed = 0
        deadline = self._deadline(self._index)
        while deadline + self.period < now:
            self._index += 1
            missed += 1
            deadline = self._deadline(self._index)
        return Slot(deadline, missed)

    def is_late(self, deadline: float, started: float) -> bool:
        """A tick that began more than half a period after its deadline is late."""
        return started - deadline > self.period / 2

    def _deadline(self, index: int) -> float:
        offset = self._rng.uniform(-self.jitter, self.jitter) if index else 0.0
        return self.start + (index + offset) * self.period
