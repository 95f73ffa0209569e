"""Each guest process's executable file mappings, read from its kernel (guest/linux/maps.py)
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
has succeeded yet. It returns () too when the vCPU is in the middle of a context switch
(CR3 already holds another mm's page tables than `task`'s: mm->pgd, through the direct
map, is not CR3's): the files' pages would be read in the wrong process, so nothing is
read or kept (`stats.switching`), and the task's user frames stay unnamed. Raises only
what the memory backend raises (a QMP session's errors); a fault in guest memory ends
the walk and is counted, never raised.

Maps are kept per address space: CR3 without its PCID bits, and `process` (the tgid,
which the caller has from the adapter's label) when given, since a freed page directory
is soon another process's CR3. They are read again when the user PC (`user_pc`, else
the registers' PC in user mode) lies in no executable mapping the last read found
(anonymous ones count: JIT code), at most once per REREAD_INTERVAL_S per address
space, on an injected clock. With page-table isolation an address space has two CR3s
(user and kernel): each is kept on its own.

Memory is read by whole pages and kept for one walk, so the VMAs of one slab page cost
one read. `stats` counts walks, failed walks and reads.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from qmpprof.guest.adapter import OsAdapter
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import BuildIdRead, FileSource, MapsLayout, MapsWalk, maps_layout
from qmpprof.guest.loaded_elf import (
    LoadedHeaders,
    LoadedHeadersRead,
    Span,
    SparseBytes,
    file_symbols,
    loaded_image,
    loaded_module,
    page_numbers,
    section_names_span,
    symtab_spans,
    with_section_eh_frame,
)
from qmpprof.memory import MemoryReader
from qmpprof.model import FileMapping, RegisterSet
from qmpprof.modules import Module
from qmpprof.record.file_pages import FileBackedMemory, PageCache
from qmpprof.record.page_reader import PAGE_SIZE, UNREADABLE, PageReader
from qmpprof.symbols.elf import Symbol
from qmpprof.target.memory import MemoryBackend
from qmpprof.user_files import UserFiles

REREAD_INTERVAL_S = 1.0
#: Address spaces whose maps are kept before the cache starts over (a guest that starts
#: processes by the thousand; each is read again when next seen).
MAX_KNOWN = 4096
#: Pages asked for at once when reading a loaded file's tables (guest/loaded_elf.py).
IMAGE_CHUNK_PAGES = 16
#: CR3's address bits: the low 12 are PCID (or flags), the top bit is "no flush".
_CR3_ADDRESS = 0x000F_FFFF_FFFF_F000
#: The same without bit 12: with page-table isolation an mm's pgd is two pages, the
#: kernel's and (CR3 in user mode) the user's after it.
_PGD_PAIR = _CR3_ADDRESS & ~PAGE_SIZE


@dataclass(frozen=True)
class MapsRead:
    """One walk's answer: the executable file mappings, every executable range (file or
    not), the reads (page windows) it took, and whether the task had an mm at all;
    `sources`, one for each of `files`: its `struct file *` and VMAs (for the page
    cache; kept beside the FileMappings, which name a file, not a kernel object)."""

    files: tuple[FileMapping, ...]
    executable: tuple[tuple[int, int], ...]
    reads: int
    has_mm: bool
    sources: tuple[FileSource | None, ...] = ()
    #: The task's mm is not the one whose page tables CR3 holds (a context switch).
    switching: bool = False


async def read_maps(
    memory: MemoryBackend, vcpu: int, layout: MapsLayout, task: int, loaded: Loaded = None
) -> MapsRead | None:
    """The maps of `task` (running on `vcpu`); None when kernel memory the walk needed
    could not be read. `loaded(pgd)` says whether those page tables are CR3's: when not,
    the files' pages (their build-ids) are not read."""
    reader = PageReader(memory, vcpu)
    walk = MapsWalk(layout, task)
    files = await reader.run(walk.advance)
    if files is UNREADABLE:
        return None
    if loaded is not None and walk.pgd is not None and not await loaded(reader, walk.pgd):
        return MapsRead((), (), reader.reads, walk.has_mm, switching=True)
    found = []
    for mapped in files:
        build_id = None
        if mapped.header is not None:
            read = await reader.run(BuildIdRead(mapped.header, mapped.header_size).advance)
            build_id = None if read is UNREADABLE else read
        found.append(mapped.with_build_id(build_id))
    sources = tuple(mapped.source for mapped in files)
    return MapsRead(tuple(found), tuple(walk.executable), reader.reads, walk.has_mm, sources)


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
    #: Of those bytes, pages the process had not touched, read from the page cache.
    cached_pages: int = 0
    #: Walks of a task whose mm was not CR3's (a vCPU in the middle of a context switch).
    switching: int = 0


