"""Guest RAM read straight from the host, without QEMU in the loop of each read.

Two sources of guest physical memory, both found through QMP once at start:
  mmap   the file QEMU's RAM lives in (`-object memory-backend-file,...,mem-path=PATH,
         share=on -machine memory-backend=ID`): file offset = offset in that RAM block.
  proc   QEMU's own address space through /proc/PID/mem: host address of each guest
         physical range from HMP `gpa2hva` (QEMU 7.2's `info ramblock` prints no host
         addresses); needs the permission to ptrace QEMU.
Either way `info mtree -f` says which guest physical ranges are RAM and where each
lies in its RAM block (RAM above 4 GiB continues the block after the PCI hole), and
virtual addresses are translated by walking the vCPU's page tables (target/paging.py).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from qmpprof.errors import DirectMemoryUnavailable, MemoryFault, UsageError
from qmpprof.model import RegisterSet
from qmpprof.target.paging import (
    Aarch64PagingState,
    PagingMode,
    PagingState,
    TableCache,
    VirtualMemory,
)
from qmpprof.target.qmp import QmpSession
from qmpprof.target.ram_layout import (
    RamBlock,
    RamRange,
    parse_flat_ram,
    parse_gpa2hva,
    parse_ramblocks,
)
from qmpprof.target.xdump import parse_hmp_words

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_VERIFY_BYTES = 32
#: CR3's bit that selects the user half of Linux's PTI pair of PGDs.
_PTI_USER_BIT = 1 << 12
_VERIFY_ATTEMPTS = 3


@dataclass(frozen=True)
class Segment:
    """Guest physical [start, end) read from the source at `source_offset` onward (a
    file offset for mmap, a host virtual address for /proc/PID/mem)."""

    start: int
    end: int
    source_offset: int
    region: str


#: A segment no read falls into (it ends before it starts): `_last` with no segments.
_NOWHERE = Segment(1, 0, 0, "")


class SegmentedMemory:
    """Guest physical memory (a target.paging.PhysicalReader): sorted segments, each
    read from one source; anything outside them, or a failed source read, faults."""

    detail = "no source"

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = tuple(sorted(segments, key=lambda s: s.start))
        self._starts = [s.start for s in self.segments]
        self._last = self.segments[0] if self.segments else _NOWHERE

    def read_physical(self, address: int, size: int) -> bytes:
        """`size` bytes of guest physical memory. Raises MemoryFault."""
        segment = self._last
        if address < segment.start or address + size > segment.end or size < 0:
            segment = self._find(address, size)
        try:
            return self._read_source(segment.source_offset + address - segment.start, size)
        except MemoryFault as err:  # name the guest physical address, not the host's
            raise MemoryFault(address, size) from err

    def _find(self, address: int, size: int) -> Segment:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0 or address + size > self.segments[index].end or size < 0:
            raise MemoryFault(address, max(size, 1))
        self._last = self.segments[index]
        return self._last

    def _read_source(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset` of the source (subclasses). Raises MemoryFault."""
        raise MemoryFault(offset, size)

    def close(self) -> None:
        """Release the source; later reads fault. Never raises."""
        self.segments = ()
        self._starts = []
        self._last = _NOWHERE


class MappedFileMemory(SegmentedMemory):
    """Guest RAM from an mmap of the file QEMU shares it through."""

    def __init__(self, path: str, segments: Sequence[Segment]) -> None:
        """Raises DirectMemoryUnavailable when the file cannot be mapped or is short."""
        super().__init__(segments)
        self.detail = f"mmap of {path}"
        self._map = _map_file(path)
        if any(s.source_offset + s.end - s.start > len(self._map) for s in self.segments):
            self._map.close()
            raise DirectMemoryUnavailable(f"{path} is smaller than QEMU's guest RAM in it")

    def _read_source(self, offset: int, size: int) -> bytes:
        return self._map[offset : offset + size]

    def read_word(self, address: int, size: int) -> int:
        """The little-endian word of `size` bytes at guest physical `address` (a page
        walk's table entry: paging.WordReader). Raises MemoryFault."""
        return int.from_bytes(self.read_physical(address, size), "little")

    def close(self) -> None:
        super().close()
        self._map.close()


def _map_file(path: str) -> mmap.mmap:
    try:
        with open(path, "rb") as stream:
            return mmap.mmap(stream.fileno(), 0, prot=mmap.PROT_READ)
    except (OSError, ValueError) as err:
        raise DirectMemoryUnavailable(f"cannot map {path}: {_reason(err)}") from err


