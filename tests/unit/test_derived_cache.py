"""The derived cache (symbols/derived.py): what a load reads back from it is what the
same load read from the ELF, and a cache that is damaged, of another shape, unwritable,
switched off or made for a file since changed is never used. The ELF files are real: a
static program (glibc's code: thousands of symbols, labels inside functions, .eh_frame)
and a stripped program with its separate debug file, built here from tests/unit/data."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from qmpprof.guest.dwarf_types import read_layout
from qmpprof.modules import Module, load_module
from qmpprof.symbols import derived
from qmpprof.symbols.derived import MAGIC
from tests.unit.conftest import build_elf


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("QMPPROF_DERIVED_CACHE", str(directory))
    return directory


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("cfi_chain.c", tmp_path_factory.mktemp("derived"), "-O2", "-g", "-static")


def entries(cache: Path) -> list[Path]:
    return sorted(path for path in cache.rglob("*") if path.is_file())


def same_module(first: Module, second: Module) -> None:
    assert list(first.symbols) == list(second.symbols)
    assert first.debug_path == second.debug_path
    assert first.cfi.entries() == second.cfi.entries()
    for fde in first.cfi.entries():
        for address in (fde.start, (fde.start + fde.end) // 2, fde.end - 1):
            assert first.cfi.row_for(address) == second.cfi.row_for(address)
            assert first.symbols.lookup(address) == second.symbols.lookup(address)
    assert first.cfi.uncompiled() == second.cfi.uncompiled()


def test_a_module_loads_back_as_it_was_read(program: Path, cache: Path) -> None:
    read = load_module(program)
    assert {path.name.split("-")[0] for path in entries(cache)} == {"cfi", "symbol"}
    loaded_back = load_module(program)
    assert len(read.symbols) > 1000 and len(read.cfi) > 1000
    same_module(read, loaded_back)


def test_a_separate_debug_files_symbols_load_back_with_it(cache: Path, tmp_path: Path) -> None:
    built = build_elf("symbols.c", tmp_path, "-O1", "-g")
    debug, stripped = tmp_path / "symbols.debug", tmp_path / "symbols.stripped"
    subprocess.run(["objcopy", "--only-keep-debug", str(built), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", str(built), str(stripped)], check=True)
    read = load_module(stripped, debug=debug)
    assert read.debug_path == debug and len(read.symbols) > 0
    same_module(read, load_module(stripped, debug=debug))
    assert load_module(stripped).debug_path is None  # another entry: no debug file given


def test_a_damaged_entry_is_read_again_and_rewritten(program: Path, cache: Path) -> None:
    read = load_module(program)
    for entry in entries(cache):
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 0xFF
        entry.write_bytes(bytes(data))
    same_module(read, load_module(program))
    assert all(entry.read_bytes().startswith(MAGIC) for entry in entries(cache))
    same_module(read, load_module(program))


def test_an_entry_of_another_shape_is_read_again(program: Path, cache: Path) -> None:
    """A checked entry whose payload is not what its kind holds (a format changed
    without its number): the ELF is read."""
    read = load_module(program)
    donor = {entry.name.split("-")[0]: entry for entry in entries(cache)}
    cfi, symbols = donor["cfi"], donor["symbol"]
    cfi_bytes, symbol_bytes = cfi.read_bytes(), symbols.read_bytes()
    cfi.write_bytes(symbol_bytes)  # each a valid entry of the other kind
    symbols.write_bytes(cfi_bytes)
    same_module(read, load_module(program))


def test_a_cache_that_cannot_be_written_is_not_used(
    program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("QMPPROF_DERIVED_CACHE", str(blocked / "cache"))
    same_module(load_module(program), load_module(program))


def test_off_keeps_nothing(program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMPPROF_DERIVED_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    load_module(program)
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


def test_a_file_changed_in_place_is_read_again(cache: Path, tmp_path: Path) -> None:
    """Same build-id, same size, other bytes (a symbol renamed where it stands): the
    modification time tells them apart."""
    built = build_elf("symbols.c", tmp_path, "-O1", "-g")
    before = load_module(built)
    data = built.read_bytes()
    old = next(
        s.name for s in before.symbols if len(s.name) > 4 and data.count(s.name.encode()) == 1
    )
    built.write_bytes(data.replace(old.encode() + b"\0", old[::-1].encode() + b"\0"))
    stamp = built.stat().st_mtime_ns + 1_000_000_000
    os.utime(built, ns=(stamp, stamp))
    names = {s.name for s in load_module(built).symbols}
    assert old[::-1] in names and old not in names


def test_a_struct_layout_loads_back_as_it_was_read(cache: Path, tmp_path: Path) -> None:
    elf = build_elf("os_layout.c", tmp_path, "-g", "-O0", "-no-pie")
    read = read_layout(elf, {"cpu_current"}, {"process"})
    assert read.structs["process"] and read.variables["cpu_current"]
    assert any(entry.name.startswith("layout-") for entry in entries(cache))
    assert read_layout(elf, {"cpu_current"}, {"process"}) == read
    assert read_layout(elf, set(), {"process"}, ("pid",)).structs["process"].keys() == {"pid"}


def test_a_file_without_a_build_id_is_not_cached(cache: Path, tmp_path: Path) -> None:
    built = build_elf("symbols.c", tmp_path, "-O1", "-Wl,--build-id=none")
    load_module(built)
    assert entries(cache) == []


def test_the_least_recently_used_files_go_when_the_cache_is_full(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(derived, "MAX_FILES", 2)
    first, second, third = (
        build_elf(source, tmp_path, "-O1", "-g")
        for source in ("symbols.c", "cfi_chain.c", "inlined.c")
    )
    load_module(first)
    load_module(second)
    directories = {path.name: path for path in cache.iterdir()}
    assert len(directories) == 2
    for age, path in enumerate(sorted(directories.values(), key=lambda p: p.name)):
        os.utime(path, (1000 + age, 1000 + age))  # both long unused
    load_module(first)  # used again: its directory is the newer now
    used = {path.name for path in cache.iterdir() if path.stat().st_mtime > 2000}
    assert len(used) == 1
    load_module(third)
    left = {path.name for path in cache.iterdir()}
    assert len(left) == 2 and used <= left


def test_only_the_caches_own_directories_are_ever_removed(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QMPPROF_DERIVED_CACHE may name a directory shared with other things: pruning the
    least recently used must never take what the cache did not make."""
    monkeypatch.setattr(derived, "MAX_FILES", 1)
    others = [cache / "photos", cache / "0123abcd", cache / "vmcoreinfo"]
    for other in others:
        other.mkdir(parents=True)
        (other / "keep").write_bytes(b"x" * 100)
        os.utime(other, (1000, 1000))  # older than anything the cache makes
    for source in ("symbols.c", "cfi_chain.c"):
        load_module(build_elf(source, tmp_path, "-O1", "-g"))
    assert all((other / "keep").exists() for other in others)
    assert len([path for path in cache.iterdir() if path not in others]) == 1