#: Says whether an mm's pgd is the page-table root CR3 holds (ProcessMaps._loaded_check).
Loaded = Callable[[PageReader, int], Awaitable[bool]] | None


@dataclass
class _Known:
    files: tuple[FileMapping, ...] | None
    executable: tuple[tuple[int, int], ...]
    read_at: float
    sources: tuple[FileSource | None, ...] = ()
    #: The task's mm was not the one CR3 held: kept, as a task's mm never is another
    #: CR3's, so that a vCPU seen mid context switch (or a nonblocking sample whose task
    #: changed after its registers were read) does not walk the maps at every sample.
    switching: bool = False


class ProcessMaps:
    """Keeps each address space's executable file mappings, read when first seen and
    again when its code runs where no known mapping is (see the module docstring)."""

    def __init__(
        self,
        layout: MapsLayout,
        memory: MemoryBackend,
        clock: Callable[[], float] = time.monotonic,
        page_cache: PageCache | None = None,
    ) -> None:
        """`page_cache`: where to find a file's pages its process never touched."""
        self._layout = layout
        self._memory = memory
        self._clock = clock
        self._page_cache = page_cache
        self._known: dict[tuple[int, int | None], _Known] = {}
        self.stats = MapsStats()

    @classmethod
    def of_guest(
        cls, types: KernelTypes | None, adapter: OsAdapter, memory: MemoryBackend
    ) -> ProcessMaps | None:
        """For a 64-bit Linux kernel whose vmlinux describes VMAs, files and dentries;
        else None (about 1 s of DWARF reading, once per vmlinux). The walkers read 8-byte
        pointers: a 32-bit kernel's processes are matched to `--user` files by their code
        instead (record/identify.py)."""
        if types is None or not isinstance(adapter, LinuxAdapter) or adapter.word != 8:
            return None
        layout = maps_layout(types)
        if layout is None:
            return None
        return cls(layout, memory, page_cache=PageCache.of_kernel(types, lambda: adapter.bias))

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
            done = await self._read(registers, task, known)
            if done is None:
                return ()
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            known = self._known[key] = done
        return () if known.switching else known.files

    def _stale(self, known: _Known) -> bool:
        return self._clock() - known.read_at >= REREAD_INTERVAL_S

    def _loaded_check(self, registers: RegisterSet) -> Loaded:
        """Whether an mm's pgd (a direct-map address) is what CR3 holds; None when the
        direct map's base is unknown (no page-cache layout: nothing is checked)."""
        cache = self._page_cache
        if cache is None:
            return None

        async def loaded(reader: PageReader, pgd: int) -> bool:
            base = await cache.direct_map(reader)
            return base is None or (pgd - base) & _PGD_PAIR == registers.cr3 & _PGD_PAIR

        return loaded

    async def _read(
        self, registers: RegisterSet, task: int, before: _Known | None
    ) -> _Known | None:
        """A new read of the maps; None for a task without an mm (nothing to keep), a
        `switching` one for a task whose mm is not loaded."""
        now = self._clock()
        loaded = self._loaded_check(registers)
        done = await read_maps(self._memory, registers.vcpu, self._layout, task, loaded)
        self.stats.walks += 1
        if done is not None and done.switching:
            self.stats.switching += 1
            return _Known(None, (), now, switching=True)
        if done is None:
            self.stats.failed += 1
            return _Known(before.files, before.executable, now) if before else _Known(None, (), now)
        self.stats.reads += done.reads
        self.stats.most_reads = max(self.stats.most_reads, done.reads)
        return _Known(done.files, done.executable, now, done.sources) if done.has_mm else None

    async def read_guest_copies(
        self, registers: RegisterSet, maps: tuple[FileMapping, ...], files: UserFiles
    ) -> bool:
        """For each file of `maps` (the task on `registers.vcpu`'s) with no host copy,
        read once: what its process has loaded of it (its .eh_frame and dynamic
        symbols, guest/loaded_elf.py), handed to `files` (UserFiles.add_guest_copy).
        Whether a file was added: an address space built before lacks it."""
        added = False
        sources = self._sources(registers, maps)
        for mapping, source in zip(maps, sources, strict=True):
            if not files.wants_guest_copy(mapping):
                continue
            memory = self._memory
            if source is not None and self._page_cache is not None:
                memory = FileBackedMemory(memory, registers.vcpu, source, self._page_cache)
            before = self._page_cache.pages if self._page_cache else 0
            module = await self._guest_copy(memory, registers.vcpu, mapping)
            self.stats.cached_pages += (self._page_cache.pages if self._page_cache else 0) - before
            files.add_guest_copy(mapping, module)
            added = True
        return added

    def _sources(
        self, registers: RegisterSet, maps: tuple[FileMapping, ...]
    ) -> tuple[FileSource | None, ...]:
        """The FileSources of `maps` as the read of this address space that found them
        has them; None each when no kept read did."""
        cr3 = registers.cr3 & _CR3_ADDRESS
        for (space, _), known in self._known.items():
            if space == cr3 and known.files == maps and len(known.sources) == len(maps):
                return known.sources
        return (None,) * len(maps)

    async def _guest_copy(
        self, memory: MemoryBackend, vcpu: int, mapping: FileMapping
    ) -> Module | None:
        self.stats.images += 1
        reader = PageReader(memory, vcpu)
        step = LoadedHeadersRead(mapping)
        headers = await reader.run(step.advance)
        if headers is UNREADABLE or headers is None:
            self.stats.images_failed += 1
            self.stats.image_bytes += reader.reads * PAGE_SIZE
            return None
        for add in step.more():
            added = await reader.run(_given(add, headers))
            headers = headers if added is UNREADABLE else added
        symbols: list[Symbol] = []
        if isinstance(memory, FileBackedMemory) and headers.section_headers is not None:
            sections = await _file_sparse(memory, headers.section_headers)
            headers = await _with_section_eh_frame(memory, headers, sections)
            symbols = await _file_symbols(memory, headers, sections)
        pieces = {span: await _sparse(memory, vcpu, span) for span in headers.spans()}
        image = loaded_image(headers, pieces, symbols)
        self.stats.image_bytes += reader.reads * PAGE_SIZE + image.bytes_read
        return loaded_module(mapping, headers, image)

    def forget(self) -> None:
        """Drop every address space's maps (a new connection: other processes)."""
        self._known.clear()
        if self._page_cache is not None:
            self._page_cache.forget()


