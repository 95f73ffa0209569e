"""Analysis that waits for the sampler's idle time, so it never delays the next tick."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from qmpprof.model import RawSample

#: Stop analysing this long before the next tick is due.
MARGIN_S = 0.0005


class Backlog:
    """Raw samples waiting to be analysed by `analyse`, in order."""

    def __init__(self, analyse: Callable[[RawSample], None]) -> None:
        self._analyse = analyse
        self._pending: deque[RawSample] = deque()

    def add(self, raws: list[RawSample]) -> None:
        self._pending.extend(raws)

    def work_until(self, deadline: float | None) -> None:
        """Analyse pending samples until `deadline` (time.monotonic) is near; all if None."""
        while self._pending:
            if deadline is not None and time.monotonic() > deadline - MARGIN_S:
                return
            self._analyse(self._pending.popleft())

    def __len__(self) -> int:
        return len(self._pending)
