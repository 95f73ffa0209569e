"""Each guest process's executable file mappings, read from its kernel (guest/linux/maps.py)
through the capture's memory backend, and kept per address space.

    maps = ProcessMaps.of_guest(kernel, adapter, memory)   # None: not Linux, or no DWARF
    found = await maps.maps_for(registers, task)           # while the VM is paused

`maps_for(registers, task, user_pcs=(), process=None)` gives the executable file
mappings of the task at `task` (a task_struct's address: `LinuxAdapter.task_address`),
which must be the task running on `registers.vcpu`: its memory is read through that
vCPU's page tables (the kernel half is in every process's; the build-ids are in the
process's own half, so another process's task would get a wrong build-id). It returns a
tuple of FileMapping sorted by start, () for a task without an mm (a kernel thread,
which runs on a borrowed CR3: never kept), or None when no walk of that address space
has succeeded yet. A process past exit_mm still has user frames in the samples of its
exit: while exit_mmap tears its mm down (task->active_mm, no users left) that mm is
walked; after, it keeps the maps it had. It returns () too when the vCPU is in the
middle of a context switch (CR3 already holds another mm's page tables than `task`'s:
mm->pgd, through the direct map, is not CR3's): the files' pages would be read in the
wrong process, so nothing is read or kept (`stats.switching`); only the first user pc
(the task's own pt_regs) is named, from the history below. Raises only what the memory
backend raises (a QMP session's errors); a fault in guest memory ends the walk and is
counted, never raised.

Each process (tgid) also keeps a history of its earlier maps (record/process_history.py):
a user pc the current maps do not hold but an earlier one does is named by that mapping
(`stats.from_history`), as perf names samples inside execve and after exit_mmap. A
process whose history starts gets its parent's maps (task->real_parent), walked from the
child's vCPU when no walk saw them.

Maps are kept per address space: CR3 without its PCID bits, and `process` (the tgid,
which the caller has from the adapter's label) when given, since a freed page directory
is soon another process's CR3. They are read again when a user PC (`user_pcs`, the
stack's user frames, else the registers' PC in user mode) lies in no executable
mapping the last read found (anonymous ones count: JIT code): at once, up to
PROMPT_WALKS walks per address space in a REREAD_INTERVAL_S, since a process caught
during its exec or while ld.so maps its libraries has its first walk before they are
mapped (a shell script's or a build's processes live for less than a second), though
not for a page of code walks found nothing at already (an exec's samples still hold
the registers of the program that called execve); beyond that, and after a walk that
found the task mid context switch, once per REREAD_INTERVAL_S; on an injected clock. In
an address space's first REREAD_INTERVAL_S every sample walks again, LOADING_WALKS at
most (not counted in PROMPT_WALKS), its pcs in known code or not: ld.so runs most of a
short-lived program's life, after it mapped libc, and the program's exit is named only
by a walk made since. A
walk that fails is tried again at once (WALK_TRIES). With page-table isolation an
address space has two CR3s (user and kernel): each is kept on its own.

Memory is read by whole pages and kept for one walk, so the VMAs of one slab page cost
one read. `stats` counts walks, failed walks and reads.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from qmpprof.guest.adapter import OsAdapter
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import (
    BuildIdRead,
    FileSource,
    MappedFile,
    MapsLayout,
    MapsWalk,
    maps_layout,
    parent_read,
)
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
from qmpprof.record.process_history import ProcessHistory
from qmpprof.symbols.elf import Symbol
from qmpprof.target.memory import MemoryBackend
from qmpprof.user_files import UserFiles

REREAD_INTERVAL_S = 1.0
#: Walks of one address space in one REREAD_INTERVAL_S that a user PC outside its known
#: code may ask for at once: a new process's program, ld.so, its libraries, a dlopen.
PROMPT_WALKS = 8
#: Walks of a new address space whose known code holds its pcs (_loading), at most.
LOADING_WALKS = 8
#: Walks in a row when one fails: after the VM resumed (a copied sample's), a process
#: that is mapping its files can change its VMAs under a walk.
WALK_TRIES = 2
#: Pages of PCs outside every mapping kept per address space (garbage PCs of torn
#: samples would otherwise grow it without end).
MAX_MISSED = 64
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
    #: The process id (tgid) of the task's parent, and its task (None: unknown).
    parent: int | None = None
    parent_task: int | None = None


async def read_maps(
    memory: MemoryBackend,
    vcpu: int,
    layout: MapsLayout,
    task: int,
    loaded: Loaded = None,
    file_memory: FileMemory = None,
    known_ids: KnownIds | None = None,
) -> MapsRead | None:
    """The maps of `task` (running on `vcpu`); None when kernel memory the walk needed
    could not be read. `loaded(pgd)` says whether those page tables are CR3's: when not,
    the files' pages (their build-ids) are not read. `file_memory(source)`: the
    process's memory with that file's pages it never touched read from the page cache,
    for a build-id its page tables do not map yet (a process still being exec'd).
    `known_ids`: build-ids an earlier walk of this mm read, by the mapping's `struct
    file *` and start (the same open file: the same bytes), not read again."""
    reader = PageReader(memory, vcpu)
    walk = MapsWalk(layout, task)
    files = await reader.run(walk.advance)
    if files is UNREADABLE:
        return None
    if loaded is not None and walk.pgd is not None and not await loaded(reader, walk.pgd):
        return MapsRead((), (), reader.reads, walk.has_mm, switching=True)
    found = await _with_build_ids(reader, vcpu, files, file_memory, known_ids=known_ids or {})
    sources = tuple(mapped.source for mapped in files)
    parent = await reader.run(parent_read(layout, task)) if walk.has_mm or walk.exiting else None
    parent_task, tgid = (None, None) if parent is UNREADABLE or parent is None else parent
    executable, has_mm = tuple(walk.executable), walk.has_mm
    return MapsRead(found, executable, reader.reads, has_mm, sources, False, tgid, parent_task)


async def _with_build_ids(
    reader: PageReader,
    vcpu: int,
    files: Sequence[MappedFile],
    file_memory: FileMemory,
    tables: bool = True,
    known_ids: KnownIds | None = None,
) -> tuple[FileMapping, ...]:
    """`files` with their build-ids: read through the vCPU's page tables (unless not
    `tables`), else through `file_memory` (the page cache) where they do not map it;
    those of `known_ids` as they are there (read_maps)."""
    found = []
    for mapped in files:
        build_id = None
        key = None if mapped.source is None else (mapped.source.file, mapped.start)
        if key is not None and known_ids and key in known_ids:
            build_id = known_ids[key]
        elif mapped.header is not None:
            step = BuildIdRead(mapped.header, mapped.header_size)
            read = await reader.run(step.advance) if tables else UNREADABLE
            if read is UNREADABLE and file_memory is not None and mapped.source is not None:
                cached = PageReader(file_memory(mapped.source), vcpu)
                read = await cached.run(BuildIdRead(mapped.header, mapped.header_size).advance)
                reader.reads += cached.reads
            build_id = None if read is UNREADABLE else read
        found.append(mapped.with_build_id(build_id))
    return tuple(found)


async def read_parent_maps(
    memory: MemoryBackend, vcpu: int, layout: MapsLayout, parent: int, cache: PageCache | None
) -> tuple[tuple[FileMapping, ...] | None, int]:
    """The file mappings of the task at `parent`, which does not run on `vcpu` (its
    VMAs are kernel memory): build-ids from the page cache only, never through the
    vCPU's page tables, which are another mm's (none without `cache`); None when its
    kernel memory could not be read. With the reads it took."""
    reader = PageReader(memory, vcpu)
    files = await reader.run(MapsWalk(layout, parent).advance)
    if files is UNREADABLE:
        return None, reader.reads

    def page_cache_only(source: FileSource) -> MemoryBackend:
        assert cache is not None
        return FileBackedMemory(memory, vcpu, source, cache, tables=False)

    file_memory = None if cache is None else page_cache_only
    return await _with_build_ids(reader, vcpu, files, file_memory, tables=False), reader.reads


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
    #: Samples whose user PCs only the process's earlier maps hold (ProcessMaps.earlier).
    from_history: int = 0


#: Build-ids a walk read, by the mapping's `struct file *` and start (read_maps).
KnownIds = dict[tuple[int, int], bytes | None]
#: Says whether an mm's pgd is the page-table root CR3 holds (ProcessMaps._loaded_check).
Loaded = Callable[[PageReader, int], Awaitable[bool]] | None
#: A process's memory with one file's pages read from the page cache where its page
#: tables have none (record/file_pages.py).
FileMemory = Callable[[FileSource], MemoryBackend] | None


@dataclass
class _Known:
    files: tuple[FileMapping, ...] | None
    executable: tuple[tuple[int, int], ...]
    read_at: float
    #: When the first walk of this REREAD_INTERVAL_S was, and the walks since (it included).
    since: float
    walks: int
    #: Pages (numbers) of user PCs that walks found no code at (ProcessMaps._walk_again).
    missed: frozenset[int] = frozenset()
    sources: tuple[FileSource | None, ...] = ()
    #: The task's mm was not the one CR3 held: kept, as a task's mm never is another
    #: CR3's, so that a vCPU seen mid context switch (or a nonblocking sample whose task
    #: changed after its registers were read) does not walk the maps at every sample.
    switching: bool = False
    #: When this address space was first walked (its process may be loading its files),
    #: and the walks since that only _loading asked for.
    born: float = 0.0
    eager: int = 0
    #: Each executable range's start, for _in_code's search.
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.starts = tuple(start for start, _ in self.executable)

    def file_sources(self) -> dict[FileMapping, FileSource | None] | None:
        """Each file the walk found, with its FileSource (None for a mapping of no file:
        the vDSO); None when the walk kept no sources for them."""
        if self.files is None or len(self.sources) != len(self.files):
            return None
        return dict(zip(self.files, self.sources, strict=True))


class _Walk(Enum):
    """Whether maps_for walks an address space again, and why."""

    NO = 0
    LOADING = 1  # new, its code holding the pcs: _loading
    NEEDED = 2  # none walked yet, or a pc outside its known code


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
        self._history = ProcessHistory()
        #: Files with no host copy whose last read from the guest found nothing or part
        #: of them: in which address space (read_guest_copies).
        self._copy_tried_in: dict[tuple[str, bytes | None], int] = {}
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
        cache = PageCache.of_kernel(types, lambda: adapter.bias, adapter.linear_bases)
        return cls(layout, memory, page_cache=cache)

    async def maps_for(
        self,
        registers: RegisterSet,
        task: int,
        user_pcs: Sequence[int] = (),
        process: int | None = None,
        eager: bool = True,
        later: bool = False,
    ) -> tuple[FileMapping, ...] | None:
        """The mappings of `task`, running on `registers.vcpu` (module docstring). Not
        `eager`: no walk of a new address space whose code holds `user_pcs` (_loading).
        `later`: the VM ran since the sample; such a walk that finds the task's mm is no
        longer CR3's (its process exec'd) or none (it exited) keeps what was known."""
        key = (registers.cr3 & _CR3_ADDRESS, process)
        known = self._known.get(key)
        if not user_pcs and registers.cpl == 3:
            user_pcs = (registers.rip,)
        outside = user_pcs if known is None else _outside(known, user_pcs)
        why = _Walk.NEEDED if known is None else self._walk_again(known, outside, eager)
        if known is None or why is not _Walk.NO:
            done = await self._read(registers, task, known, process, why is _Walk.LOADING)
            if done is None:
                return self._earlier(process, None, user_pcs) or ()
            moved_on = done.switching or done.files is None
            if known is not None and why is _Walk.LOADING and later and moved_on:
                done = replace(known, eager=done.eager)
            if len(self._known) >= MAX_KNOWN:
                self._known.clear()
            known = self._known[key] = _with_missed(done, user_pcs, known)
            outside = _outside(known, user_pcs)
        if known.switching:  # only the first user pc, from the task's own pt_regs
            return self._earlier(process, (), user_pcs[:1]) or ()
        return self._earlier(process, known.files, outside) or known.files

    def would_walk(self, registers: RegisterSet, pcs: Sequence[int], process: int | None) -> bool:
        """Whether `maps_for` (not `eager`) would walk the address space for `pcs` now."""
        known = self._known.get((registers.cr3 & _CR3_ADDRESS, process))
        if known is None:
            return True
        return self._walk_again(known, _outside(known, pcs), eager=False) is not _Walk.NO

    def _earlier(
        self, process: int | None, files: tuple[FileMapping, ...] | None, pcs: Sequence[int]
    ) -> tuple[FileMapping, ...] | None:
        """`files` with the mappings of the process's earlier maps that hold `pcs`
        (ProcessHistory.holding); None when they hold none."""
        found = self._history.holding(process, files, pcs)
        self.stats.from_history += found is not None
        return found

    async def _unseen_parent(
        self, registers: RegisterSet, process: int | None, done: MapsRead
    ) -> tuple[FileMapping, ...]:
        """The maps of the parent of a process whose history starts, walked now when no
        walk saw them (a child seen first inside its exec, its parent not sampled yet:
        the recording's start, a shell waiting for its children)."""
        parent, task = done.parent, done.parent_task
        if process is None or parent is None or task is None or self._history.knows(parent):
            return ()
        if not self._history.starts(process, parent):
            return ()
        vcpu = registers.vcpu
        files, reads = await read_parent_maps(
            self._memory, vcpu, self._layout, task, self._page_cache
        )
        self.stats.walks += 1
        self.stats.failed += files is None
        self.stats.reads += reads
        return files or ()

    def _walk_again(self, known: _Known, outside: Sequence[int], eager: bool = True) -> _Walk:
        """Whether an address space is walked again now, and why (module docstring), for
        the user pcs `outside` its known code: not when there are none, unless `eager`
        and it is new (_loading). A page of code the last walks did not find either (the
        program that called execve, whose registers an exec's samples still hold) waits
        for the next REREAD_INTERVAL_S."""
        now = self._clock()
        if known.files is not None and not outside:
            return _Walk.LOADING if eager and _loading(known, now) else _Walk.NO
        if now - known.read_at >= REREAD_INTERVAL_S:
            return _Walk.NEEDED
        if known.switching:
            return _Walk.NO
        if known.walks >= PROMPT_WALKS and now - known.since < REREAD_INTERVAL_S:
            return _Walk.NO
        missed = all(pc // PAGE_SIZE in known.missed for pc in outside)
        return _Walk.NO if missed else _Walk.NEEDED

    def _file_memory(self, registers: RegisterSet) -> FileMemory:
        cache = self._page_cache
        if cache is None:
            return None
        return lambda source: FileBackedMemory(self._memory, registers.vcpu, source, cache)

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
        self,
        registers: RegisterSet,
        task: int,
        before: _Known | None,
        process: int | None,
        loading: bool = False,
    ) -> _Known | None:
        """A new read of the maps; None for a task without an mm (nothing to keep) that
        had none `before`, a `switching` one for a task whose mm is not loaded. A read
        that found the files is remembered in the history of `process`. `loading`: a
        walk of a new address space (_loading), counted apart from PROMPT_WALKS."""
        now = self._clock()
        loaded = self._loaded_check(registers)
        file_memory = self._file_memory(registers)
        for _ in range(WALK_TRIES):
            done = await read_maps(
                *(self._memory, registers.vcpu, self._layout, task, loaded, file_memory),
                known_ids=_known_ids(before),
            )
            self.stats.walks += 1
            if done is not None:
                break
            self.stats.failed += 1
        if before is not None and now - before.since < REREAD_INTERVAL_S:
            since, walks = before.since, before.walks + (not loading)
        else:
            since, walks = now, int(not loading)
        born, eager = (now, 0) if before is None else (before.born, before.eager)
        eager += loading
        if done is not None and done.switching:
            self.stats.switching += 1
            return _Known(None, (), now, since, walks, switching=True, born=born, eager=eager)
        if done is None:
            if before is None:
                return _Known(None, (), now, since, walks, born=born, eager=eager)
            return replace(
                before, read_at=now, since=since, walks=walks, switching=False, eager=eager
            )
        self.stats.reads += done.reads
        self.stats.most_reads = max(self.stats.most_reads, done.reads)
        if not done.has_mm and not done.files:  # past exit_mm: it keeps the maps it had
            if before is None:
                return None
            return replace(before, read_at=now, since=since, walks=walks, eager=eager)
        if process is not None:
            inherited = await self._unseen_parent(registers, process, done)
            self._history.remember(process, done.parent, done.files, inherited)
        files, executable = done.files, done.executable
        sources = done.sources
        return _Known(files, executable, now, since, walks, sources=sources, born=born, eager=eager)

    async def read_guest_copies(
        self, registers: RegisterSet, maps: tuple[FileMapping, ...], files: UserFiles
    ) -> bool:
        """For each file of `maps` (the task on `registers.vcpu`'s) with no host copy,
        read once: what its process has loaded of it (its .eh_frame and dynamic
        symbols, guest/loaded_elf.py), handed to `files` (UserFiles.add_guest_copy).
        A read that found nothing or part of the file is tried again in another
        address space only (the process may have been exiting, or still being
        exec'd). Mappings from the process's earlier maps (ProcessMaps._earlier) are
        not this address space's to read. Whether a file was added: an address space
        built before lacks it."""
        added = False
        sources = self._sources(registers, maps)
        if sources is None and self._page_cache is not None:
            return False  # wait for a walk that has their VMAs: a copy would lack pages
        space = registers.cr3 & _CR3_ADDRESS
        file_memory = self._file_memory(registers)
        for mapping, source in (sources or dict.fromkeys(maps)).items():
            key = (mapping.path, mapping.build_id)
            if self._copy_tried_in.get(key) == space or not files.wants_guest_copy(mapping):
                continue
            if source is None and mapping.build_id is None:
                continue  # the vDSO before its process touched it: nothing to read yet
            memory = self._memory
            if source is not None and file_memory is not None:
                memory = file_memory(source)
            before = self._page_cache.pages if self._page_cache else 0
            module, whole = await self._guest_copy(memory, registers.vcpu, mapping)
            self.stats.cached_pages += (self._page_cache.pages if self._page_cache else 0) - before
            files.add_guest_copy(mapping, module, whole)
            if module is None or not whole:
                if len(self._copy_tried_in) >= MAX_KNOWN:
                    self._copy_tried_in.clear()
                self._copy_tried_in[key] = space
            added = True
        return added

    def _sources(
        self, registers: RegisterSet, maps: tuple[FileMapping, ...]
    ) -> dict[FileMapping, FileSource | None] | None:
        """Each mapping of `maps` that the kept read of this address space found, with
        its FileSource as that read has it (None for a mapping of no file: the vDSO);
        None when no kept read found them. The others (from the process's earlier maps)
        are left out."""
        cr3, wanted = registers.cr3 & _CR3_ADDRESS, set(maps)
        found: dict[FileMapping, FileSource | None] | None = None
        for (space, _), known in self._known.items():
            sources = known.file_sources() if space == cr3 else None
            if sources is None or not wanted.issuperset(sources):
                continue
            if found is None or len(sources) > len(found):
                found = sources
        return found

    async def _guest_copy(
        self, memory: MemoryBackend, vcpu: int, mapping: FileMapping
    ) -> tuple[Module | None, bool]:
        """The file's module read from the guest (None: nothing usable), and whether
        every table it reads was read whole."""
        self.stats.images += 1
        reader = PageReader(memory, vcpu)
        step = LoadedHeadersRead(mapping)
        headers = await reader.run(step.advance)
        if headers is UNREADABLE or headers is None:
            self.stats.images_failed += 1
            self.stats.image_bytes += reader.reads * PAGE_SIZE
            return None, False
        whole = True
        for add in step.more():
            added = await reader.run(_given(add, headers))
            whole = whole and added is not UNREADABLE
            headers = headers if added is UNREADABLE else added
        symbols: list[Symbol] = []
        if isinstance(memory, FileBackedMemory) and headers.section_headers is not None:
            sections = await _file_sparse(memory, headers.section_headers)
            headers = await _with_section_eh_frame(memory, headers, sections)
            symbols = await _file_symbols(memory, headers, sections)
        pieces = {span: await _sparse(memory, vcpu, span) for span in headers.spans()}
        image = loaded_image(headers, pieces, symbols)
        self.stats.image_bytes += reader.reads * PAGE_SIZE + image.bytes_read
        whole = whole and all(piece.whole() for piece in pieces.values())
        return loaded_module(mapping, headers, image), whole

    def forget(self) -> None:
        """Drop every address space's maps (a new connection: other processes)."""
        self._known.clear()
        self._history.clear()
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


def _known_ids(known: _Known | None) -> KnownIds:
    """The build-ids a kept walk read that it found (None is not kept: a header not
    mapped then may be now), by each mapping's `struct file *` and start."""
    sources = known.file_sources() if known is not None else None
    return {
        (source.file, mapping.start): mapping.build_id
        for mapping, source in (sources or {}).items()
        if source is not None and mapping.build_id is not None
    }


def _loading(known: _Known, now: float) -> bool:
    """Whether an address space first walked less than REREAD_INTERVAL_S ago is walked
    again though its code holds every pc: its process may still be mapping its files.
    ld.so runs most of a short-lived program's life, relocating it and libc, which it
    mapped after the first walk; the exit, once its maps are gone, is named only by a
    walk made since. LOADING_WALKS at most, apart from PROMPT_WALKS (a library mapped
    later is still walked for)."""
    young = now - known.born < REREAD_INTERVAL_S
    return young and not known.switching and known.eager < LOADING_WALKS


def _outside(known: _Known, pcs: Sequence[int]) -> list[int]:
    """The pcs in no executable range the walk found."""
    return [pc for pc in pcs if not _in_code(known, pc)]


def _in_code(known: _Known, pc: int) -> bool:
    """Whether `pc` lies in an executable range the walk found (or just past one: a
    return address after a mapping's last call). The ranges are VMAs, by start: the one
    that starts last at or below `pc` is the only one that can hold it (this runs for
    every user frame of every sample)."""
    at = bisect_right(known.starts, pc) - 1
    return at >= 0 and pc <= known.executable[at][1]


def _with_missed(known: _Known, pcs: Sequence[int], before: _Known | None) -> _Known:
    """`known` with the pages of `pcs` it has no code at added to those missed before
    (MAX_MISSED pages at most: more start over)."""
    missed = {pc // PAGE_SIZE for pc in _outside(known, pcs)}
    if before is not None and len(before.missed) + len(missed) <= MAX_MISSED:
        missed |= before.missed
    return replace(known, missed=frozenset(missed))
