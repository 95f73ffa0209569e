"""A qmpprof killed with SIGKILL while it holds the VM paused leaves a marker; the next
qmpprof on that socket resumes the VM and says so in one line, and `qmpprof resume`
does it by hand. The kill lands deterministically inside a pause: qmpprof is frozen
(SIGSTOP) as soon as its STOP event is seen, with a hold made long by reading memory
through HMP, and a fresh connection on its socket tells whether the VM was left paused
(QEMU greets it only once the dead connection's input is settled)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, record_args, run_qmpprof, running_guest
from tests.integration.watcher import freeze, watching

#: Attempts at killing qmpprof while the VM is paused; each nearly always succeeds.
ATTEMPTS = 5
ACCEL = os.environ.get("ACCEL", "tcg")


@pytest.fixture
def watched(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Guest, str]]:
    """A guest with a second QMP monitor to watch it; pause markers in `workdir`."""
    with watched_guest(workdir, monkeypatch) as booted:
        yield booted


@contextlib.contextmanager
def watched_guest(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Guest, str]]:
    runtime = workdir / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    other = str(workdir / "other.sock")
    with running_guest(workdir, "--accel", ACCEL, "--extra-qmp", other) as guest:
        yield guest, other


def kill_inside_a_pause(guest: Guest, other: str, output: Path) -> None:
    """Run `record` and SIGKILL it while the VM is paused by it (a few attempts)."""
    slow = ("--memory", "hmp", "--stack-bytes", "262144", "--rate", "20")
    for _ in range(ATTEMPTS):
        args = record_args(guest.qmp, guest.kernel, 20, output, *slow)
        record = subprocess.Popen(
            [sys.executable, "-m", "qmpprof", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with watching(other) as watcher:
                watcher.wait_for("STOP")
                freeze(record.pid)
        finally:
            record.kill()
            record.wait()
        if guest.status() == "paused":
            return
    pytest.fail(f"qmpprof was never killed inside a pause in {ATTEMPTS} attempts")


@pytest.mark.parametrize("command", ["dump", "record"])
def test_the_next_command_resumes_what_a_killed_qmpprof_left_paused(
    watched: tuple[Guest, str], tmp_path: Path, command: str
) -> None:
    guest, other = watched
    kill_inside_a_pause(guest, other, tmp_path / "killed.folded")
    if command == "dump":
        done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    else:
        done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 1, tmp_path / "p.folded"))
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "had left it paused" in line]
    assert len(notes) == 1, done.stderr
    assert guest.status() == "running"
    if command == "record":
        assert "skipped while the VM was paused" not in done.stdout


def test_resume_by_hand_then_nothing_left_to_resume(
    watched: tuple[Guest, str], tmp_path: Path
) -> None:
    guest, other = watched
    kill_inside_a_pause(guest, other, tmp_path / "killed.folded")
    done = run_qmpprof("resume", "--qmp-socket", guest.qmp)
    assert done.returncode == 0, done.stderr
    assert "had left it paused" in done.stdout
    assert guest.status() == "running"
    again = run_qmpprof("resume", "--qmp-socket", guest.qmp)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "nothing to resume" in again.stderr


def test_a_vm_its_user_paused_is_not_resumed(watched: tuple[Guest, str]) -> None:
    """No qmpprof died: `resume` refuses in one line and neither it nor `dump` resumes."""
    guest, other = watched
    with watching(other) as watcher:
        assert watcher.stop_took_effect()
    done = run_qmpprof("resume", "--qmp-socket", guest.qmp)
    assert done.returncode == 1 and "nothing to resume" in done.stderr
    assert guest.status() == "paused"
    dump = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    assert dump.returncode == 0, dump.stderr
    assert guest.status() == "paused"


def test_a_restarted_qemu_is_never_resumed_for_a_dead_qmpprof(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The marker names the QEMU it was set for: another QEMU on the same socket path,
    paused by its user, stays paused."""
    with watched_guest(workdir, monkeypatch) as (guest, other):
        kill_inside_a_pause(guest, other, tmp_path / "killed.folded")
    with running_guest(workdir, "--accel", ACCEL) as restarted:
        assert restarted.qmp == guest.qmp
        restarted.qmp_call("stop")
        done = run_qmpprof("dump", "--qmp-socket", restarted.qmp, "--kernel", str(guest.kernel))
        assert done.returncode == 0, done.stderr
        assert "left it paused" not in done.stderr
        assert restarted.status() == "paused"
