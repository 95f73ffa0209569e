"""Record the QMP exchanges tests/unit/test_qmp_replay.py replays: `python -m
tests.unit.data.qmp.record` (from the repository root, after `make guest`).

It boots the example guest (tests/guest_vm.py), puts a recording proxy between
qmpprof's QmpSession and QEMU's QMP socket, runs each scenario below on its own
connection and writes SCENARIO.jsonl beside this file: one line per chunk that crossed
the proxy, {"from": "client"|"qemu", "bytes": "..."} in the order the proxy saw them.
Re-record when QEMU or qmpprof's wire format changes, and read the diff: the
greeting's version and event timestamps change every time, nothing else should.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from qmpprof.errors import CommandFailed
from qmpprof.target.qmp import QmpSession
from tests.guest_vm import running_guest

HERE = Path(__file__).parent
Chunk = tuple[str, bytes]


class RecordingProxy:
    """A unix socket at `path` whose one connection is forwarded to QEMU's socket, every
    chunk logged with its direction."""

    def __init__(self, path: str, qemu: str) -> None:
        self.chunks: list[Chunk] = []
        self._qemu = qemu
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(path)
        self._server.listen(1)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client, _ = self._server.accept()
        qemu = socket.socket(socket.AF_UNIX)
        qemu.connect(self._qemu)
        peers = {client: (qemu, "client"), qemu: (client, "qemu")}
        with client, qemu, self._server:
            while True:
                readable, _, _ = select.select(list(peers), [], [])
                for sock in readable:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    other, name = peers[sock]
                    self.chunks.append((name, data))
                    other.sendall(data)

    def finish(self) -> list[Chunk]:
        self._thread.join(timeout=10)
        return self.chunks


async def handshake(session: QmpSession) -> None:
    """Only the greeting and qmp_capabilities (done by connect)."""


async def commands(session: QmpSession) -> None:
    await session.execute("query-status")
    await session.hmp("info registers", cpu=1)
    with contextlib.suppress(CommandFailed):
        await session.execute("no-such-command")


async def stop_and_cont(session: QmpSession) -> None:
    """A stop-mode tick: STOP and RESUME events arrive among the replies."""
    await session.is_running()
    await session.hmp("info registers -a", first="stop")
    await session.cont()
    await session.execute("query-status")


async def priming(session: QmpSession) -> None:
    """A primed command executed; one cancelled by another command; one cancelled alone."""
    session.prime("query-status")
    await asyncio.sleep(0.2)  # QEMU reads the primed bytes before the last one comes
    await session.execute("query-status")
    session.hmp_prime("info registers -a")
    await asyncio.sleep(0.2)
    await session.execute("query-name")
    session.prime("stop")
    await asyncio.sleep(0.2)
    session.cancel_primed()
    await session.execute("query-status")  # still running: the primed stop never ran


SCENARIOS: dict[str, Callable[[QmpSession], Awaitable[None]]] = {
    "handshake": handshake,
    "commands": commands,
    "stop_and_cont": stop_and_cont,
    "priming": priming,
}


async def record(qemu: str, scenario: Callable[[QmpSession], Awaitable[None]]) -> list[Chunk]:
    with tempfile.TemporaryDirectory(prefix="qmprec-") as work:
        proxy = RecordingProxy(str(Path(work) / "proxy.sock"), qemu)
        session = await QmpSession.connect(str(Path(work) / "proxy.sock"))
        await scenario(session)
        await asyncio.sleep(0.2)  # events QEMU sends after the last reply are recorded too
        await session.close()
        return proxy.finish()


def save(name: str, chunks: list[Chunk]) -> None:
    lines = [json.dumps({"from": who, "bytes": data.decode()}) for who, data in chunks]
    (HERE / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="qmprec-") as work,
        running_guest(Path(work), "--smp", "2") as guest,
    ):
        for name, scenario in SCENARIOS.items():
            save(name, asyncio.run(record(guest.qmp, scenario)))
            print(f"recorded {name}")


if __name__ == "__main__":
    main()
