"""Someone else's pause is never undone: another QMP client (on a second monitor of the
same QEMU) whose `stop` took effect sees no RESUME it did not cause until qmpprof has
exited, in stop and nonblocking mode, at a low and a high rate, for `record` and `dump`.

Deterministic: the other client stops the VM while qmpprof is frozen (SIGSTOP) where
it waits for its next tick, so no command of qmpprof's is in flight and the other
client's `stop` is the one that pauses the VM (it sees its own STOP before its reply).
qmpprof is then let go and must find the VM paused by someone else. A recording has no
end of its own that could come first (a loaded host may take seconds to catch it between
ticks): the test ends it with SIGINT once qmpprof has shown it ticked after the stop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import qmpprof.record.sampler as sampler
import qmpprof.target.qmp as qmp
from qmpprof.analysis import Analyzer
from qmpprof.arguments import MAX_DURATION_S
from qmpprof.errors import MonitorStuck
from qmpprof.model import EndReason
from qmpprof.modules import load_module
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.record.sampler import LoopConfig, sample_loop
from qmpprof.target.memory import HmpMemory
from qmpprof.target.qmp import QmpSession, paused
from tests.integration.conftest import (
    Guest,
    interrupted_when,
    record_args,
    run_qmpprof,
    running_guest,
)
from tests.integration.watcher import PipeText, Watcher, freeze_between_ticks, watching


@pytest.fixture
def watched(workdir: Path) -> Iterator[tuple[Guest, str]]:
    """A guest with a second QMP monitor for the other client: (guest, its socket)."""
    other = str(workdir / "other.sock")
    accel = os.environ.get("ACCEL", "tcg")
    with running_guest(workdir, "--accel", accel, "--extra-qmp", other) as guest:
        yield guest, other


#: Every tick's progress is shown, about once a second, as a line starting with this
#: when stderr is not a terminal (console/progress.py).
PROGRESS = "progress:"


def start_record(guest: Guest, output: Path, *extra: str) -> subprocess.Popen[str]:
    """qmpprof recording until it gets a signal (the longest duration it accepts)."""
    args = record_args(guest.qmp, guest.kernel, int(MAX_DURATION_S), output, *extra)
    return subprocess.Popen(
        [sys.executable, "-m", "qmpprof", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_never_resumed(watcher: Watcher, since: int) -> None:
    names = watcher.run_state_events()[since:]
    assert "RESUME" not in names, f"qmpprof undid another client's stop: {names[:6]}..."


def after_a_paused_tick(
    record: subprocess.Popen[str], stderr: PipeText, end: Callable[[], None]
) -> str:
    """Let the frozen `record` go on, wait for a tick after the other client's stop
    (progress is shown after a tick), `end` it (a signal to qmpprof or to QEMU), and
    return what it printed; it must exit 0."""
    stderr.drain()  # the progress shown before the freeze
    os.kill(record.pid, signal.SIGCONT)
    try:
        assert stderr.wait_for(PROGRESS), stderr.text
        end()
        out, err = record.communicate(timeout=60)
    finally:
        record.kill()
        record.wait()
    assert record.returncode == 0, stderr.text + err
    return out


@pytest.mark.parametrize("mode", ["stop", "nonblocking"])
@pytest.mark.parametrize("rate", ["99", "400"])
def test_record_never_undoes_a_stop_that_took_effect(
    watched: tuple[Guest, str], tmp_path: Path, mode: str, rate: str
) -> None:
    guest, other = watched
    extra = ["--rate", rate] + (["--nonblocking"] if mode == "nonblocking" else [])
    with watching(other) as watcher:
        record = start_record(guest, tmp_path / "p.folded", *extra)
        stderr = PipeText(record.stderr)
        try:
            assert freeze_between_ticks(record), "qmpprof ended before its first tick"
            assert watcher.stop_took_effect()
            stopped_at = len(watcher.events)
        except BaseException:
            record.kill()
            raise
        out = after_a_paused_tick(record, stderr, lambda: os.kill(record.pid, signal.SIGINT))
        assert_never_resumed(watcher, stopped_at)
        assert "skipped while the VM was paused by others" in out
        assert guest.status() == "paused"


def test_qemu_exiting_while_another_client_holds_it_paused_ends_the_recording(
    watched: tuple[Guest, str], tmp_path: Path
) -> None:
    """The other client pauses the VM, qmpprof skips its ticks, then QEMU is killed: the
    recording ends as QEMU exited and keeps what it collected, as when QEMU exits while
    the VM runs (test_record.py). The last event qmpprof read said paused; a closed
    connection must not go on passing for a VM someone holds paused (CI, 2026-11-28:
    `serve`'s scrape of a VM shut down ran its full 60 s and answered 200)."""
    guest, other = watched
    output = tmp_path / "p.folded"
    record = start_record(guest, output)
    stderr = PipeText(record.stderr)
    try:
        assert stderr.wait_for(PROGRESS) and freeze_between_ticks(record)
        with watching(other) as watcher:
            assert watcher.stop_took_effect()
    except BaseException:
        record.kill()
        raise
    out = after_a_paused_tick(record, stderr, lambda: os.kill(guest.pid, signal.SIGKILL))
    assert "QEMU exited" in out, out
    assert output.stat().st_size > 0


def test_dump_never_undoes_a_stop_that_took_effect_during_its_pause(
    watched: tuple[Guest, str],
) -> None:
    """The other client resumes the VM dump paused and pauses it again while dump reads
    it: dump, which sees a RESUME and a STOP it did not cause, must not resume it."""
    guest, other = watched
    with watching(other) as watcher:
        args = ["--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), "--memory", "hmp"]
        dump = subprocess.Popen(
            [sys.executable, "-m", "qmpprof", "dump", *args, "--stack-bytes", "65536"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            watcher.wait_for("STOP")  # dump's
            watcher.call("cont")
            took_effect = watcher.stop_took_effect()
            stopped_at = len(watcher.events)
            _, err = dump.communicate(timeout=60)
        finally:
            dump.kill()
            dump.wait()
        assert dump.returncode == 0, err
        if took_effect:
            assert_never_resumed(watcher, stopped_at)
            assert guest.status() == "paused"
        else:  # dump had resumed before our cont: our stop then found the VM running
            assert guest.status() == "running"


def test_dump_leaves_a_vm_paused_by_another_client_paused(watched: tuple[Guest, str]) -> None:
    guest, other = watched
    with watching(other) as watcher:
        assert watcher.stop_took_effect()
        stopped_at = len(watcher.events)
        done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
        assert done.returncode == 0, done.stderr
        assert_never_resumed(watcher, stopped_at)


@pytest.mark.parametrize("mode", ["stop", "nonblocking"])
def test_a_recording_of_a_vm_paused_throughout_is_an_error(
    watched: tuple[Guest, str], tmp_path: Path, mode: str
) -> None:
    """Nothing sampled: the outputs asked for are written (with nothing in them), the
    summary is printed, then one line says why and the exit status is 1."""
    guest, other = watched
    output, capture = tmp_path / "p.folded", tmp_path / "p.qmpcap"
    extra = ["-o", str(capture)] + (["--nonblocking"] if mode == "nonblocking" else [])
    with watching(other) as watcher:
        assert watcher.stop_took_effect()
        stopped_at = len(watcher.events)
        done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 1, output, *extra))
        assert_never_resumed(watcher, stopped_at)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "qmpprof: error: no sample taken: the VM was paused by someone else throughout ("
    ), done.stderr
    assert last.endswith("ticks skipped; it is left paused)")
    assert output.exists() and capture.exists()
    assert "skipped while the VM was paused by others" in done.stdout
    assert guest.status() == "paused"


def test_top_of_a_vm_paused_throughout_ends_with_the_error(watched: tuple[Guest, str]) -> None:
    guest, other = watched
    args = ["top", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), "--refresh", "0.2"]
    with watching(other) as watcher:
        assert watcher.stop_took_effect()
        stopped_at = len(watcher.events)
        # until a snapshot counts a skipped tick
        status, err = interrupted_when(args, lambda line: "paused by others" in line)
        assert_never_resumed(watcher, stopped_at)
    assert status == 1, err
    assert err.strip().splitlines()[-1].startswith("qmpprof: error: no sample taken: the VM was")
    assert guest.status() == "paused"


