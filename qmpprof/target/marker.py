"""A small file per QMP socket saying "qmpprof (pid P) may hold this VM paused".

Set before each `stop` and cleared once the pause is over, through a shared memory map
of the file (a byte write, ~100 ns: no system call per tick), so it survives the one
way out qmpprof cannot handle, SIGKILL: the next qmpprof on that socket, or `qmpprof
resume`, finds the flag of a process that no longer exists and resumes the VM it left
paused. It records who paused (pid and start time, so a recycled pid is not mistaken
for the owner) and which QEMU (the socket peer's pid and start time, so a QEMU
restarted since, maybe with -S, is never resumed by mistake).

The files live in $XDG_RUNTIME_DIR/qmpprof, else /tmp/qmpprof-UID (mode 0700, ours),
named by a hash of the socket's real path: never in the work tree. A clean exit removes
its file; one a SIGKILL left behind goes once both its owner and its QEMU are gone
(`remove_stale`, on each claim), so the directory does not fill up with dead VMs' files.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC = b"qmpprof1"
#: magic, owner pid, owner start time, QEMU pid, QEMU start time (clock ticks since boot)
_HEAD = struct.Struct("<8sqqqq")
_FLAG = _HEAD.size  # one byte: 1 while a stop of the owner's may be in effect
_SIZE = 64


@dataclass(frozen=True)
class Process:
    """A process as it can be recognised later: its pid and its start time (a pid is
    reused by the next process; the pair is not)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Process | None:
        """The live process `pid`, or None (gone, a zombie, or not visible here)."""
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text.rsplit(")", 1)[-1].split()
        if len(fields) < 20 or fields[0] in ("Z", "X") or not fields[19].isdigit():
            return None
        return cls(pid, int(fields[19]))  # field 22 of stat: starttime

    def alive(self) -> bool:
        return self.pid > 0 and Process.of(self.pid) == self


@dataclass(frozen=True)
class MarkerState:
    owner: Process
    qemu: Process
    paused: bool


class PauseMarker:
    """The marker file of one QMP socket, mapped shared."""

    def __init__(self, path: Path, mapped: mmap.mmap) -> None:
        self.path = path
        self._map = mapped

    @classmethod
    def open(cls, socket_path: str) -> PauseMarker | None:
        """The marker of `socket_path`, created if new; None when no private directory
        for it can be had (then nothing survives a SIGKILL, and that is all)."""
        path = marker_path(socket_path)
        if path is None:
            return None
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < _SIZE:
                os.ftruncate(fd, _SIZE)
            return cls(path, mmap.mmap(fd, _SIZE, mmap.MAP_SHARED))
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def read(self) -> MarkerState | None:
        """What the file says, or None if it says nothing (new, or not ours)."""
        return _state(self._map)

    def claim(self, owner: Process, qemu: Process) -> None:
        """Make the file ours, flag clear (the flag byte goes first: a half-written
        claim must never read as a pause)."""
        self._map[_FLAG] = 0
        _HEAD.pack_into(self._map, 0, _MAGIC, owner.pid, owner.start, qemu.pid, qemu.start)

    def set_paused(self, paused: bool) -> None:
        self._map[_FLAG] = 1 if paused else 0

    def remove_stale(self) -> None:
        """Remove the other markers in this one's directory whose owner and QEMU both
        no longer exist: nothing is left to resume. One whose QEMU we could not
        identify (pid 0), or not yet claimed, is kept. Never raises."""
        try:
            others = [path for path in self.path.parent.glob("*.pause") if path != self.path]
        except OSError:
            return
        for path in others:
            state = _read_file(path)
            if state is None or state.qemu.pid <= 0:
                continue
            if not state.owner.alive() and not state.qemu.alive():
                with contextlib.suppress(OSError):
                    path.unlink()

    def remove(self) -> None:
        """Unmap and delete the file (a clean exit leaves nothing behind). Never raises."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._map.close()


def _read_file(path: Path) -> MarkerState | None:
    """What the marker file at `path` says; None if it says nothing or cannot be read."""
    try:
        with path.open("rb") as file:
            data = file.read(_SIZE)
    except OSError:
        return None
    if len(data) < _SIZE:
        return None
    return _state(data)


def _state(data: bytes | mmap.mmap) -> MarkerState | None:
    magic, owner_pid, owner_start, qemu_pid, qemu_start = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        return None
    owner, qemu = Process(owner_pid, owner_start), Process(qemu_pid, qemu_start)
    return MarkerState(owner, qemu, data[_FLAG] == 1)


def marker_path(socket_path: str) -> Path | None:
    """Where the marker of `socket_path` lives, in a private directory made if needed;
    None when that directory is not ours alone (someone else's /tmp entry)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "qmpprof" if runtime else Path(f"/tmp/qmpprof-{os.getuid()}")
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    name = hashlib.sha256(os.path.realpath(socket_path).encode()).hexdigest()[:32]
    return base / f"{name}.pause"
