"""An ELF file laid out in memory as ld.so loads it (each PT_LOAD's pages at base +
p_vaddr), as a WindowMemory: the guest's view of a loaded library; and its file's pages
by offset, as the guest's page cache holds them: for guest/loaded_elf.py's tests."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from elftools.elf.elffile import ELFFile

from qmpprof.memory import WindowMemory
from qmpprof.model import FileMapping, MemoryWindow

PAGE = 4096


def loaded(path: Path, base: int, guest_path: str) -> tuple[WindowMemory, FileMapping, bytes]:
    """The memory, the executable segment's FileMapping, and the bytes of each page."""
    data = path.read_bytes()
    windows = []
    with path.open("rb") as stream:
        loads = [s for s in ELFFile(stream).iter_segments() if s["p_type"] == "PT_LOAD"]
    for segment in loads:
        offset = segment["p_offset"] // PAGE * PAGE
        size = -(-(segment["p_offset"] + segment["p_filesz"] - offset) // PAGE) * PAGE
        chunk = data[offset : offset + size].ljust(size, b"\0")
        windows.append(MemoryWindow(base + segment["p_vaddr"] // PAGE * PAGE, chunk))
    code = next(s for s in loads if s["p_flags"] & 1)
    start = base + code["p_vaddr"] // PAGE * PAGE
    mapping = FileMapping(
        start, base + code["p_vaddr"] + code["p_memsz"], code["p_offset"] // PAGE * PAGE, guest_path
    )
    return WindowMemory(windows), mapping, data


def file_pages(data: bytes, missing: Collection[int] = ()) -> WindowMemory:
    """The file's bytes at their offsets, as the page cache has them (whole pages, zeros
    past the end), but for the pages whose numbers are `missing`."""
    pages = range(0, -(-len(data) // PAGE))
    return WindowMemory(
        [
            MemoryWindow(n * PAGE, data[n * PAGE : (n + 1) * PAGE].ljust(PAGE, b"\0"))
            for n in pages
            if n not in missing
        ]
    )