async def test_a_stop_seen_before_ours_is_never_undone(watched: tuple[Guest, str]) -> None:
    """The session believed the VM running; another client's STOP waits unread in its
    socket when it pauses: it must read it first and leave the VM alone."""
    guest, other = watched
    session = await QmpSession.connect(guest.qmp)
    try:
        assert await session.is_running()
        with watching(other) as watcher:
            assert watcher.stop_took_effect()
            stopped_at = len(watcher.events)
            async with paused(session) as ours:
                assert not ours
            assert_never_resumed(watcher, stopped_at)
    finally:
        await session.close()


def test_cpus_naming_no_vcpu_is_refused_before_any_pause(watched: tuple[Guest, str]) -> None:
    guest, other = watched
    with watching(other) as watcher:
        for command in (["dump"], ["record", "--duration", "1", "-o", "/dev/null"]):
            done = run_qmpprof(*command, "--qmp-socket", guest.qmp, "--cpus", "99")
            assert done.returncode == 1
            assert done.stderr.count("\n") == 1 and "no vCPU 99" in done.stderr, done.stderr
        assert watcher.run_state_events() == [], "qmpprof paused the VM"


async def test_a_pause_is_undone_when_its_task_is_cancelled(watched: tuple[Guest, str]) -> None:
    guest, other = watched
    session = await QmpSession.connect(guest.qmp)
    holding = asyncio.Event()

    async def hold_forever() -> None:
        async with paused(session) as ours:
            assert ours
            holding.set()
            await asyncio.Event().wait()

    try:
        task = asyncio.create_task(hold_forever())
        await holding.wait()
        with watching(other) as watcher:
            assert watcher.status() == "paused"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert watcher.status() == "running"
    finally:
        await session.close()


