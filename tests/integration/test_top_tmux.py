"""`qmpprof top` in a real terminal (tmux, 80 columns), driven by keys as a person would."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, record_args

SESSION = "qmpprof-top-test"
#: The example guest's hottest function (about half of all samples).
HOTTEST = "physics_leaf"
#: The top row's own samples after which the hottest function leads (half of them are
#: its own: by 60 no other function comes near).
SETTLED = 60
#: How long a wait may take before the test calls it a hang (never a speed limit).
HANG_S = 120.0


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
    """Judged by what the screen shows, not by when: the hottest function leads once the
    top row has SETTLED samples (it holds about half of them); each wait's limit only
    guards against a hang."""
    wait_for(lambda text: "%Own" in text, HANG_S)  # the first screen (after Python starts)
    text, _ = wait_for(lambda text: own_samples_on_top(text) >= SETTLED, HANG_S)
    assert HOTTEST in first_row(text), text
    assert "%Own" in text.splitlines()[3]  # three header lines that never wrap, then the table
    assert not sorted_by_total(text)  # by own samples: the leaf above its callers
    tmux("send-keys", "-t", SESSION, "t")
    wait_for(sorted_by_total, HANG_S)
    tmux("send-keys", "-t", SESSION, "q")
    wait_for(lambda _: SESSION not in tmux("list-sessions"), HANG_S)
    assert guest.status() == "running"


def own_samples_on_top(text: str) -> int:
    """The top row's own samples (0 before the table has a row)."""
    table = rows(text)
    return int(table[0][2]) if table and len(table[0]) > 4 else 0


@contextlib.contextmanager
def in_tmux(session: str, command: str, directory: Path, keep_stderr: bool) -> Iterator[int]:
    """Run `command` in a new 80x24 tmux session and yield the pid of the shell running it
    (qmpprof, when it `exec`s); its exit status and (keep_stderr) stderr land in
    `directory` (status, stderr). The session is gone when the block ends."""
    tmux("kill-session", "-t", session)  # one a failed run may have left
    redirect = f"2> {directory}/stderr" if keep_stderr else ""
    script = f"echo $$ > {directory}/pid; {command} {redirect}; echo $? > {directory}/status"
    tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", "sh", "-c", script)
    try:
        wait_for_session_text(session, lambda _: (directory / "pid").exists(), 10)
        yield int((directory / "pid").read_text())
    finally:
        tmux("kill-session", "-t", session)


def wait_for_exit(pid: int, limit_s: float) -> None:
    """Poll until process `pid` is gone (the shell tmux ran, and qmpprof under it)."""
    started = time.monotonic()
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() - started < limit_s, f"process {pid} still running"
        time.sleep(0.05)  # polling for an exit, not a synchronisation


def top_command(guest: Guest, *extra: str) -> str:
    return qmpprof_command("top", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), *extra)


def qmpprof_command(*args: str) -> str:
    return " ".join([sys.executable, "-m", "qmpprof", *args])


def needs_tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make test installs it)")


def test_closing_the_terminal_leaves_the_vm_running(guest: Guest, workdir: Path) -> None:
    """tmux kill-session sends SIGHUP and takes the terminal away, at any moment of a
    stop-mode tick (at 300 Hz the VM is paused about half the time): three times over."""
    needs_tmux()
    for attempt in range(3):
        directory = workdir / f"kill{attempt}"
        directory.mkdir()
        session = f"qmpprof-top-kill-{attempt}"
        command = "exec " + top_command(guest, "--rate", "300")
        with in_tmux(session, command, directory, keep_stderr=True) as pid:
            wait_for_session_text(session, lambda text: HOTTEST in text, 60)
            tmux("kill-session", "-t", session)
            wait_for_exit(pid, 30)
        assert guest.status() == "running", f"attempt {attempt}"


def wait_for_session_text(session: str, condition: Callable[[str], bool], limit_s: float) -> None:
    started = time.monotonic()
    while not condition(tmux("capture-pane", "-p", "-t", session)):
        assert time.monotonic() - started < limit_s, tmux("capture-pane", "-p", "-t", session)
        time.sleep(0.05)  # polling interval of a screen reader, not a synchronisation


def test_top_ends_with_one_line_when_qemu_exits(guest: Guest, workdir: Path) -> None:
    needs_tmux()
    session = "qmpprof-top-qemu-exits"
    with in_tmux(session, top_command(guest), workdir, keep_stderr=True) as pid:
        wait_for_session_text(session, lambda text: HOTTEST in text, 60)
        subprocess.run(["kill", "-KILL", str(guest.pid)], check=True)
        wait_for_exit(pid, 30)
    assert (workdir / "status").read_text().strip() == "1"
    lines = (workdir / "stderr").read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qmpprof: error: top stopped: QEMU exited")


def test_record_keeps_its_profile_when_the_terminal_closes(guest: Guest, workdir: Path) -> None:
    """SIGHUP and a terminal that fails every write: the outputs are written first."""
    needs_tmux()
    session = "qmpprof-record-kill"
    output = workdir / "p.folded"
    # --idle: every sample taken is written. Killed after its first ticks, a fresh
    # guest's samples may all be idle (a quarter of them are), and a profile without
    # idle samples is then empty with nothing lost.
    args = record_args(guest.qmp, guest.kernel, 300, output, "--rate", "300", "--idle")
    with in_tmux(session, "exec " + qmpprof_command(*args), workdir, keep_stderr=False) as pid:
        wait_for_session_text(session, lambda text: " Hz" in text and "0 samples" not in text, 60)
        tmux("kill-session", "-t", session)
        wait_for_exit(pid, 30)
    assert guest.status() == "running"
    counts = [int(line.rsplit(" ", 1)[1]) for line in output.read_text().splitlines()]
    assert sum(counts) > 0
