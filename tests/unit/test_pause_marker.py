"""The pause marker survives SIGKILL of the process that set it, names who set it so a
dead owner is told from a live one, lives only in a directory that is ours alone; and
a pause is attributed to us only by the events QEMU sends when our `stop` paused it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from qmpprof.target.marker import PauseMarker, Process, marker_path
from qmpprof.target.pause import paused_by_us
from qmpprof.target.qmp import RunEvent

SOCKET = "/run/example/qmp.sock"


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


def test_a_flag_set_by_a_process_killed_with_sigkill_survives_it() -> None:
    script = (
        "import os, signal\n"
        "from qmpprof.target.marker import PauseMarker, Process\n"
        f"marker = PauseMarker.open({SOCKET!r})\n"
        "marker.claim(Process.of(os.getpid()), Process(1, 2))\n"
        "marker.set_paused(True)\n"
        "print(os.getpid(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    marker = PauseMarker.open(SOCKET)
    assert marker is not None
    state = marker.read()
    marker.remove()
    assert state is not None and state.paused
    assert state.owner.pid == int(done.stdout) and not state.owner.alive()
    assert state.qemu == Process(1, 2)


def test_a_new_marker_says_nothing_and_a_claim_starts_clear() -> None:
    marker = PauseMarker.open(SOCKET)
    assert marker is not None
    assert marker.read() is None
    me = Process.of(os.getpid())
    assert me is not None and me.alive()
    marker.set_paused(True)
    marker.claim(me, Process(7, 8))
    state = marker.read()
    assert state is not None and not state.paused and state.owner == me
    marker.remove()
    assert not marker.path.exists()


def test_a_recycled_pid_is_not_the_owner() -> None:
    me = Process.of(os.getpid())
    assert me is not None
    assert not Process(me.pid, me.start + 1).alive()


def test_markers_of_different_sockets_are_different_files(runtime_dir: Path) -> None:
    first, second = marker_path(SOCKET), marker_path(SOCKET + "2")
    assert first is not None and second is not None and first != second
    assert first.parent == runtime_dir / "qmpprof"


def test_a_directory_others_can_write_is_refused(runtime_dir: Path) -> None:
    (runtime_dir / "qmpprof").mkdir(mode=0o777)
    os.chmod(runtime_dir / "qmpprof", 0o777)
    assert marker_path(SOCKET) is None
    assert PauseMarker.open(SOCKET) is None


SENT = 1_700_000_000_000_000  # when our `stop` went, in microseconds
STOP, RESUME = False, True


@pytest.mark.parametrize(
    ("events", "ours"),
    [
        ([(STOP, SENT + 40)], True),  # ours: one STOP after we sent
        ([(STOP, SENT)], True),  # the same microsecond
        ([], False),  # our stop changed nothing
        ([(STOP, SENT - 5)], False),  # someone paused it just before ours went
        ([(STOP, SENT - 9), (RESUME, SENT - 5), (STOP, SENT + 30)], True),
        ([(STOP, SENT + 30), (RESUME, SENT + 90)], False),  # resumed by someone since
        ([(STOP, SENT + 30), (RESUME, SENT + 90), (STOP, SENT + 99)], False),
        ([(STOP, None)], True),  # no timestamp: cannot be shown to predate ours
    ],
)
def test_a_pause_is_ours_only_when_our_stop_made_the_one_stop(
    events: list[tuple[bool, int | None]], ours: bool
) -> None:
    assert paused_by_us([RunEvent(running, stamp) for running, stamp in events], SENT) is ours


def test_no_stop_sent_or_lost_events_are_never_ours() -> None:
    assert not paused_by_us([RunEvent(False, SENT + 1)], None)
    assert not paused_by_us(None, SENT)


def opened(socket_path: str) -> PauseMarker:
    marker = PauseMarker.open(socket_path)
    assert marker is not None
    return marker


def test_markers_left_by_sigkill_go_once_owner_and_qemu_are_gone() -> None:
    """What a killed qmpprof left behind goes on the next claim, but only where nothing
    can still need it: a live owner's marker, one whose QEMU still runs, one whose QEMU
    is unknown (pid 0) and one not yet claimed all stay."""
    me = Process.of(os.getpid())
    assert me is not None
    dead = Process(me.pid, me.start + 1)  # this pid at another start: not a process
    left = {
        "live owner": (me, dead),
        "live QEMU": (dead, me),
        "unknown QEMU": (dead, Process(0, 0)),
        "gone": (dead, dead),
    }
    markers = {name: opened(f"{SOCKET}-{name}") for name in [*left, "unclaimed"]}
    for name, (owner, qemu) in left.items():
        markers[name].claim(owner, qemu)
        markers[name].set_paused(True)
    mine = opened(SOCKET)
    mine.claim(me, dead)
    mine.remove_stale()
    assert not markers.pop("gone").path.exists()
    assert all(marker.path.exists() for marker in [*markers.values(), mine])
