"""Hostile loaded images (guest/loaded_elf.py): a library gcc builds here, laid out as
ld.so loads it, then bytes of its headers, dynamic section, hash table, .eh_frame_hdr,
.eh_frame, symbols and strings overwritten at random, and pages taken away. Reading it
raises nothing but qmpprof's errors, and what it gives is bounded."""

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
from tests.unit.loaded_image import PAGE, loaded

BASE = 0x7F3A_1234_5000


@functools.cache
def library() -> tuple[list[tuple[int, bytes]], object]:
    out = Path(tempfile.mkdtemp(prefix="qmpprof-loaded-elf-fuzz-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    built = build_elf("userlib.c", out, "-shared", "-fPIC", "-O2", "-Wl,--build-id")
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
