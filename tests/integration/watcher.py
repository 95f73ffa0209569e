"""Another QMP client next to qmpprof (a debugger, libvirt, a test harness): it sends
`stop` and `cont` on a second monitor and reads every event QEMU broadcasts to it, so
it knows whether its own `stop` took effect (QEMU emits STOP before the reply of the
command that caused it, and nothing at all for a `stop` of a VM already paused).

Also the tools to freeze qmpprof between two ticks, where no command of its is in
flight: its sampling loop waits for a tick in time.sleep (clock_nanosleep) after the
previous tick has ended, and nowhere else in its main thread."""

from __future__ import annotations

import codecs
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: x86-64 clock_nanosleep: what /proc/PID/syscall starts with while qmpprof waits for a tick.
CLOCK_NANOSLEEP = "230"


@dataclass(frozen=True)
class Event:
    name: str
    stamp_us: int


class Watcher:
    """A blocking QMP client that keeps every event it reads, in order."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.settimeout(30)
        self._sock.connect(path)
        self._stream = self._sock.makefile("rw")
        self._stream.readline()  # greeting
        self.events: list[Event] = []
        self.call("qmp_capabilities")

    def call(self, command: str) -> tuple[list[Event], dict[str, object]]:
        """Run `command`: (the run-state events read before its reply, the reply)."""
        self._stream.write(json.dumps({"execute": command}))
        self._stream.flush()
        seen: list[Event] = []
        while True:
            message = self._read()
            if "event" not in message:
                return seen, message
            if message["event"] in ("STOP", "RESUME"):
                seen.append(self.events[-1])

    def stop_took_effect(self) -> bool:
        """Send `stop`; whether it paused a running VM: a STOP stamped after it was sent
        came before its reply (when qmpprof cannot have sent a `stop` meanwhile)."""
        sent_us = time.time_ns() // 1000
        seen, reply = self.call("stop")
        assert "return" in reply, reply
        return [e.name for e in seen if e.stamp_us >= sent_us] == ["STOP"]

    def status(self) -> str:
        """The VM's run state as query-status says it: running, paused, ..."""
        _, reply = self.call("query-status")
        result = reply["return"]
        assert isinstance(result, dict)
        return str(result["status"])

    def wait_for(self, name: str) -> Event:
        """Block until the next `name` event (STOP or RESUME)."""
        start = len(self.events)
        while not any(e.name == name for e in self.events[start:]):
            self._read()
        return next(e for e in self.events[start:] if e.name == name)

    def run_state_events(self) -> list[str]:
        """Read what is waiting without blocking long: the names of all events so far."""
        self._sock.settimeout(0.2)
        try:
            while True:
                self._read()
        except (TimeoutError, OSError):
            pass
        finally:
            self._sock.settimeout(30)
        return [e.name for e in self.events]

    def _read(self) -> dict[str, object]:
        line = self._stream.readline()
        if not line:
            raise ConnectionError("QMP connection closed")
        message: dict[str, object] = json.loads(line)
        if message.get("event") in ("STOP", "RESUME"):
            stamp = message["timestamp"]
            assert isinstance(stamp, dict)
            micros = stamp["seconds"] * 1_000_000 + stamp["microseconds"]
            self.events.append(Event(str(message["event"]), micros))
        return message

    def close(self) -> None:
        self._stream.close()
        self._sock.close()


@contextmanager
def watching(path: str) -> Iterator[Watcher]:
    watcher = Watcher(path)
    try:
        yield watcher
    finally:
        watcher.close()


def main_thread_syscall(pid: int) -> str:
    """What /proc says qmpprof's main thread is doing: a syscall number, 'running' or -1."""
    try:
        return Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "gone"


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def freeze(pid: int) -> None:
    """SIGSTOP `pid` and return once the kernel has stopped it."""
    os.kill(pid, signal.SIGSTOP)
    while process_state(pid) not in ("T", "t", "gone", "Z"):
        pass


def freeze_between_ticks(process: subprocess.Popen[str]) -> bool:
    """Freeze qmpprof where its main thread waits for the next tick (no command of its in
    flight; the next tick's `stop` not sent). False if it ended first."""
    pid = process.pid
    while process.poll() is None:
        if main_thread_syscall(pid) != CLOCK_NANOSLEEP:
            continue
        freeze(pid)
        if main_thread_syscall(pid) == CLOCK_NANOSLEEP:
            return True
        os.kill(pid, signal.SIGCONT)
    return False


class PipeText:
    """What a child process writes to a pipe, read with os.read: nothing is left in a
    buffer of ours, so Popen.communicate reads the rest after us."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None
        self._fd = pipe.fileno()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def drain(self) -> None:
        """Read what the pipe holds now, without waiting: with the writer frozen, this is
        everything it wrote before."""
        os.set_blocking(self._fd, False)
        try:
            while self._read_chunk():
                pass
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(self._fd, True)

    def wait_for(self, needle: str) -> bool:
        """Block until `needle` is in what arrives from now on; False at end of file."""
        start = len(self.text)
        while needle not in self.text[start:]:
            if not self._read_chunk():
                return False
        return True

    def _read_chunk(self) -> bool:
        chunk = os.read(self._fd, 65536)
        self.text += self._decoder.decode(chunk)
        return bool(chunk)
