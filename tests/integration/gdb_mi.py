"""A small GDB/MI driver: GDB attached to QEMU's gdbstub is our oracle for stacks."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r'frame=\{level="(\d+)",addr="(0x[0-9a-f]+)"(?:,func="([^"]*)")?')


@dataclass(frozen=True)
class GdbFrame:
    level: int
    address: int
    function: str | None


class GdbMi:
    """GDB in MI mode, attached to a gdbstub; every read has a timeout."""

    def __init__(self, elf: Path, gdb_socket: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._process = subprocess.Popen(
            ["gdb", "--interpreter=mi3", "-nx", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.command("-gdb-set mi-async on")
        self.command("-gdb-set confirm off")
        self.command(f"-file-exec-and-symbols {elf}")
        self.command(f"-target-select remote {gdb_socket}", done="^connected")

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))

    def command(self, text: str, done: str = "^done") -> list[str]:
        """Send one MI command and return the output up to its result record."""
        assert self._process.stdin is not None
        self._process.stdin.write(text + "\n")
        self._process.stdin.flush()
        return self.wait_for(done, "^error")

    def wait_for(self, *prefixes: str) -> list[str]:
        seen = []
        while True:
            line = self._lines.get(timeout=self.timeout)
            seen.append(line)
            if line.startswith("^error"):
                raise RuntimeError(f"GDB error: {line}")
            if line.startswith(prefixes):
                return seen

    def resume(self) -> None:
        self.command("-exec-continue", done="^running")

    def interrupt(self) -> None:
        self.command("-exec-interrupt")
        self.wait_for("*stopped")

    def frames(self, thread: int = 1) -> list[GdbFrame]:
        """The stack of one thread (a vCPU, counted from 1), leaf first."""
        output = self.command(f"-stack-list-frames --thread {thread}")
        return [
            GdbFrame(int(level), int(address, 16), function or None)
            for line in output
            for level, address, function in _FRAME.findall(line)
        ]

    def console(self, command: str) -> list[str]:
        """A CLI command through MI (quotes in `command` must be escaped by the caller)."""
        return self.command(f'-interpreter-exec console "{command}"')

    def evaluate(self, expression: str, thread: int) -> str | None:
        """The value of `expression` in `thread`, as GDB prints it; None on error."""
        try:
            output = self.command(f"-data-evaluate-expression --thread {thread} {expression}")
        except RuntimeError:
            return None
        done = next(line for line in output if line.startswith("^done"))
        return done.split('value="', 1)[1].rsplit('"', 1)[0]

    def detach(self) -> None:
        """Let the VM run without GDB: while GDB is attached to a running VM, qmpprof's
        `stop` reaches GDB as a stop, and GDB's answer pauses the VM again (README)."""
        self.command("-target-detach")

    def close(self) -> None:
        """Quit GDB; detaching lets the VM run again."""
        try:
            self.command("-target-detach")
            self.command("-gdb-exit", done="^exit")
        except (RuntimeError, queue.Empty, BrokenPipeError):
            pass
        finally:
            self._process.kill()
            self._process.wait(timeout=10)
