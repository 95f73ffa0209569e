"""Reading guest virtual memory through QEMU, one window per round trip where possible.

Backends:
  direct   guest RAM read from this host without QEMU (target/direct.py): the fastest.
  hmp      HMP `x /Ngx` on the vCPU: works with any QEMU, even on another host.
  memsave  QMP `memsave` into a file on this host's tmpfs: binary, one round trip.
All return the readable prefix of the window: a stack window that runs into an
unmapped page is cut there, not lost.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from qmpprof.defaults import PAGE_SIZE
from qmpprof.errors import CommandFailed, DirectMemoryUnavailable, UsageError
from qmpprof.model import RegisterSet
from qmpprof.target.qmp import QmpSession
from qmpprof.target.xdump import parse_hmp_words

#: The most one QMP command reads: a window is read in commands of at most this much,
#: so that one command never holds QEMU's monitor for long and a tick that outlives its
#: budget is abandoned between two of them (an `x` of 32 KiB is ~75 KB of text and a
#: few milliseconds; a whole 100 MB `x` kept the VM paused for over 12 s).
HMP_CHUNK = 32 * 1024
MEMSAVE_CHUNK = 256 * 1024
_ADDRESS_SPACE_END = 1 << 64


class MemoryBackend(Protocol):
    """Reads guest virtual memory as one vCPU sees it."""

    name: str
    #: Whether reads are QMP commands (then nothing else may be primed while they run).
    through_monitor: bool

    def set_registers(self, registers: Sequence[RegisterSet]) -> None:
        """Start a tick: the vCPUs' registers as just read (for backends that walk page
        tables themselves)."""
        ...

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        """The readable bytes from `address` upward, at most `size`; b"" if none."""
        ...

    async def close(self) -> None: ...


class KernelReader:
    """Which vCPU QEMU reads a kernel address through. QEMU's debug reads check the
    vCPU's own permissions: one at AArch64's EL0 cannot read the kernel's half, which
    every vCPU at EL1 maps alike (TTBR1), so such a read goes through one of those."""

    def __init__(self) -> None:
        self._user: frozenset[int] = frozenset()
        self._kernel: int | None = None

    def set_registers(self, registers: Sequence[RegisterSet]) -> None:
        aarch64 = [r for r in registers if r.isa == "aarch64"]
        self._user = frozenset(r.vcpu for r in aarch64 if r.user_mode)
        self._kernel = next((r.vcpu for r in aarch64 if not r.user_mode), None)

    def cpu_for(self, cpu: int, address: int) -> int:
        if address >= _KERNEL_HALF and cpu in self._user and self._kernel is not None:
            return self._kernel
        return cpu


_KERNEL_HALF = 1 << 63


class HmpMemory:
    """Guest memory through HMP `x`: text, but available everywhere."""

    name = "hmp"
    through_monitor = True

    def __init__(self, session: QmpSession) -> None:
        self._session = session
        self._kernel_reader = KernelReader()

    def set_registers(self, registers: Sequence[RegisterSet]) -> None:
        self._kernel_reader.set_registers(registers)  # QEMU translates for each vCPU

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        cpu = self._kernel_reader.cpu_for(cpu, address)
        return await _in_chunks(self._read, cpu, address, _clamp(address, size), HMP_CHUNK)

    async def _read(self, cpu: int, address: int, size: int) -> bytes:
        # `x` reads whole words: a size that is not a multiple of 8 takes one more word
        # (unless that would run past the address space) and drops its extra bytes.
        words = min(-(-size // 8), (_ADDRESS_SPACE_END - address) // 8)
        text = await self._session.hmp(f"x /{words}gx {address:#x}", cpu=cpu)
        data = parse_hmp_words(text, address)
        end = address + len(data)
        if len(data) < size and (end + 8) % PAGE_SIZE == 0:
            # `x` reads two words a line, and a line that runs into an unreadable page
            # fails whole: the last word of a readable page is asked for alone.
            data += parse_hmp_words(await self._session.hmp(f"x /1gx {end:#x}", cpu=cpu), end)
        return data[:size]

    async def close(self) -> None:
        pass


class MemsaveMemory:
    """Guest memory through QMP `memsave` into a tmpfs file QEMU writes and we read."""

    name = "memsave"
    through_monitor = True

    def __init__(self, session: QmpSession) -> None:
        self._session = session
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        handle, self.path = tempfile.mkstemp(prefix="qmpprof-", suffix=".mem", dir=directory)
        os.close(handle)
        self._kernel_reader = KernelReader()

    def set_registers(self, registers: Sequence[RegisterSet]) -> None:
        self._kernel_reader.set_registers(registers)  # QEMU translates for each vCPU

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        cpu = self._kernel_reader.cpu_for(cpu, address)
        return await _in_chunks(self._read, cpu, address, _clamp(address, size), MEMSAVE_CHUNK)

    async def _read(self, cpu: int, address: int, size: int) -> bytes:
        try:
            return await self._save(cpu, address, size)
        except CommandFailed:
            if self._session.timed_out:  # not a refusal: QEMU is stuck
                raise
            return await self._read_pages(cpu, address, size)

    async def _read_pages(self, cpu: int, address: int, size: int) -> bytes:
        """After a failed whole read: page by page up to the first unreadable one."""
        data = bytearray()
        end = address + size
        while address < end:
            chunk = min(end, (address // PAGE_SIZE + 1) * PAGE_SIZE) - address
            try:
                data += await self._save(cpu, address, chunk)
            except CommandFailed:
                if self._session.timed_out:
                    raise
                break
            address += chunk
        return bytes(data)

    async def _save(self, cpu: int, address: int, size: int) -> bytes:
        arguments = {
            "val": as_qmp_int64(address),
            "size": size,
            "filename": self.path,
            "cpu-index": cpu,
        }
        await self._session.execute("memsave", arguments)
        with open(self.path, "rb") as stream:
            return stream.read(size)

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


async def open_memory(
    session: QmpSession,
    kind: str,
    mem_path: str | None = None,
    notice: Callable[[str], None] | None = None,
    user_roots: bool = False,
) -> MemoryBackend:
    """The backend `kind` names. `auto` takes the fastest that works here: direct (guest
    RAM mapped from `mem_path`, or QEMU's /proc/PID/mem), else memsave if QEMU can write
    a file we can read, else hmp; `notice` is told in one line why direct was not used.
    Raises DirectMemoryUnavailable for `direct`, CommandFailed for a `memsave` that
    QEMU cannot write where we read (another user, confined, another mount namespace).
    `user_roots`: whether the OS adapter can say each vCPU's user page-table root where
    the register dump lacks it (AArch64's TTBR0_EL1); without, such a guest is read
    through QEMU, which translates with each vCPU's own."""
    if kind == "hmp":
        return HmpMemory(session)
    direct_problem = None
    if kind in ("direct", "auto"):
        from qmpprof.target.direct import open_direct  # mmap, sockets: only when asked
        from qmpprof.target.roots import page_table_roots, use_roots

        try:
            roots = await page_table_roots(session, user_roots)
            direct = await open_direct(session, mem_path)
            if roots is not None:
                await use_roots(session, direct, roots)
            return direct
        except DirectMemoryUnavailable as err:
            if kind == "direct":
                raise
            direct_problem = err.reason
    if kind not in ("memsave", "auto"):
        raise UsageError(f"unknown memory backend {kind!r} (expected auto, direct, hmp, memsave)")
    backend = MemsaveMemory(session)
    problem = await _memsave_problem(session, backend)
    if problem is None:
        if notice is not None and direct_problem is not None:
            notice(f"memory: memsave, as direct is unavailable: {direct_problem}")
        return backend
    await backend.close()
    if kind == "memsave":
        raise CommandFailed("memsave", f"{problem}; --memory direct or hmp needs no file")
    if notice is not None and direct_problem is not None:
        notice(f"memory: hmp (slow), as direct is unavailable ({direct_problem}) and {problem}")
    return HmpMemory(session)


async def _memsave_problem(session: QmpSession, backend: MemsaveMemory) -> str | None:
    """Why memsave cannot be used, or None when QEMU writes a byte of physical memory
    into our file and we read it back (QEMU shares our file system and may write it)."""
    path = backend.path
    try:
        await session.execute("pmemsave", {"val": 0, "size": 1, "filename": path})
        with open(path, "rb") as stream:
            if len(stream.read(1)) == 1:
                return None
    except CommandFailed as err:
        return f"QEMU cannot write {path} ({err.reason}){_confinement(session)}"
    except OSError as err:
        return f"{path}, written by QEMU, cannot be read: {err.strerror}"
    return (
        f"QEMU wrote {path} in a file system of its own (another host or mount namespace:"
        " libvirt gives QEMU a /dev of its own)"
    )


def _confinement(session: QmpSession) -> str:
    """Why QEMU may be refused a file of ours: the user it runs as, when not ours."""
    try:
        uid = os.stat(f"/proc/{session.qemu_pid}").st_uid if session.qemu_pid else None
    except OSError:
        uid = None
    if uid is None or uid == os.getuid():
        return ""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid {uid}"
    return f": QEMU runs as {user}, as libvirt runs it, maybe confined by AppArmor or SELinux"


async def _in_chunks(
    read: Callable[[int, int, int], Awaitable[bytes]], cpu: int, address: int, size: int, chunk: int
) -> bytes:
    """`read(cpu, address, size)` in pieces of at most `chunk` bytes, up to the first
    short one (the readable prefix ends there)."""
    data = bytearray()
    while len(data) < size:
        want = min(chunk, size - len(data))
        piece = await read(cpu, address + len(data), want)
        data += piece
        if len(piece) < want:
            break
    return bytes(data)


def as_qmp_int64(address: int) -> int:
    """QMP declares `val` as int64: an address at or above 2**63 goes as its negative twin."""
    return address - (1 << 64) if address >= 1 << 63 else address


def _clamp(address: int, size: int) -> int:
    """`size`, cut where the address space ends."""
    return max(0, min(size, _ADDRESS_SPACE_END - address))
