"""The example guest as tests and benchmarks drive it: boot.sh, a bare QMP client."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "examples" / "guest" / "boot.sh"


@dataclass(frozen=True)
class Guest:
    """A running example guest: what boot.sh printed."""

    pid: int
    kernel: Path
    qmp: str
    gdb: str
    serial: str
    user_dir: Path | None = None

    def qmp_call(self, command: str, arguments: dict[str, object] | None = None) -> object:
        """One QMP command over a fresh connection (qmpprof must not be connected)."""
        return qmp_call(self.qmp, command, arguments)

    def status(self) -> str:
        result = self.qmp_call("query-status")
        assert isinstance(result, dict)
        return str(result["status"])


def qmp_call(path: str, command: str, arguments: dict[str, object] | None = None) -> object:
    qmp = BareQmp(path)
    try:
        return qmp.call(command, arguments)
    finally:
        qmp.close()


class BareQmp:
    """QMP over a plain blocking socket: no client library, events skipped.

    Also the floor the benchmarks hold qmpprof's own client against."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.settimeout(10)
        self._sock.connect(path)
        self._stream = self._sock.makefile("rw")
        self._stream.readline()
        #: QEMU's timestamps (seconds) of the STOP and RESUME events read so far.
        self.run_events: list[tuple[str, float]] = []
        # A reply to the command a closed connection had running reaches the next one:
        # skip every reply before the one to this id (as qmpprof's client does).
        self.call("qmp_capabilities", id=f"bare-{id(self)}")

    def call(
        self, command: str, arguments: dict[str, object] | None = None, id: str | None = None
    ) -> object:
        """The command's return value, or QEMU's error reply as it came."""
        message: dict[str, object] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        if id is not None:
            message["id"] = id
        self._stream.write(json.dumps(message, separators=(",", ":")))  # as qmpprof sends it
        self._stream.flush()
        while True:
            line = self._stream.readline()
            if not line:
                raise ConnectionError("QMP connection closed")
            reply: dict[str, Any] = json.loads(line)
            if reply.get("event") in ("STOP", "RESUME"):
                stamp = reply["timestamp"]["seconds"] + reply["timestamp"]["microseconds"] / 1e6
                self.run_events.append((reply["event"], stamp))
            if "event" not in reply and (id is None or reply.get("id") == id):
                return reply.get("return", reply)

    def close(self) -> None:
        self._stream.close()  # the socket stays open while its file object is
        self._sock.close()


def boot_guest(workdir: Path, *extra: str) -> Guest:
    qmp = workdir / "qmp.sock"
    command = [str(BOOT), "--qmp", str(qmp), "--serial", str(workdir / "serial.log"), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"boot.sh failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    user_dir = Path(values["user_dir"]) if values.get("user_dir") else None
    return Guest(
        int(values["pid"]),
        Path(values["kernel"]),
        values["qmp"],
        values["gdb"],
        values["serial"],
        user_dir,
    )


def stop_guest(guest: Guest) -> None:
    subprocess.run([str(BOOT), "stop", str(guest.pid)], check=False, timeout=60)


@contextmanager
def running_guest(workdir: Path, *extra: str) -> Iterator[Guest]:
    """The example guest booted with boot.sh's `extra` arguments, stopped when the block
    ends however it ends."""
    guest = boot_guest(workdir, *extra)
    try:
        yield guest
    finally:
        stop_guest(guest)


@contextmanager
def scratch_ram_file() -> Iterator[str]:
    """A fresh path under /dev/shm for a guest's RAM (boot.sh --memory-backend), removed
    when the block ends: QEMU creates the file even when the boot then fails."""
    path = Path(f"/dev/shm/qmpprof-test-{uuid.uuid4().hex[:12]}.ram")
    try:
        yield str(path)
    finally:
        path.unlink(missing_ok=True)