async def _sparse(memory: MemoryBackend, vcpu: int, span: Span) -> SparseBytes:
    """`span` read in windows of IMAGE_CHUNK_PAGES; a page that cannot be read (one the
    process never touched, and not in the page cache) is a hole, stepped over."""
    pages: dict[int, bytes] = {}
    numbers = page_numbers(span)
    page, end = numbers.start, numbers.stop
    while page < end:
        count = min(IMAGE_CHUNK_PAGES, end - page)
        data = await memory.read_window(vcpu, page * PAGE_SIZE, count * PAGE_SIZE)
        whole = min(len(data) // PAGE_SIZE, count)
        for index in range(whole):
            pages[page + index] = data[index * PAGE_SIZE : (index + 1) * PAGE_SIZE]
        page += whole if whole == count else whole + 1
    return SparseBytes(span, pages)


async def _with_section_eh_frame(
    memory: FileBackedMemory, headers: LoadedHeaders, sections: SparseBytes
) -> LoadedHeaders:
    """`headers` with the `.eh_frame` the file's section header table (`sections`, in no
    mapping: from the page cache) places, a static program's, if its program headers
    gave none."""
    names = section_names_span(headers, sections)
    if headers.eh_frame is not None or names is None:
        return headers
    return with_section_eh_frame(headers, sections, await _file_sparse(memory, names))


async def _file_symbols(
    memory: FileBackedMemory, headers: LoadedHeaders, sections: SparseBytes
) -> list[Symbol]:
    """The functions of the file's own symbol table (`.symtab`, in no mapping), where the
    page cache has the pages of `sections` (its section header table) that place it and
    the pages that hold it."""
    spans = symtab_spans(sections)
    if spans is None:
        return []
    table, strings = spans
    return file_symbols(
        headers, await _file_sparse(memory, table), await _file_sparse(memory, strings)
    )


async def _file_sparse(memory: FileBackedMemory, span: Span) -> SparseBytes:
    """`span` (file offsets) from the page cache; a page it does not hold is a hole."""
    pages: dict[int, bytes] = {}
    for index in page_numbers(span):
        page = await memory.file_page(index)
        if page is not None:
            pages[index] = page
    return SparseBytes(span, pages)


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
