"""A library as its process has it loaded, with no host file (guest/loaded_elf.py): its
dynamic symbols and .eh_frame read from memory laid out as ld.so lays it out, at a
random base, and its full symbol table where the file's pages can be read by offset
(the guest's page cache: the file's bytes here, some pages missing). On shared
libraries and a static program gcc builds here (data/userlib.c, data/cfi_chain.c) and
Debian's libc of the Linux test guest's sysroot when it is built; nm and qmpprof's
reading of the file itself (load_module) say what the right answers are."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.guest.loaded_elf import read_loaded_module
from qmpprof.memory import WindowMemory
from qmpprof.model import MemoryWindow
from qmpprof.modules import load_module
from qmpprof.user_files import GUEST_COPY_TRIES, UserFiles
from tests.elf_tools import nm_functions
from tests.seeds import seeded
from tests.unit.conftest import build_elf
from tests.unit.loaded_image import PAGE, file_pages, loaded

SHARED = ("-shared", "-fPIC", "-O2", "-Wl,--build-id")
LIBC = Path(__file__).parents[2] / "examples/linux/build/sysroot/lib/x86_64-linux-gnu/libc.so.6"
GUEST_PATH = "/usr/lib/x86_64-linux-gnu/libuser.so.1"


def random_base(name: str) -> int:
    return 0x7F00_0000_0000 + seeded(name).randrange(1 << 28) * PAGE


def functions_by_address(path: Path, *flags: str) -> dict[int, set[str]]:
    """nm's defined functions with a size (T, W: not IFUNC resolvers, which qmpprof leaves
    out), by address: of every symbol table, or of .dynsym with `-D`."""
    found: dict[int, set[str]] = {}
    for address, _, name in nm_functions(path, *flags):
        found.setdefault(address, set()).add(name)
    return found


def check_against_file(path: Path, guest_path: str) -> None:
    base = random_base(path.name)
    memory, mapping, _ = loaded(path, base, guest_path)
    module = read_loaded_module(memory, mapping)
    assert module is not None and module.from_guest
    reference = load_module(path)
    assert module.build_id == reference.build_id and module.loads == reference.loads
    nm = functions_by_address(path, "-D")
    names = {s.address: s.name for s in module.symbols}
    assert set(names) == set(nm) and all(names[a] in nm[a] for a in names)
    starts = sorted(f.start for f in reference.cfi.entries())
    assert sorted(f.start for f in module.cfi.entries()) == starts
    for start in starts:
        assert module.cfi.row_for(start + 1) == reference.cfi.row_for(start + 1)


def test_a_built_library_reads_as_its_file_says(tmp_path: Path) -> None:
    check_against_file(build_elf("userlib.c", tmp_path, *SHARED), GUEST_PATH)


@pytest.mark.skipif(not LIBC.is_file(), reason="no sysroot: make -C examples/linux")
def test_debians_libc_reads_as_its_file_says() -> None:
    check_against_file(LIBC, "/lib/x86_64-linux-gnu/libc.so.6")


def test_no_name_past_a_symbols_size(tmp_path: Path) -> None:
    built = build_elf("userlib.c", tmp_path, *SHARED)
    memory, mapping, _ = loaded(built, random_base("size"), GUEST_PATH)
    module = read_loaded_module(memory, mapping)
    assert module is not None
    symbol = module.symbols.find("userlib_exported")
    assert symbol is not None and module.symbols.lookup(symbol.address + symbol.size) is None
    assert module.symbols.find("userlib_hidden") is None  # static: not in .dynsym


def test_pages_never_touched_leave_their_fdes_out(tmp_path: Path) -> None:
    """The .eh_frame's pages missing (the process never read them): no FDE, no wrong one;
    the symbols still read."""
    built = build_elf("userlib.c", tmp_path, *SHARED)
    memory, mapping, _ = loaded(built, random_base("holes"), GUEST_PATH)
    reference = load_module(built)
    frame = reference.cfi.entries()[0]
    hole = (frame.instructions_address - reference.loads[0].address) // PAGE * PAGE
    windows = [w for w in memory._windows]
    base = mapping.start - mapping.offset
    kept = []
    for start, end, data in windows:
        for at in range(start, end, PAGE):
            if at != base + hole:
                kept.append(MemoryWindow(at, data[at - start : at - start + PAGE]))
    module = read_loaded_module(WindowMemory(kept), mapping)
    assert module is not None and len(module.symbols) > 0
    assert len(module.cfi) < len(reference.cfi)
    for fde in module.cfi.entries():
        assert reference.cfi.row_for(fde.start) == module.cfi.row_for(fde.start)


def test_a_build_id_not_the_maps_is_refused(tmp_path: Path) -> None:
    built = build_elf("userlib.c", tmp_path, *SHARED)
    memory, mapping, _ = loaded(built, random_base("id"), GUEST_PATH)
    assert read_loaded_module(memory, replace(mapping, build_id=b"\x01" * 20)) is None


def test_user_files_hands_out_the_guest_copy(tmp_path: Path) -> None:
    built = build_elf("userlib.c", tmp_path, *SHARED)
    memory, mapping, _ = loaded(built, random_base("files"), GUEST_PATH)
    files = UserFiles()
    assert files.wants_guest_copy(mapping) and files.module_for(mapping) is None
    module = read_loaded_module(memory, mapping)
    files.add_guest_copy(mapping, module)
    assert not files.wants_guest_copy(mapping) and files.module_for(mapping) is module


def test_a_guest_copy_that_found_nothing_is_tried_again_a_few_times(tmp_path: Path) -> None:
    """A read finds nothing where its process was exiting, part of the file where it
    was still being exec'd; another process that maps the file may hold it whole: tried
    again, GUEST_COPY_TRIES reads in all."""
    built = build_elf("userlib.c", tmp_path, *SHARED)
    memory, mapping, _ = loaded(built, random_base("retry"), GUEST_PATH)
    files = UserFiles()
    for _ in range(GUEST_COPY_TRIES - 1):
        assert read_loaded_module(WindowMemory([]), mapping) is None  # nothing mapped
        files.add_guest_copy(mapping, None)
        assert files.wants_guest_copy(mapping) and files.module_for(mapping) is None
    module = read_loaded_module(memory, mapping)
    files.add_guest_copy(mapping, module)
    assert not files.wants_guest_copy(mapping) and files.module_for(mapping) is module
    partial = UserFiles()  # a part (some pages unreadable) is used, and read again
    partial.add_guest_copy(mapping, module, whole=False)
    assert partial.wants_guest_copy(mapping) and partial.module_for(mapping) is module
    partial.add_guest_copy(mapping, module)
    assert not partial.wants_guest_copy(mapping) and partial.module_for(mapping) is module
    other = replace(mapping, path="/usr/lib/other.so")
    for _ in range(GUEST_COPY_TRIES):
        files.add_guest_copy(other, None)
    assert not files.wants_guest_copy(other) and files.module_for(other) is None


@pytest.mark.parametrize("flags", [SHARED, ("-O2", "-static", "-g")], ids=["shared", "static"])
def test_the_files_own_symbol_table_names_its_static_functions(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """Where the file's pages are readable by offset, every sized function nm lists is
    named, static ones included, at its own address."""
    built = build_elf("userlib.c" if "-shared" in flags else "cfi_chain.c", tmp_path, *flags)
    memory, mapping, data = loaded(built, random_base("symtab"), GUEST_PATH)
    module = read_loaded_module(memory, mapping, file_pages(data))
    assert module is not None
    nm = functions_by_address(built)
    with built.open("rb") as stream:
        code = [
            (s["p_vaddr"], s["p_vaddr"] + s["p_memsz"])
            for s in ELFFile(stream).iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
        ]
    names = {s.address: s.name for s in module.symbols}
    assert set(names) == {a for a in nm if any(lo <= a < hi for lo, hi in code)}
    assert all(names[a] in nm[a] for a in names)
    if "-shared" in flags:
        assert module.symbols.find("userlib_hidden") is not None


def test_symbol_table_pages_missing_leave_only_their_names_out(tmp_path: Path) -> None:
    """The page cache without some of the file's pages: the symbols they hold (or whose
    names they hold) are left out, and every name given is still nm's."""
    built = build_elf("cfi_chain.c", tmp_path, "-O2", "-static")
    memory, mapping, data = loaded(built, random_base("symtab holes"), GUEST_PATH)
    whole = read_loaded_module(memory, mapping, file_pages(data))
    assert whole is not None
    nm = functions_by_address(built)
    pages = -(-len(data) // PAGE)
    for missing in (range(pages - 3, pages - 1), range(pages - 12, pages - 6), range(pages)):
        module = read_loaded_module(memory, mapping, file_pages(data, missing))
        assert module is not None
        names = {s.address: s.name for s in module.symbols}
        assert all(names[a] in nm[a] for a in names)
        assert len(names) < len({s.address for s in whole.symbols})


def test_a_static_program_s_eh_frame_is_found_through_its_sections(tmp_path: Path) -> None:
    """gcc links a -static program with no .eh_frame_hdr (no PT_GNU_EH_FRAME): its
    .eh_frame is where its section headers say, read from the page cache, and its FDEs
    are the file's; with no page cache (or not its section names) it has none."""
    built = build_elf("cfi_chain.c", tmp_path, "-O2", "-static")
    with built.open("rb") as stream:
        elf = ELFFile(stream)
        assert not any(s["p_type"] == "PT_GNU_EH_FRAME" for s in elf.iter_segments())
        names_at = elf.get_section(elf["e_shstrndx"])["sh_offset"]
    memory, mapping, data = loaded(built, random_base("static"), GUEST_PATH)
    reference = load_module(built)
    module = read_loaded_module(memory, mapping, file_pages(data))
    assert module is not None
    starts = sorted(f.start for f in reference.cfi.entries())
    assert starts and sorted(f.start for f in module.cfi.entries()) == starts
    for start in starts:
        assert module.cfi.row_for(start + 1) == reference.cfi.row_for(start + 1)
    no_cache = read_loaded_module(memory, mapping)
    no_names = read_loaded_module(memory, mapping, file_pages(data, {names_at // PAGE}))
    assert no_cache is not None and len(no_cache.cfi) == 0
    assert no_names is not None and len(no_names.cfi) == 0
