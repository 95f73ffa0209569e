"""Record what tests/unit/test_linux_page_cache.py reads: `python -m
tests.unit.data.linux.record_page_cache` (from the repository root, after `make -C
examples/linux`; GDB is needed).

For each kernel the tests boot (Debian 12's 6.1, backports' 6.12, bullseye's 5.10; or
those named as arguments, the others' records kept), it boots the Linux
example guest running dynwork (KASLR on), catches dynwork in user mode on a vCPU, reads
its maps there (record/process_maps.py, memory backend `hmp`) and, for every page of
libc's .eh_frame, looks the page up in the page cache as record does
(guest/linux/page_cache.py). Saved to page_cache.json:

- GDB's offsets and sizes the walk uses (struct page's members before folios, 5.10),
  the variables' link addresses, its ptype of struct xa_node;
- the guest's sysroot (its release's libc: the oracle's bytes);
- the kernel's slide, libc's struct file and VMAs (FileSource), and each page: its
  address in the process, whether the process's page tables map it, and the SHA-256 of
  the 4096 bytes at the direct-map address the walk gave (the oracle is the sysroot's
  libc: the same bytes at the same file offset);
- the bytes each read of the walk returned (exactly what it asked for).

Re-record when the kernel, QEMU or the guest's libc change, and read the diff.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.maps import FileSource, maps_layout
from qmpprof.guest.linux.page_cache import (
    PageCacheLayout,
    file_page,
    memory_bases,
    page_cache_layout,
)
from qmpprof.guest.loaded_elf import LoadedHeaders, LoadedHeadersRead, page_numbers
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import RegisterSet
from qmpprof.record.page_reader import UNREADABLE, PageReader
from qmpprof.record.process_maps import read_maps
from qmpprof.target.memory import MemoryBackend
from tests.linux_tasks import catch_running
from tests.linux_vm import LinuxGuest, mapped_path, running_linux, started_pids
from tests.unit.data.linux.record_maps import (
    Recorded,
    RecordingBackend,
    gdb_output,
    record_kernels,
)

OUT = Path(__file__).with_name("page_cache.json")
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
ROOT = Path(__file__).parents[4]
#: GDB expressions for PageCacheLayout's fields, in its order.
GDB_LAYOUT = (
    "(long)&((struct file *)0)->f_mapping",
    "(long)&((struct address_space *)0)->i_pages.xa_head",
    "(long)&((struct folio *)0)->mapping",
    "(long)&((struct folio *)0)->index",
    "(long)sizeof(struct page)",
    "(long)&vmemmap_base",
    "(long)&page_offset_base",
)


def gdb(vmlinux: Path) -> dict[str, Any]:
    """GDB's PageCacheLayout; before folios (5.10) struct page's members."""
    folios = "$1 = " in gdb_output(vmlinux, ["-ex", "print sizeof(struct folio)"])
    expressions = [e if folios else e.replace("struct folio", "struct page") for e in GDB_LAYOUT]
    commands = []
    for expression in expressions:
        commands += ["-ex", f"print {expression}"]
    commands += ["-ex", "print (long)&((struct vm_area_struct *)0)->anon_vma"]
    commands += ["-ex", "ptype/o struct xa_node"]
    out = gdb_output(vmlinux, commands)
    values = [int(v) for v in re.findall(r"^\$\d+ = (-?\d+)$", out, re.MULTILINE)]
    assert len(values) == len(GDB_LAYOUT) + 1, out
    layout = [v % (1 << 64) for v in values[:-1]]
    return {"layout": layout, "anon_vma": values[-1], "ptype": out[out.index("/* offset") :]}


async def record_libc(
    memory: MemoryBackend, registers: RegisterSet, task: int, guest: LinuxGuest, slide: int
) -> dict[str, Any]:
    vcpu, vmlinux = registers.vcpu, guest.kernel
    layout = page_cache_layout(ElfTypes(vmlinux))
    maps = maps_layout(ElfTypes(vmlinux))
    assert layout is not None and maps is not None
    done = await read_maps(memory, vcpu, maps, task)
    assert done is not None
    libc = mapped_path(guest.sysroot, LIBC)
    at = next(i for i, m in enumerate(done.files) if m.path == libc)
    mapping, source = done.files[at], done.sources[at]
    assert source is not None
    step = LoadedHeadersRead(mapping)
    reader = PageReader(memory, vcpu)
    first = await reader.run(step.advance)
    assert isinstance(first, LoadedHeaders)
    headers = await reader.run(lambda m: step.with_eh_frame(m, first))
    assert isinstance(headers, LoadedHeaders) and headers.eh_frame is not None
    pages = [page * 4096 for page in page_numbers(headers.eh_frame)]
    mapped = [len(await memory.read_window(vcpu, page, 4096)) == 4096 for page in pages]
    kernel = await look_up(memory, vcpu, layout, slide, source, pages)
    return {
        "sysroot": str(guest.sysroot.relative_to(ROOT)),
        "slide": slide,
        "source": [source.file, [[v.start, v.end, v.pgoff, v.copied] for v in source.vmas]],
        "eh_frame": [headers.eh_frame.address, headers.eh_frame.size],
        "pages": [
            [p, source.page_index(p), m, *f]
            for p, m, f in zip(pages, mapped, kernel[0], strict=True)
        ],
        "kernel_reads": kernel[1],
    }


async def look_up(
    memory: MemoryBackend,
    vcpu: int,
    layout: PageCacheLayout,
    slide: int,
    source: FileSource,
    pages: list[int],
) -> tuple[list[list[Any]], list[list[Any]]]:
    """Each page's direct-map address and the SHA-256 of what is there; and the walk's
    reads, replayed over what it read to keep only the bytes it asked for."""
    backend = RecordingBackend(memory)
    reader = PageReader(backend, vcpu)  # type: ignore[arg-type]
    bases = await reader.run(lambda m: memory_bases(m, layout, slide))
    assert bases is not None and bases is not UNREADABLE

    def step(memory: MemoryReader, index: int) -> int | None:
        return file_page(memory, layout, bases, source.file, index)

    found = []
    for page in pages:
        index = source.page_index(page)
        assert index is not None
        address = await reader.run(functools.partial(step, index=index))
        assert isinstance(address, int), f"page {page:#x} (index {index}) is not cached"
        data = await memory.read_window(vcpu, address, 4096)
        found.append([address, hashlib.sha256(data).hexdigest()])
    replay = Recorded(WindowMemory(backend.windows))
    memory_bases(replay, layout, slide)
    for page in pages:
        file_page(replay, layout, bases, source.file, source.page_index(page) or 0)
    unique = {(address, data): None for address, data in replay.reads}  # nodes: once
    return found, [list(read) for read in unique]


async def record_guest(guest: LinuxGuest, pid: int) -> dict[str, Any]:
    options = TargetOptions(guest.qmp, guest.kernel, memory="hmp")
    analyzer = build_analyzer(options)
    assert isinstance(analyzer.adapter, LinuxAdapter)
    async with connected(options, analyzer) as (session, memory, _):
        adapter = analyzer.adapter

        async def visit(registers: RegisterSet, task: int) -> dict[str, Any]:
            return await record_libc(memory, registers, task, guest, adapter.bias)

        caught = await catch_running(session, memory, adapter, {pid}, visit)
    return caught[pid]


def record_kernel(abi: str) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as work,
        running_linux(Path(work), "--smp", "2", "--workloads", "dynwork", abi=abi) as guest,
    ):
        pid = started_pids(Path(guest.serial).read_text())["dynwork"]
        found = asyncio.run(record_guest(guest, pid))
        return {"gdb": gdb(guest.kernel), **found}


def main() -> None:
    record_kernels(OUT, record_kernel)


if __name__ == "__main__":
    main()