class ProcessMemory(SegmentedMemory):
    """Guest RAM read from QEMU's address space through /proc/PID/mem."""

    def __init__(self, pid: int, segments: Sequence[Segment]) -> None:
        """Raises DirectMemoryUnavailable when /proc/PID/mem cannot be opened."""
        super().__init__(segments)
        path = f"/proc/{pid}/mem"
        self.detail = path
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            raise DirectMemoryUnavailable(
                f"cannot open {path}: {_reason(err)} (QEMU's user with ptrace rights, or root, can)"
            ) from err

    def _read_source(self, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, offset) if self._fd is not None else b""
        except OSError as err:
            raise MemoryFault(offset, size) from err
        if len(data) != size:
            raise MemoryFault(offset, size)
        return data

    def close(self) -> None:
        super().close()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class DirectMemory:
    """A MemoryBackend that reads guest RAM on this host, translating each vCPU's
    virtual addresses with the registers of the current tick (`set_registers`)."""

    name = "direct"
    through_monitor = False

    def __init__(self, physical: SegmentedMemory) -> None:
        self.physical = physical
        self.detail = physical.detail
        self._vcpus: dict[int, VirtualMemory] = {}
        #: An AArch64 guest's TTBR1_EL1 and TCR_EL1 (read once: target/gdbstub.py), which
        #: its register dump lacks; its TTBR0_EL1 comes as each RegisterSet's `cr3`.
        self.aarch64_roots: tuple[int, int] | None = None
        #: Its vCPUs' TPIDR_EL1 (target/roots.py), by vCPU index.
        self.aarch64_tpidr: tuple[int, ...] = ()

    def set_registers(self, registers: Iterable[RegisterSet]) -> None:
        """Start a tick: translate with these registers, forgetting every cached
        translation (the guest ran since the last tick and may have changed its tables)."""
        shared: dict[PagingState | Aarch64PagingState, VirtualMemory] = {}
        tables = TableCache()
        self._vcpus = {}
        for regs in registers:
            state = self._paging(regs)
            if state not in shared:  # vCPUs in one address space share one cache
                kernel = isolated_kernel_root(state) if isinstance(state, PagingState) else None
                shared[state] = VirtualMemory(self.physical, state, tables, kernel)
            self._vcpus[regs.vcpu] = shared[state]

    def _paging(self, regs: RegisterSet) -> PagingState | Aarch64PagingState:
        if regs.isa != "aarch64":
            return PagingState.from_registers(regs)
        ttbr1, tcr = self.aarch64_roots or (0, 0)
        return Aarch64PagingState(regs.cr3 or None, ttbr1, tcr)

    def reader(self, cpu: int) -> VirtualMemory:
        """vCPU `cpu`'s memory as a synchronous MemoryReader. Raises LookupError when
        `set_registers` was not given that vCPU's registers."""
        memory = self._vcpus.get(cpu)
        if memory is None:
            raise LookupError(f"DirectMemory: no registers of vCPU {cpu} (set_registers)")
        return memory

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        """The readable bytes from `address` upward, at most `size` (cut at the first
        unmapped page); b"" if none. Raises LookupError like `reader`."""
        return self.reader(cpu).read_prefix(address, size)

    async def close(self) -> None:
        self._vcpus = {}
        self.physical.close()


def isolated_kernel_root(state: PagingState) -> int | None:
    """Where the kernel's own top-level table is when this CR3 may be a user copy of it.

    Linux's page table isolation (PTI, the Meltdown mitigation, on by default on the
    Intel CPUs that need it, `pti=on` anywhere) runs user code on a second PGD that maps
    of the kernel only its entry code: the two are allocated as an 8 KiB pair, the
    kernel's first, and bit 12 of CR3 picks the user's. So while a vCPU runs user code,
    its task and per-CPU area are mapped only by the table 4 KiB below. x86-32 Linux
    pairs its PGDs (a PAE PDPT, or a 2-level page directory) the same way. Used only for
    upper-half addresses CR3's own table does not map (target.paging)."""
    if state.mode is PagingMode.DISABLED or not state.cr3 & _PTI_USER_BIT:
        return None
    return state.root & ~_PTI_USER_BIT


