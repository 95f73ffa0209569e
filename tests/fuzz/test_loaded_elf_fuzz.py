"""Hostile loaded images (guest/loaded_elf.py): a library gcc builds here, laid out as
ld.so loads it, then bytes of its headers, dynamic section, hash table, .eh_frame_hdr,
.eh_frame, symbols and strings overwritten at random, and pages taken away; and a
program's file as the page cache holds it, its section headers, .symtab and .strtab
overwritten and pages taken away. Reading it raises nothing but qmpprof's errors, and
what it gives is bounded."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import QmpprofError
from qmpprof.guest.loaded_elf import MAX_SYMBOLS, read_loaded_module
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from tests.fuzz.budget import cases, counted
from tests.unit.conftest import build_elf
from tests.unit.loaded_image import PAGE, file_pages, loaded

BASE = 0x7F3A_1234_5000


@functools.cache
def build_directory() -> Path:
    out = Path(tempfile.mkdtemp(prefix="qmpprof-loaded-elf-fuzz-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    return out


@functools.cache
def library() -> tuple[list[tuple[int, bytes]], object]:
    built = build_elf("userlib.c", build_directory(), "-shared", "-fPIC", "-O2", "-Wl,--build-id")
    memory, mapping, _ = loaded(built, BASE, "/usr/lib/libuser.so.1")
    pages = []
    for start, end, data in memory._windows:
        pages += [(at, data[at - start : at - start + PAGE]) for at in range(start, end, PAGE)]
    return pages, mapping


@settings(max_examples=cases(300))
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 5 * PAGE), st.binary(min_size=1, max_size=8)), max_size=24
    ),
    dropped=st.sets(st.integers(0, 5), max_size=2),
)
@counted
def test_mutated_images_read_safely(edits: list[tuple[int, bytes]], dropped: set[int]) -> None:
    pages, mapping = library()
    image = bytearray(b"".join(data for _, data in pages))
    for at, data in edits:
        image[at : at + len(data)] = data[: max(0, len(image) - at)]
    windows = [
        MemoryWindow(address, bytes(image[i * PAGE : (i + 1) * PAGE]))
        for i, (address, _) in enumerate(pages)
        if i not in dropped
    ]
    try:
        module = read_loaded_module(WindowMemory(windows), mapping)  # type: ignore[arg-type]
    except QmpprofError:
        return
    if module is not None:
        assert len(module.symbols) <= MAX_SYMBOLS
        for fde in module.cfi.entries():
            module.cfi.row_for(fde.start)


@functools.cache
def program() -> tuple[WindowMemory, object, bytes]:
    """A static program, loaded, and its file's bytes."""
    built = build_elf("cfi_chain.c", build_directory(), "-O2", "-static")
    return loaded(built, 0, "/usr/bin/program")


@settings(max_examples=cases(200))
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)), max_size=24
    ),
    tail_edits=st.lists(
        st.tuples(st.integers(1, 3 * PAGE), st.binary(min_size=1, max_size=8)), max_size=24
    ),
    missing=st.sets(st.integers(0, 200), max_size=8),
)
@counted
def test_mutated_symbol_tables_read_safely(
    edits: list[tuple[int, bytes]], tail_edits: list[tuple[int, bytes]], missing: set[int]
) -> None:
    """The file's pages as the page cache would give them, changed at random anywhere and
    in its last pages (where the section headers, .symtab and .strtab lie)."""
    memory, mapping, data = program()
    image = bytearray(data)
    for at, change in [*edits, *((len(image) - back, change) for back, change in tail_edits)]:
        image[at : at + len(change)] = change[: max(0, len(image) - at)]
    pages = -(-len(image) // PAGE)
    holes = {pages - 1 - n for n in missing}
    try:
        module = read_loaded_module(memory, mapping, file_pages(bytes(image), holes))  # type: ignore[arg-type]
    except QmpprofError:
        return
    if module is not None:
        assert len(module.symbols) <= 2 * MAX_SYMBOLS
