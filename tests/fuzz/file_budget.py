"""The budget of fuzz tests whose every case parses a whole file (10 to 100 ms, where
a register text or a page walk takes well under one): under `make fuzz` they run a
tenth of QMPPROF_FUZZ_CASES, so that 100,000 cases in all end in minutes, not hours."""

from __future__ import annotations

from tests.fuzz.budget import cases

FILE_SHARE = 10


def file_cases(default: int) -> int:
    """`default` cases, or a FILE_SHARE-th of QMPPROF_FUZZ_CASES (never fewer)."""
    return max(default, cases(default * FILE_SHARE) // FILE_SHARE)