async def open_direct(session: QmpSession, mem_path: str | None = None) -> DirectMemory:
    """Direct access to the guest RAM of the QEMU behind `session`: an mmap of
    `mem_path` when given (QEMU's memory-backend-file), else /proc/PID/mem.

    Raises DirectMemoryUnavailable (why: another host or PID namespace, no permission,
    a layout we do not understand, bytes that disagree with QEMU's), and TargetGone or
    CommandFailed from the session.
    """
    ranges = parse_flat_ram(await session.hmp("info mtree -f"))
    blocks = parse_ramblocks(await session.hmp("info ramblock"))
    if mem_path is not None:
        physical: SegmentedMemory = await _open_file(session, mem_path, ranges, blocks)
    else:
        physical = await _open_process(session, ranges, blocks)
    try:
        await _verify(session, physical)
    except BaseException:
        physical.close()
        raise
    return DirectMemory(physical)


async def _open_file(
    session: QmpSession, path: str, ranges: Sequence[RamRange], blocks: Sequence[RamBlock]
) -> SegmentedMemory:
    backend = await _file_backend(session, path)
    ram = [r for r in ranges if r.region == backend]
    if not ram:
        raise DirectMemoryUnavailable(f"QEMU maps none of {path} ({backend}) as guest RAM")
    _check_blocks(ram, blocks)
    return MappedFileMemory(path, [Segment(r.start, r.end, r.offset, r.region) for r in ram])


async def _file_backend(session: QmpSession, path: str) -> str:
    """The id of the shared memory-backend-file object whose file is `path`."""
    objects = await session.execute("qom-list", {"path": "/objects"})
    for child in objects:
        if child.get("type") != "child<memory-backend-file>":
            continue
        name = str(child["name"])
        if _same_file(path, str(await _qom_get(session, name, "mem-path"))):
            if not await _qom_get(session, name, "share"):
                raise DirectMemoryUnavailable(f"QEMU maps {path} share=off: it never sees writes")
            return name
    raise DirectMemoryUnavailable(f"QEMU has no memory-backend-file with mem-path={path}")


async def _qom_get(session: QmpSession, name: str, prop: str) -> Any:
    return await session.execute("qom-get", {"path": f"/objects/{name}", "property": prop})


def _same_file(ours: str, theirs: str) -> bool:
    try:
        return os.path.samefile(ours, theirs)
    except OSError:  # QEMU's path may not exist here (another host or mount namespace)
        return False


async def _open_process(
    session: QmpSession, ranges: Sequence[RamRange], blocks: Sequence[RamBlock]
) -> SegmentedMemory:
    pid = qemu_pid(session)
    _check_blocks(ranges, blocks)
    segments = [await _host_segment(session, r) for r in ranges]
    return ProcessMemory(pid, segments)


async def _host_segment(session: QmpSession, ram: RamRange) -> Segment:
    region, host = parse_gpa2hva(await session.hmp(f"gpa2hva {ram.start:#x}"))
    if region != ram.region:
        raise DirectMemoryUnavailable(
            f"unknown layout: {ram.start:#x} is in {region!r} by gpa2hva, {ram.region!r} by mtree"
        )
    return Segment(ram.start, ram.end, host, ram.region)


def _check_blocks(ranges: Iterable[RamRange], blocks: Sequence[RamBlock]) -> None:
    """Each range must lie inside its RAM block (a region named like one block)."""
    for ram in ranges:
        named = [b for b in blocks if b.name == ram.region or b.name.endswith("/" + ram.region)]
        if len(named) == 1 and ram.offset + ram.size > named[0].used:
            raise DirectMemoryUnavailable(
                f"unknown layout: {ram.region} @{ram.offset:#x}+{ram.size:#x} exceeds its "
                f"RAM block ({named[0].used:#x} bytes)"
            )


def qemu_pid(session: QmpSession) -> int:
    """The process id of the QEMU behind `session`: the one identify_qemu checked, else
    the peer of its unix socket. Raises DirectMemoryUnavailable when QEMU is not a
    process we can see, or the peer is not QEMU (a proxy)."""
    if session.qemu_pid is not None:
        return session.qemu_pid
    if session.not_qemu is not None:
        raise DirectMemoryUnavailable(session.not_qemu)
    sock = _session_socket(session)
    pid = _peer_pid(sock) if sock is not None else _connect_for_pid(session.path)
    if pid <= 0:
        raise DirectMemoryUnavailable("QEMU runs in another PID namespace (container?)")
    return pid


