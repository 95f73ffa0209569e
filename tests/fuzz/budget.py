"""How many cases each fuzz test runs, and a count of the cases that really ran.

`make test` runs every fuzz test with its small default (a few seconds in all);
`make fuzz` sets QMPPROF_FUZZ_CASES, and every fuzz test runs that many instead.
Hypothesis draws from a fixed seed (tests/conftest.py), so a failure repeats;
QMPPROF_SEED changes the seed and is printed with every failure.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

#: test name -> [cases run, seconds spent in them]
COUNTS: dict[str, list[float]] = {}


def cases(default: int) -> int:
    """The number of cases for one fuzz test: `default`, or QMPPROF_FUZZ_CASES."""
    override = os.environ.get("QMPPROF_FUZZ_CASES")
    return int(override) if override else default


def counted(test: Callable[P, R]) -> Callable[P, R]:
    """Count each case a fuzz test body runs (put it under @given)."""
    name = test.__name__

    @functools.wraps(test)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        try:
            return test(*args, **kwargs)
        finally:
            entry = COUNTS.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    return wrapper
