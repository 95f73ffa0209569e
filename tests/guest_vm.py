"""The example guest as tests and benchmarks drive it: boot.sh, a bare QMP client."""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

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
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        stream = sock.makefile("rw")
        stream.readline()
        for message in ({"execute": "qmp_capabilities"}, {"execute": command}):
            if message["execute"] == command and arguments:
                message["arguments"] = arguments
            stream.write(json.dumps(message) + "\n")
            stream.flush()
            reply = _reply(stream)
        return reply.get("return", reply)


def _reply(stream: object) -> dict[str, object]:
    while True:
        line = stream.readline()  # type: ignore[attr-defined]
        if not line:
            raise ConnectionError("QMP connection closed")
        message: dict[str, object] = json.loads(line)
        if "event" not in message:
            return message


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
