"""Prints how many cases each fuzz test ran and how fast, after the run."""

from __future__ import annotations

import pytest

from tests.fuzz.budget import COUNTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not COUNTS:
        return
    write = terminalreporter.write_line
    write("fuzz cases (test, cases, cases/s):")
    total = 0
    for name, (count, seconds) in sorted(COUNTS.items()):
        total += int(count)
        rate = count / seconds if seconds > 0 else 0.0
        write(f"  {name:50s} {int(count):8d} {rate:10.0f}/s")
    write(f"  {'total':50s} {total:8d}")
