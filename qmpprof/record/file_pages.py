"""A guest file's pages as its process sees them, those it never touched included: read
through the process's page tables, and where a page is in none (Linux maps file pages
lazily), from the kernel's page cache (guest/linux/page_cache.py) when the process's
VMA of that address would show the file's page unchanged; and pages no VMA maps (where
the file keeps its symbol table) by their index in the file.

    cache = PageCache.of_kernel(kernel, slide=lambda: adapter.bias)   # None: no layout
    memory = FileBackedMemory(backend, vcpu, source, cache)           # a MemoryBackend

Only record/process_maps.py's reading of a file with no host copy uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.linux.maps import FileSource
from qmpprof.guest.linux.page_cache import (
    PAGE_SIZE,
    LinearBases,
    MemoryBases,
    PageCacheLayout,
    file_page,
    memory_bases,
    page_cache_layout,
)
from qmpprof.memory import MemoryReader
from qmpprof.model import RegisterSet
from qmpprof.record.page_reader import UNREADABLE, PageReader
from qmpprof.target.memory import MemoryBackend

#: Pages of one window (a read of the process's memory) taken from the page cache at most.
MAX_WINDOW_PAGES = 4096


class PageCache:
    """The kernel side: the layout, the two bases (read once per connection) and how
    many pages were found there."""

    def __init__(
        self, layout: PageCacheLayout, slide: Callable[[], int], fixed: LinearBases | None = None
    ) -> None:
        self.layout = layout
        self._slide = slide
        self._fixed = fixed
        self._bases: MemoryBases | None = None
        #: Pages found in the page cache, and page lookups that found none.
        self.pages = 0
        self.missed = 0

    @classmethod
    def of_kernel(
        cls, types: KernelTypes, slide: Callable[[], int], fixed: LinearBases | None = None
    ) -> PageCache | None:
        """`fixed`: the bases where the kernel has no variables for them (arm64)."""
        layout = page_cache_layout(types, fixed is not None)
        return None if layout is None else cls(layout, slide, fixed)

    def forget(self) -> None:
        """A new connection: the guest may have booted again (other bases)."""
        self._bases = None

    async def direct_map(self, reader: PageReader) -> int | None:
        """Where this boot's direct map of physical memory starts; None if unreadable."""
        bases = await self._memory_bases(reader)
        return None if bases is None else bases.direct_map

    async def page(self, reader: PageReader, source: FileSource, address: int) -> bytes | None:
        """The page at `address` (page-aligned) as the file's mapping there shows it,
        from the page cache; None when it is not there or not the file's page."""
        index = source.page_index(address)
        return None if index is None else await self.file_page(reader, source.file, index)

    async def file_page(self, reader: PageReader, file: int, index: int) -> bytes | None:
        """Page `index` of the file open at `file` (a `struct file *`) from the page
        cache, mapped or not; None when it is not there."""
        bases = await self._memory_bases(reader)
        if bases is None:
            return None
        layout = self.layout
        found = await reader.run(lambda m: file_page(m, layout, bases, file, index))
        data = b"" if found is None or found is UNREADABLE else await reader.read_page(found)
        if len(data) != PAGE_SIZE:
            self.missed += 1
            return None
        self.pages += 1
        return data

    async def _memory_bases(self, reader: PageReader) -> MemoryBases | None:
        """The two bases, read once per connection."""
        if self._bases is None:
            bases = await reader.run(self._read_bases)
            self._bases = None if bases is UNREADABLE else bases
        return self._bases

    def _read_bases(self, memory: MemoryReader) -> MemoryBases | None:
        if self._fixed is not None:
            return self._fixed.bases(self.layout.page_struct)
        return memory_bases(memory, self.layout, self._slide())


class FileBackedMemory:
    """A MemoryBackend over one file's mapping in one process: a window reads what the
    page tables map, then goes on in the page cache for as long as it has the pages."""

    name = "file-pages"
    through_monitor = False

    def __init__(
        self,
        memory: MemoryBackend,
        vcpu: int,
        source: FileSource,
        cache: PageCache,
        tables: bool = True,
    ) -> None:
        """Not `tables`: the page cache alone (the process is not the vCPU's)."""
        self._memory = memory
        self._tables = tables
        self._source = source
        self._cache = cache
        self._kernel = PageReader(memory, vcpu)

    def set_registers(self, registers: Sequence[RegisterSet]) -> None:
        """Nothing: the backend it wraps was given them for this tick."""

    async def read_window(self, cpu: int, address: int, size: int) -> bytes:
        data = await self._memory.read_window(cpu, address, size) if self._tables else b""
        at = address + len(data)
        if len(data) >= size or at % PAGE_SIZE:
            return data
        parts = [data]
        for _ in range(MAX_WINDOW_PAGES):
            if at >= address + size:
                break
            page = await self._cache.page(self._kernel, self._source, at)
            if page is None:
                break
            parts.append(page)
            at += PAGE_SIZE
        return b"".join(parts)[:size]

    async def file_page(self, index: int) -> bytes | None:
        """Page `index` of the file, mapped or not (its section headers and symbol table
        are in no mapping), from the page cache; None when it is not there."""
        return await self._cache.file_page(self._kernel, self._source.file, index)

    async def close(self) -> None:
        """Nothing: the backend it wraps is closed by its owner."""
