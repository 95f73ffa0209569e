"""A Proxmox-style QMP socket: one per VM, other tools connecting command by command
(Proxmox's `qm` holds it for milliseconds). qmpprof shares it: it waits its turn in
QEMU's queue of clients, samples, leaves; a socket that stays busy gets a clear line,
never a hang. What QEMU 7.2 does (checked here): it serves one client at a time and
greets the next queued one when that client leaves; its listen backlog of 1 queues two
more, and a fourth connect() is refused at once (EAGAIN)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.guest_vm import BareQmp
from tests.integration.conftest import Guest, record_args, run_qmpprof

#: Longer than any qmpprof run here: a per-command client waits its turn, as `qm` does.
CLIENT_TIMEOUT_S = 60.0


class PerCommandClient:
    """A thread that connects, runs one command and leaves, over and over."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                qmp = BareQmp(self.path)
                qmp._sock.settimeout(CLIENT_TIMEOUT_S)
                status = qmp.call("query-status")
                qmp.close()
            except OSError as err:
                self.failures.append(repr(err))
                return
            if not isinstance(status, dict) or "status" not in status:
                self.failures.append(f"query-status answered {status!r}")
            self.done += 1

    def until_done(self, count: int, seconds: float = 30.0) -> None:
        """Poll (bounded) until it has run `count` commands in all."""
        end = time.monotonic() + seconds
        while self.done < count and not self.failures:
            assert time.monotonic() < end, f"{self.done} commands, expected {count}"
            time.sleep(0.01)

    @contextmanager
    def running(self) -> Iterator[PerCommandClient]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=CLIENT_TIMEOUT_S)


def test_record_and_dump_beside_a_client_that_connects_per_command(
    guest: Guest, tmp_path: Path
) -> None:
    with PerCommandClient(guest.qmp).running() as client:
        client.until_done(5)
        out = tmp_path / "p.folded"
        record = run_qmpprof(*record_args(guest.qmp, guest.kernel, 2, out))
        assert record.returncode == 0, record.stderr
        assert "kernel_main" in out.read_text()
        for _ in range(3):
            dump = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
            assert dump.returncode == 0, dump.stderr
        after = client.done
        client.until_done(after + 5)  # it gets its turns again once qmpprof has left
    assert client.failures == []
    assert guest.status() == "running"


def test_a_socket_whose_queue_stays_full_gets_one_line(guest: Guest) -> None:
    with ExitStack() as held:
        for _ in range(3):  # one served, two queued: QEMU's queue is full
            sock = held.enter_context(socket.socket(socket.AF_UNIX))
            sock.connect(guest.qmp)
        # It gives up by itself (run_qmpprof's timeout guards against a hang); how long
        # it waits its turn is a speed, not this test's business.
        done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "another client holds it and its queue of waiting clients stayed full" in lines[0]
    assert _status_once_free(guest) == "running"


def _status_once_free(guest: Guest, seconds: float = 30.0) -> str:
    """The VM's status, once QEMU has worked through the clients that were queued (a
    connect() meanwhile is refused with EAGAIN): a bounded poll."""
    end = time.monotonic() + seconds
    while True:
        try:
            return guest.status()
        except BlockingIOError:
            assert time.monotonic() < end, "QEMU's queue of clients stayed full"
            time.sleep(0.01)
