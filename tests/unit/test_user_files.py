"""Host files for a guest process's file mappings (qmpprof/user_files.py,
address_space.file_mappings): found under a sysroot or by name, used only when their
build-id is the guest's, placed by their PT_LOAD segments, named from a separate debug
file. On shared libraries gcc builds here (data/userlib.c); GNU binutils (nm, readelf,
objcopy, strip) say what the right answers are."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from qmpprof.address_space import AddressSpace, file_mappings
from qmpprof.analysis import Analyzer
from qmpprof.commands.common import mapped_sources
from qmpprof.model import FileMapping, FrameAddress, FrameKind
from qmpprof.symbols.lines import SourceLookup
from qmpprof.symbols.symbolizer import Symbolizer
from qmpprof.user_files import UserFiles
from tests.elf_tools import build_id_of
from tests.unit.conftest import build_elf

GUEST_PATH = "/usr/lib/x86_64-linux-gnu/libuser.so.1"
#: Where the guest maps the library's first byte (a page-aligned ASLR base).
BASE = 0x7F3A_1234_5000

SHARED = ("-shared", "-fPIC", "-O2", "-g", "-Wl,--build-id")


def nm(path: Path) -> dict[str, int]:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in out.splitlines()) if len(p) == 3}


def text_segment(path: Path) -> tuple[int, int, int]:
    """The executable PT_LOAD's (offset, virtual address, file size), from readelf."""
    out = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["LOAD"] and "E" in fields[6:-1]:
            return int(fields[1], 16), int(fields[2], 16), int(fields[4], 16)
    raise AssertionError("no executable PT_LOAD")


def executable_mapping(library: Path, identity: bytes | None) -> FileMapping:
    """The mapping the loader makes of the library's code when its first byte is at BASE."""
    offset, address, size = text_segment(library)
    page = offset & ~0xFFF
    start = BASE + (address & ~0xFFF)
    return FileMapping(
        start, start + ((offset - page + size + 0xFFF) & ~0xFFF), page, GUEST_PATH, identity
    )


@pytest.fixture
def sysroot(tmp_path: Path) -> tuple[Path, Path]:
    """A sysroot holding the library stripped at GUEST_PATH and its debug file under
    usr/lib/debug/.build-id; and the unstripped build (nm's oracle)."""
    built = build_elf("userlib.c", tmp_path, *SHARED)
    root = tmp_path / "root"
    stripped = root / GUEST_PATH.lstrip("/")
    stripped.parent.mkdir(parents=True)
    hex_id = build_id_of(built).hex()
    debug = root / "usr/lib/debug/.build-id" / hex_id[:2] / f"{hex_id[2:]}.debug"
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(built), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), str(built)], check=True)
    return root, built


def in_sysroot(sysroot: tuple[Path, Path]) -> tuple[UserFiles, FileMapping, Path]:
    """The sysroot's files, the guest's mapping of the library (the same build), the
    unstripped library."""
    root, built = sysroot
    return UserFiles(sysroot=root), executable_mapping(built, build_id_of(built)), built


def name_at(files: UserFiles, mapping: FileMapping, address: int) -> str:
    space = AddressSpace(file_mappings([mapping], files.module_for))
    return Symbolizer(space).symbolize(FrameAddress(address, FrameKind.INSTRUCTION)).label()


def test_a_sysroot_file_with_the_guests_build_id_names_its_functions(
    sysroot: tuple[Path, Path],
) -> None:
    files, mapping, built = in_sysroot(sysroot)
    symbols = nm(built)
    for name in ("userlib_exported", "userlib_hidden"):
        assert name_at(files, mapping, BASE + symbols[name] + 1) == name
    module = files.module_for(mapping)
    assert module is not None and module.debug_path is not None  # the static one's name
    assert not files.mismatches


def test_a_file_with_another_build_id_is_reported_and_names_nothing(
    sysroot: tuple[Path, Path], tmp_path: Path
) -> None:
    root, built = sysroot
    other = build_elf("userlib.c", tmp_path, *SHARED, "-DVARIANT=2")
    assert build_id_of(other) != build_id_of(built)
    mapping = executable_mapping(built, build_id_of(other))  # the guest runs the other build
    files = UserFiles(sysroot=root)
    address = BASE + nm(built)["userlib_hidden"] + 1
    offset = address - mapping.start + mapping.offset
    assert name_at(files, mapping, address) == f"libuser.so.1+{offset:#x}"
    mismatch = files.mismatches[GUEST_PATH]
    assert mismatch.guest_build_id == build_id_of(other)
    assert mismatch.host_build_id == build_id_of(built)


def test_no_host_file_names_the_guest_file_and_its_offset(sysroot: tuple[Path, Path]) -> None:
    _, built = sysroot
    mapping = executable_mapping(built, build_id_of(built))
    address = mapping.start + 0x123
    expected = f"libuser.so.1+{mapping.offset + 0x123:#x}"
    assert name_at(UserFiles(), mapping, address) == expected


def test_a_file_named_by_the_user_is_found_by_its_name(
    sysroot: tuple[Path, Path], tmp_path: Path
) -> None:
    _, built = sysroot
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(built, mine / "libuser.so.1")
    mapping = executable_mapping(built, build_id_of(built))
    address = BASE + nm(built)["userlib_exported"]
    assert name_at(UserFiles(directories=[mine]), mapping, address) == "userlib_exported"
    assert name_at(UserFiles(files=[mine / "libuser.so.1"]), mapping, address) == "userlib_exported"


@pytest.mark.parametrize(
    "guest_path", ["/../outside/libuser.so.1", "/escape/libuser.so.1", "/", "", "/a\0b"]
)
def test_a_guest_path_never_leads_out_of_the_sysroot(
    sysroot: tuple[Path, Path], tmp_path: Path, guest_path: str
) -> None:
    root, built = sysroot
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(built, outside / "libuser.so.1")
    (root / "escape").symlink_to(outside)
    files = UserFiles(sysroot=root)
    mapping = executable_mapping(built, build_id_of(built))
    assert files.module_for(replace(mapping, path=guest_path)) is None


def addr2line(path: Path, address: int) -> list[str]:
    """The functions binutils' addr2line says hold `address`, innermost first."""
    command = ["addr2line", "-f", "-i", "-e", str(path), f"{address:#x}"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0::2]


def mapped_sources_of(files: UserFiles) -> Callable[[FileMapping], tuple[Path, int] | None]:
    analyzer = Analyzer(files=files)
    return mapped_sources(analyzer)


def test_inlined_calls_in_a_mapped_library_come_from_its_debug_file(
    sysroot: tuple[Path, Path],
) -> None:
    files, mapping, built = in_sysroot(sysroot)
    start = nm(built)["userlib_exported"]
    inlined = next(a for a in range(start, start + 0x80) if len(addr2line(built, a)) == 2)
    assert addr2line(built, inlined) == ["userlib_inlined", "userlib_exported"]
    lookup = SourceLookup({}, mapped_sources_of(files))
    found = lookup.expand("libuser.so.1", "userlib_exported", BASE + inlined, mapping)
    assert [f.function for f in found] == ["userlib_inlined", "userlib_exported"]
    assert [f.inlined for f in found] == [True, False]