async def test_a_stuck_monitor_gets_the_vm_resumed_on_a_fresh_connection(
    guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", 0.5)
    session = await QmpSession.connect(guest.qmp)
    try:
        with pytest.raises(MonitorStuck):
            async with paused(session) as ours:
                assert ours
                transport = session._protocol.transport
                assert transport is not None
                # An unclosed JSON array: QEMU's parser waits for its end, so that no
                # command of this connection, `cont` included, is ever run.
                transport.write(b"[")
                await session.execute("query-status")
        assert guest.status() == "running"
    finally:
        await session.close()


async def test_ticks_that_outlive_their_budget_are_abandoned_and_counted(
    guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget no tick can meet: each is abandoned, counted, and the VM left running."""
    monkeypatch.setattr(sampler, "TICK_BUDGET_S", 1e-6)
    monkeypatch.setattr(sampler, "TICK_BUDGET_PERIODS", 0)
    session = await QmpSession.connect(guest.qmp)
    try:
        analyzer = Analyzer(load_module(guest.kernel))
        capturer = Capturer(session, HmpMemory(session), analyzer, CaptureConfig(1 << 20))
        config = LoopConfig(period_s=0.05, duration_s=0.5)
        stats = await sample_loop(session, capturer, config, asyncio.Event(), lambda _: None)
        assert stats.abandoned > 0 and stats.ticks == 0
        assert stats.ended_by is not None and stats.ended_by.reason is EndReason.TICKS_OVERRAN
        assert "budget" in str(stats.ended_by)
        assert await session.is_running()
    finally:
        await session.close()
    assert guest.status() == "running"
