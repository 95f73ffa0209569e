"""`qmpprof top` in a real terminal (tmux, 80 columns), driven by keys as a person would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.integration.conftest import Guest

SESSION = "qmpprof-top-test"
#: The example guest's hottest function (about half of all samples).
HOTTEST = "physics_leaf"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_for(condition: Callable[[str], bool], limit_s: float) -> tuple[str, float]:
    """Poll the screen until `condition` holds; (screen, seconds waited). Fails at the limit."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        text = screen()
        if condition(text):
            return text, time.monotonic() - started
        time.sleep(0.05)  # polling interval of a screen reader, not a synchronisation
    raise AssertionError(f"screen never matched within {limit_s} s:\n{screen()}")


def rows(text: str) -> list[list[str]]:
    """The table's rows, split into columns (%Own %Total Own Total Function ...)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "%Own" in line)
    return [line.split() for line in lines[header + 1 :] if line.strip()[:1].isdigit()]


def sorted_by_total(text: str) -> bool:
    totals = [int(row[3]) for row in rows(text) if len(row) > 4]
    return bool(totals) and totals == sorted(totals, reverse=True) and totals[0] > 0


def first_row(text: str) -> str:
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "%Own" in line)
    return lines[header + 1]


@pytest.fixture
def top(guest: Guest) -> Iterator[None]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make test installs it)")
    command = f"{sys.executable} -m qmpprof top --qmp-socket {guest.qmp} --kernel {guest.kernel}"
    tmux("new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", command)
    try:
        yield
    finally:
        tmux("kill-session", "-t", SESSION)


def test_top_shows_the_hottest_function_sorts_and_quits(top: None, guest: Guest) -> None:
    wait_for(lambda text: "%Own" in text, 60)  # the first screen (after Python starts)
    text, waited = wait_for(lambda text: HOTTEST in first_row(text), 3)
    print(f"\nhottest function on top {waited:.1f} s after the first screen")
    assert "%Own" in text.splitlines()[3]  # three header lines that never wrap, then the table
    assert not sorted_by_total(text)  # by own samples: the leaf above its callers
    tmux("send-keys", "-t", SESSION, "t")
    wait_for(sorted_by_total, 5)
    tmux("send-keys", "-t", SESSION, "q")
    wait_for(lambda _: SESSION not in tmux("list-sessions"), 10)
    assert guest.status() == "running"
