"""`record --host`: Linux perf recording the QEMU process while qmpprof samples its guest.

perf starts with its events disabled and is enabled through its control FIFO, which
acknowledges: once `start` returns, perf is counting, and a perf that cannot record
(not installed, refused by perf_event_paranoid, a pid it cannot attach to) has failed
before the first tick, with its own words. Its clock is CLOCK_MONOTONIC, which the
merge turns into the guest samples' wall clock with one offset taken at the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from qmpprof.errors import HostProfileFailed
from qmpprof.host.perf_script import HostSample, parse_samples

#: perf's stack copy per sample for DWARF unwinding: QEMU's vCPU threads and I/O loop
#: stay well within it, and it is the disk space a sample costs.
STACK_DUMP_BYTES = 8192
#: How long perf may take to start counting, and to write its file once told to stop.
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1
#: perf's files go to TMPDIR/qmpprof-perf-PID-*, PID being qmpprof's.
_PREFIX = "qmpprof-perf-"

INSTALL = "Debian: apt-get install linux-perf"


@dataclass(frozen=True)
class PerfCommand:
    """How perf is run: the program and the sampling period (ns of CPU time)."""

    perf: str
    period_ns: int

    def record(self, pid: int, directory: Path) -> list[str]:
        return [
            self.perf,
            "record",
            "--quiet",
            "-k",
            "CLOCK_MONOTONIC",
            "-e",
            "cpu-clock",
            "-c",
            str(self.period_ns),
            "--call-graph",
            f"dwarf,{STACK_DUMP_BYTES}",
            "-p",
            str(pid),
            "-o",
            str(directory / "perf.data"),
            "-D",
            "-1",
            "--control",
            f"fifo:{directory / 'control'},{directory / 'ack'}",
        ]

    def script(self, directory: Path) -> list[str]:
        fields = "comm,pid,tid,time,period,ip,sym,dso"
        data = str(directory / "perf.data")
        return [self.perf, "script", "-i", data, "-F", fields, "--ns", "--no-demangle"]


def find_perf(period_ns: int) -> PerfCommand:
    """Raises HostProfileFailed when perf is not on PATH."""
    perf = shutil.which("perf")
    if perf is None:
        raise HostProfileFailed(f"--host needs Linux perf, which is not installed ({INSTALL})")
    return PerfCommand(perf, period_ns)


class HostRecorder:
    """One perf recording of one process, from `start` to `samples`; `close` always."""

    def __init__(self, command: PerfCommand, pid: int) -> None:
        self._command = command
        self._pid = pid
        _remove_stale(Path(tempfile.gettempdir()))
        self._directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self._process: asyncio.subprocess.Process | None = None
        #: Wall clock minus monotonic clock, when perf started counting.
        self.offset_s = 0.0

    async def start(self) -> None:
        """Start perf and return once it counts. Raises HostProfileFailed."""
        for name in ("control", "ack"):
            os.mkfifo(self._directory / name, 0o600)
        # Read-write opens of a FIFO do not wait for the other end (Linux).
        control = os.open(self._directory / "control", os.O_RDWR)
        ack = os.open(self._directory / "ack", os.O_RDWR | os.O_NONBLOCK)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self._command.record(self._pid, self._directory),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=open(self._directory / "stderr", "wb"),  # noqa: SIM115 (perf's own)
                preexec_fn=_die_with_parent,
                start_new_session=True,  # Ctrl-C is qmpprof's to pass on, after the last tick
            )
            os.write(control, b"enable\n")
            await self._acknowledged(ack)
            self.offset_s = time.time() - time.monotonic()
        finally:
            os.close(control)
            os.close(ack)

    async def _acknowledged(self, ack: int) -> None:
        process = self._process
        assert process is not None
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[int] = loop.create_future()

        def readable() -> None:
            if not answered.done():
                answered.set_result(0)

        loop.add_reader(ack, readable)
        exited: asyncio.Future[int] = asyncio.ensure_future(process.wait())
        try:
            done, _ = await asyncio.wait(
                {answered, exited}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            loop.remove_reader(ack)
            exited.cancel()
        if answered not in done:
            raise HostProfileFailed(f"perf did not start recording: {self._perf_said()}")

    async def stop(self) -> None:
        """Tell perf to finish its file and wait for it. Raises HostProfileFailed."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        try:
            code = await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            raise HostProfileFailed(f"perf did not finish within {STOP_TIMEOUT_S:g} s") from None
        if code not in (0, -signal.SIGINT, 128 + signal.SIGINT):
            raise HostProfileFailed(f"perf record failed: {self._perf_said()}")

    async def samples(self) -> list[HostSample]:
        """What perf recorded, read with `perf script`. Raises HostProfileFailed."""
        listing = self._directory / "script.txt"
        with open(listing, "wb") as out, open(self._directory / "stderr", "ab") as err:
            script = await asyncio.create_subprocess_exec(
                *self._command.script(self._directory), stdout=out, stderr=err
            )
            if await script.wait() != 0:
                raise HostProfileFailed(f"perf script failed: {self._perf_said()}")
        with open(listing, encoding="utf-8", errors="replace") as lines:
            return list(parse_samples(lines))

    def close(self) -> None:
        """Stop perf if it still runs and remove its files."""
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _perf_said(self) -> str:
        """perf's last meaningful line of complaint, for the one-line error."""
        try:
            text = (self._directory / "stderr").read_text(errors="replace")
        except OSError:
            text = ""
        lines = [line.strip() for line in _said(text)]
        if any("perf_event_paranoid" in line for line in lines):
            return "not permitted by kernel.perf_event_paranoid (run as root, or lower it)"
        return lines[-1] if lines else "no message"


def _said(text: str) -> Iterator[str]:
    for line in text.splitlines():
        if line.strip() and not set(line.strip()) <= set("-=> "):
            yield line


def _remove_stale(directory: Path) -> None:
    """Remove what a qmpprof killed while recording left (its perf died with it): the
    directories of qmpprof processes that no longer run."""
    for path in directory.glob(f"{_PREFIX}*-*"):
        owner = path.name.removeprefix(_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _die_with_parent() -> None:
    """perf ends with qmpprof, killed or not: an orphan would record until QEMU exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