async def identify_qemu(
    session: QmpSession, given: int | None = None, source: str = "--pid"
) -> None:
    """Find which process is the QEMU behind `session`, before anything reads its memory
    or resumes it: `given` (from `source`: --pid, libvirt) or else the socket's peer, and
    only when every vCPU thread QEMU reports (query-cpus-fast) is one of its threads.
    Sets session.qemu_pid, or session.not_qemu with the reason; a peer that is a
    visible process but not QEMU is a proxy, spoken to one command at a time
    (session.one_at_a_time). Raises UsageError when `given` is not that QEMU."""
    threads = await vcpu_threads(session)
    peer = _peer_or_none(session)
    if peer is not None and _owns(peer, threads):
        if given is not None and given != peer:
            raise UsageError(
                f"{source} names pid {given}, which is not the QEMU behind {session.path}: "
                f"pid {peer} is"
            )
        session.qemu_pid = peer
        return
    if peer is not None and os.path.exists(f"/proc/{peer}"):
        session.one_at_a_time = True  # a proxy (virt-qemu-qmp-proxy), not QEMU
    if given is None:
        if peer is not None:  # else qemu_pid says why it cannot see QEMU, as before
            session.not_qemu = _peer_not_qemu(peer, threads)
        return
    if not _owns(given, threads):
        raise UsageError(
            f"{source} names pid {given}, which is not the QEMU behind {session.path}: its "
            f"vCPU threads ({_listed(threads)}) are not threads of pid {given}"
        )
    session.qemu_pid = given


async def vcpu_threads(session: QmpSession) -> list[int]:
    """The host thread ids of QEMU's vCPUs, as QEMU says (in its PID namespace)."""
    cpus = await session.execute("query-cpus-fast")
    return sorted({int(c["thread-id"]) for c in cpus if isinstance(c.get("thread-id"), int)})


def _owns(pid: int, threads: Sequence[int]) -> bool:
    """Whether every one of `threads` is a thread of process `pid` here (and there is one).
    `pid` must be a process, not one of its threads: /proc/TID/task lists the threads of
    TID's whole process."""
    return (
        pid > 0
        and bool(threads)
        and thread_group(pid) == pid
        and all(os.path.exists(f"/proc/{pid}/task/{t}") for t in threads)
    )


def thread_group(pid: int) -> int | None:
    """The process (thread group) thread `pid` belongs to (its Tgid), None when gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _peer_or_none(session: QmpSession) -> int | None:
    try:
        pid = qemu_pid(session)
    except DirectMemoryUnavailable:
        return None
    return pid


def _peer_not_qemu(peer: int, threads: Sequence[int]) -> str:
    return (
        f"the QMP socket's peer, pid {peer} ({process_name(peer)}), is not the QEMU behind it "
        f"(vCPU threads {_listed(threads)} are not its): through a proxy such as "
        "virt-qemu-qmp-proxy, give QEMU's pid with --pid, or use --libvirt DOMAIN"
    )


def process_name(pid: int) -> str:
    """The command name of process `pid` (/proc/PID/comm), or "gone"."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as stream:
            return stream.read().strip()
    except OSError:
        return "gone"


def _listed(threads: Sequence[int]) -> str:
    return ", ".join(map(str, threads[:4])) + (", …" if len(threads) > 4 else "") or "none"


def _session_socket(session: QmpSession) -> Any:
    return session.peer_socket()


def _peer_pid(sock: Any) -> int:
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError) as err:  # TCP, or a platform without SO_PEERCRED
        raise DirectMemoryUnavailable("the QMP socket tells no peer process") from err
    pid: int = _UCRED.unpack(data)[0]
    return pid


def _connect_for_pid(path: str) -> int:
    """Peer credentials from a connection of our own that never speaks QMP: the kernel
    fills them in at connect(), before QEMU accepts (it serves one client at a time)."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            return _peer_pid(sock)
    except OSError as err:
        raise DirectMemoryUnavailable(f"cannot ask {path} for QEMU's pid: {_reason(err)}") from err


async def _verify(session: QmpSession, physical: SegmentedMemory) -> None:
    """Each segment's first bytes must equal what QEMU's `xp` reads there."""
    for segment in physical.segments:
        try:
            agrees = await _agrees(session, physical, segment.start)
        except MemoryFault as err:
            raise DirectMemoryUnavailable(
                f"{physical.detail} has no guest RAM at {segment.start:#x} (not QEMU's?)"
            ) from err
        if not agrees:
            raise DirectMemoryUnavailable(
                f"{physical.detail} disagrees with QEMU at guest physical {segment.start:#x}"
            )


async def _agrees(session: QmpSession, physical: SegmentedMemory, address: int) -> bool:
    for _ in range(_VERIFY_ATTEMPTS):  # a running guest may write there while we compare
        direct = physical.read_physical(address, _VERIFY_BYTES)
        text = await session.hmp(f"xp /{_VERIFY_BYTES // 8}gx {address:#x}")
        if parse_hmp_words(text, address) == direct:
            return True
    return False


def _reason(err: Exception) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    return str(err)
