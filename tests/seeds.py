"""One seeded random generator per test: the same draws every run, others on demand.

QMPPROF_SEED=N changes every test's draws (tests/conftest.py prints it on failure).
"""

from __future__ import annotations

import random

from tests.conftest import SEED


def seeded(name: str) -> random.Random:
    """A generator for the test or helper called `name`, fixed unless QMPPROF_SEED is set."""
    return random.Random(f"{SEED}:{name}")
