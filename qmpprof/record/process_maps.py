"""Each guest process's executable file mappings, read from its kernel (guest/linux_maps.py)
through the capture's memory backend, and kept per address space.

    maps = ProcessMaps.of_guest(kernel, adapter, memory)   # None: not Linux, or no DWARF
    found = await maps.maps_for(registers, task)           # while the VM is paused

`maps_for(registers, task, user_pc=None, process=None)` gives the executable file
mappings of the task at `task` (a task_struct's address: `LinuxAdapter.task_address`),
which must be the task running on `registers.vcpu`: its memory is read through that
vCPU's page tables (the kernel half is in every process's; the build-ids are in the
process's own half, so another process's task would get a wrong build-id). It returns a
tuple of FileMapping sorted by start, () for a task without an mm (a kernel thread,
which runs on a borrowed CR3: never kept), or None when no walk of that address space
has succeeded yet. Raises only what the memory backend raises (a QMP session's errors);
a fault in guest memory ends the walk and is counted, never raised.

Maps are kept per address space: CR3 without its PCID bits, and `process` (the tgid,
which the caller has from the adapter's label) when given, since a freed page directory
is soon another process's CR3. They are read again when the user PC (`user_pc`, else
the registers' PC in user mode) lies in no executable mapping the last read found
(anonymous ones count: [vdso], JIT code), at most once per REREAD_INTERVAL_S per address
space, on an injected clock. With page-table isolation an address space has two CR3s
(user and kernel): each is kept on its own.

Memory is read by whole pages and kept for one walk, so the VMAs of one slab page cost
one read. `stats` counts walks, failed walks and reads.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from qmpprof.errors import MemoryFault
from qmpprof.guest.adapter import OsAdapter
from qmpprof.guest.linux import LinuxAdapter
from qmpprof.guest.linux_maps import BuildIdRead, MapsLayout, MapsWalk, maps_layout
from qmpprof.guest.loaded_elf import (
    LoadedHeaders,
    LoadedHeadersRead,
    Span,
    SparseBytes,
    loaded_image,
    loaded_module,
    page_numbers,
)
from qmpprof.memory import MemoryReader
from qmpprof.model import FileMapping, RegisterSet
from qmpprof.modules import Module
from qmpprof.target.memory import MemoryBackend
from qmpprof.user_files import UserFiles

REREAD_INTERVAL_S = 1.0
#: Pages asked for at once when reading a loaded file's tables (guest/loaded_elf.py).
IMAGE_CHUNK_PAGES = 16
#: Pages read at most by one walk: 16 MiB, far more than a tree of MAX_VMAS entries
#: packed in slab pages takes; a hostile tree ends there, as a failed walk.
MAX_READS = 4096
PAGE_SIZE = 4096
#: CR3's address bits: the low 12 are PCID (or flags), the top bit is "no flush".
_CR3_ADDRESS = 0x000F_FFFF_FFFF_F000
T = TypeVar("T")


class PageMemory:
    """A MemoryReader over the guest pages read so far; reading any other faults."""

    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}

    def read(self, address: int, size: int) -> bytes:
        first, last = address // PAGE_SIZE, (address + size - 1) // PAGE_SIZE
        if size <= 0 or last - first > 1 or last >= (1 << 64) // PAGE_SIZE:
            raise MemoryFault(address, size)
        parts = [self.pages.get(page) for page in range(first, last + 1)]
        if any(part is None for part in parts):
            raise MemoryFault(address, size)
        data = b"".join(part for part in parts if part is not None)
        start = address % PAGE_SIZE
        return data[start : start + size]

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")


class PageReader:
    """Runs pure steps that raise MemoryFault (a walk's `advance`), satisfying each
    fault by reading whole pages through the backend with `vcpu`'s page tables; the
    pages are kept, so nothing is read twice."""

    def __init__(self, memory: MemoryBackend, vcpu: int) -> None:
        self._memory = memory
        self._vcpu = vcpu
        self.pages = PageMemory()
        self.reads = 0

    async def run(self, step: Callable[[MemoryReader], T]) -> T | _Unreadable:
        """`step`'s result, or UNREADABLE when memory it needs cannot be read (or the
        reads would pass MAX_READS)."""
        while True:
            try:
                return step(self.pages)
            except MemoryFault as fault:
                if not await self._fetch(fault):
                    return UNREADABLE

    async def _fetch(self, fault: MemoryFault) -> bool:
        first = fault.address // PAGE_SIZE * PAGE_SIZE
        size = -(-(fault.address + fault.size - first) // PAGE_SIZE) * PAGE_SIZE
        if self.reads >= MAX_READS or size > 2 * PAGE_SIZE or first + size > 1 << 64:
            return False
        self.reads += 1
        data = await self._memory.read_window(self._vcpu, first, size)
        for at in range(0, len(data) - PAGE_SIZE + 1, PAGE_SIZE):
            self.pages.pages[(first + at) // PAGE_SIZE] = data[at : at + PAGE_SIZE]
        return fault.address + fault.size <= first + len(data) // PAGE_SIZE * PAGE_SIZE


class _Unreadable(enum.Enum):
    UNREADABLE = enum.auto()


UNREADABLE = _Unreadable.UNREADABLE


@dataclass(frozen=True)
class MapsRead:
    """One walk's answer: the executable file mappings, every executable range (file or
    not), the reads (page windows) it took, and whether the task had an mm at all."""

    files: tuple[FileMapping, ...]
    executable: tuple[tuple[int, int], ...]
    reads: int
    has_mm: bool


async def read_maps(
    memory: MemoryBackend, vcpu: int, layout: MapsLayout, task: int
) -> MapsRead | None:
    """The maps of `task` (running on `vcpu`); None when kernel memory the walk needed
    could not be read."""
    reader = PageReader(memory, vcpu)
    walk = MapsWalk(layout, task)
    files = await reader.run(walk.advance)
    if files is UNREADABLE:
        return None
    found = []
    for mapped in files:
        build_id = None
        if mapped.header is not None:
            read = await reader.run(BuildIdRead(mapped.header, mapped.header_size).advance)
            build_id = None if read is UNREADABLE else read
        found.append(mapped.with_build_id(build_id))
    return MapsRead(tuple(found), tuple(walk.executable), reader.reads, walk.has_mm)


@dataclass
class MapsStats:
    """For the summary: walks done, walks that failed, and reads (page windows)."""

    walks: int = 0
    failed: int = 0
    reads: int = 0
    most_reads: int = 0
    #: Files with no host copy read from the guest's memory, those that gave nothing,
    #: and the bytes read for them.
    images: int = 0
    images_failed: int = 0
    image_bytes: int = 0


@dataclass
class _Known:
    files: tuple[FileMapping, ...] | None
    executable: tuple[tuple[int, int], ...]
    read_at: float


class ProcessMaps:
    """Keeps each address space's executable file mappings, read when first seen and
    again when its code runs where no known mapping is (see the module docstring)."""

    def __init__(
        self,
        layout: MapsLayout,
        memory: MemoryBackend,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._layout = layout
        self._memory = memory
        self._clock = clock
        self._known: dict[tuple[int, int | None], _Known] = {}
        self.stats = MapsStats()

    @classmethod
    def of_guest(
        cls, kernel: Module | None, adapter: OsAdapter, memory: MemoryBackend
    ) -> ProcessMaps | None:
        """For a Linux kernel whose vmlinux describes VMAs, files and dentries; else None
        (about 1 s of DWARF reading, once per vmlinux)."""
        if kernel is None or not isinstance(adapter, LinuxAdapter):
            return None
        layout = maps_layout(kernel.path)
        return None if layout is None else cls(layout, memory)

    async def maps_for(
        self,
        registers: RegisterSet,
        task: int,
        user_pc: int | None = None,
        process: int | None = None,
    ) -> tuple[FileMapping, ...] | None:
        """The mappings of `task`, running on `registers.vcpu` (module docstring)."""
        key = (registers.cr3 & _CR3_ADDRESS, process)
        known = self._known.get(key)
        pc = user_pc if user_pc is not None else registers.rip if registers.cpl == 3 else None
        if known is None or (self._stale(known) and not _runs_known(known, pc)):
            known = await self._read(registers.vcpu, task, known)
            if known is None:
                return ()
            self._known[key] = known
        return known.files

    def _stale(self, known: _Known) -> bool:
        return self._clock() - known.read_at >= REREAD_INTERVAL_S

    async def _read(self, vcpu: int, task: int, before: _Known | None) -> _Known | None:
        """A new read of the maps; None for a task without an mm (nothing to keep)."""
        now = self._clock()
        done = await read_maps(self._memory, vcpu, self._layout, task)
        self.stats.walks += 1
        if done is None:
            self.stats.failed += 1
            return _Known(before.files, before.executable, now) if before else _Known(None, (), now)
        self.stats.reads += done.reads
        self.stats.most_reads = max(self.stats.most_reads, done.reads)
        return _Known(done.files, done.executable, now) if done.has_mm else None

    async def read_guest_copies(
        self, registers: RegisterSet, maps: tuple[FileMapping, ...], files: UserFiles
    ) -> bool:
        """For each file of `maps` (the task on `registers.vcpu`'s) with no host copy,
        read once: what its process has loaded of it (its .eh_frame and dynamic
        symbols, guest/loaded_elf.py), handed to `files` (UserFiles.add_guest_copy).
        Whether a file was added: an address space built before lacks it."""
        added = False
        for mapping in maps:
            if not files.wants_guest_copy(mapping):
                continue
            module = await self._guest_copy(registers.vcpu, mapping)
            files.add_guest_copy(mapping, module)
            added = True
        return added

    async def _guest_copy(self, vcpu: int, mapping: FileMapping) -> Module | None:
        self.stats.images += 1
        reader = PageReader(self._memory, vcpu)
        step = LoadedHeadersRead(mapping)
        headers = await reader.run(step.advance)
        if headers is UNREADABLE or headers is None:
            self.stats.images_failed += 1
            self.stats.image_bytes += reader.reads * PAGE_SIZE
            return None
        for add in step.more():
            added = await reader.run(_given(add, headers))
            headers = headers if added is UNREADABLE else added
        pieces = {span: await self._sparse(vcpu, span) for span in headers.spans()}
        image = loaded_image(headers, pieces)
        self.stats.image_bytes += reader.reads * PAGE_SIZE + image.bytes_read
        return loaded_module(mapping, headers, image)

    async def _sparse(self, vcpu: int, span: Span) -> SparseBytes:
        """`span` read in windows of IMAGE_CHUNK_PAGES; a page that cannot be read (one
        the process never touched) is a hole, stepped over."""
        pages: dict[int, bytes] = {}
        numbers = page_numbers(span)
        page, end = numbers.start, numbers.stop
        while page < end:
            count = min(IMAGE_CHUNK_PAGES, end - page)
            data = await self._memory.read_window(vcpu, page * PAGE_SIZE, count * PAGE_SIZE)
            whole = min(len(data) // PAGE_SIZE, count)
            for index in range(whole):
                pages[page + index] = data[index * PAGE_SIZE : (index + 1) * PAGE_SIZE]
            page += whole if whole == count else whole + 1
        return SparseBytes(span, pages)

    def forget(self) -> None:
        """Drop every address space's maps (a new connection: other processes)."""
        self._known.clear()


def _given(
    step: Callable[[MemoryReader, LoadedHeaders], LoadedHeaders], headers: LoadedHeaders
) -> Callable[[MemoryReader], LoadedHeaders]:
    return lambda memory: step(memory, headers)


def _runs_known(known: _Known, pc: int | None) -> bool:
    """Whether the last read succeeded and `pc` is none to check, or lies in an
    executable range it found."""
    if known.files is None:
        return False
    return pc is None or any(start <= pc < end for start, end in known.executable)
