"""Struct layouts from BTF (guest/btf.py) and, where a kernel has none, from DWARF,
against the compiler: tests/unit/data/btf_layouts.c prints each member's offsetof and
sizeof, and pahole (the tool that writes every kernel's BTF) puts its BTF into that same
program. On Debian's kernels, BTF and DWARF (two encodings, two tools, two readers) give
the same layouts for every struct the Linux adapter and its walkers ask for."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from qmpprof.guest.btf import Btf
from qmpprof.guest.dwarf_types import Member, _structs, read_layout
from qmpprof.guest.linux import adapter as linux
from qmpprof.guest.linux import maps as linux_maps
from qmpprof.guest.linux import modules as linux_modules
from qmpprof.guest.linux import page_cache as linux_page_cache
from qmpprof.symbols.elf_file import open_elf
from tests.linux_vm import kernel_abis
from tests.unit.conftest import build_elf

STRUCTS = {"task", "hot", "list"}
CACHE = Path.home() / ".cache" / "qmpprof" / "linux"


def with_btf(program: Path) -> Path:
    """A copy of `program` with pahole's BTF of its DWARF in a .BTF section."""
    if shutil.which("pahole") is None:
        pytest.fail("pahole is needed to write BTF (make test installs Debian's dwarves)")
    copy = program.with_name(program.name + ".btf")
    shutil.copy2(program, copy)
    subprocess.run(["pahole", "-J", str(copy)], check=True, capture_output=True)
    return copy


def btf_bytes(path: Path) -> bytes:
    with open_elf(path) as elf:
        section = elf.get_section_by_name(".BTF")
        assert section is not None, f"{path} has no .BTF"
        return bytes(section.data())


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("btf_layouts.c", tmp_path_factory.mktemp("btf"), "-g", "-O0")


@pytest.fixture(scope="module")
def compiler(program: Path) -> dict[str, dict[str, Member]]:
    """Each member as the compiler places it (the program's own output)."""
    printed = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    layouts: dict[str, dict[str, Member]] = {}
    for line in printed.splitlines():
        struct, member, offset, size = line.split()
        layouts.setdefault(struct, {})[member] = Member(int(offset), int(size))
    return layouts


def test_btf_gives_the_compilers_offsets_and_sizes(
    program: Path, compiler: dict[str, dict[str, Member]]
) -> None:
    layout = read_layout(with_btf(program), set(), STRUCTS)
    for struct, members in compiler.items():
        assert {name: layout.structs[struct][name] for name in members} == members


def test_btf_names_bitfields_and_members_of_anonymous_unions(program: Path) -> None:
    found = Btf(btf_bytes(with_btf(program))).structs({"task", "hot"}, None)
    assert {"flags", "in_iowait"} <= found["task"].keys()
    assert found["hot"]["top_of_stack"] == found["hot"]["stack_end"]


def test_only_the_wanted_members_are_given(program: Path) -> None:
    layout = read_layout(with_btf(program), set(), {"task"}, ("pid", "comm", "absent"))
    assert layout.structs == {"task": {"pid": Member(16, 4), "comm": Member(24, 16)}}


def test_a_struct_the_btf_lacks_is_absent(program: Path) -> None:
    assert read_layout(with_btf(program), set(), {"pcpu_hot", "list"}).structs.keys() == {"list"}


def test_without_btf_dwarf_gives_the_compilers_offsets(
    program: Path, compiler: dict[str, dict[str, Member]]
) -> None:
    """DWARF leaves a typedef's size out (None); every size it gives is the compiler's."""
    layout = read_layout(program, set(), STRUCTS)
    for struct, members in compiler.items():
        for name, member in members.items():
            found = layout.structs[struct][name]
            assert found.offset == member.offset, (struct, name)
            assert found.size in (None, member.size), (struct, name)


#: What the Linux adapter and its walkers ask the vmlinux for, and the members each wants.
ASKED = (
    ({"task_struct", "pcpu_hot"}, (*linux.TASK_MEMBERS, "top_of_stack")),
    (linux_maps._STRUCTS, linux_maps._MEMBERS),
    (linux_page_cache._STRUCTS, linux_page_cache._MEMBERS),
    ({"module", "list_head"}, (*linux_modules.MODULE_MEMBERS, "next")),
    ({"module_layout", "module_memory"}, linux_modules.TEXT_MEMBERS),
)


@pytest.mark.slow
@pytest.mark.parametrize("abi", kernel_abis())
def test_a_debian_kernels_btf_and_dwarf_agree(abi: str) -> None:
    vmlinux = CACHE / abi / "vmlinux"
    if not vmlinux.exists():
        pytest.skip(f"{vmlinux} is not cached (make linux-guest)")
    btf = Btf(btf_bytes(vmlinux))
    for structs, members in ASKED:
        wanted = frozenset(members)
        from_btf = btf.structs(set(structs), wanted)
        from_dwarf = _structs(vmlinux, set(structs), wanted)
        assert from_btf.keys() == from_dwarf.keys()
        for name, dwarf_members in from_dwarf.items():
            assert from_btf[name].keys() == dwarf_members.keys(), name
            for member, placed in dwarf_members.items():
                offset, size = from_btf[name][member]
                assert offset == placed.offset, (name, member)
                assert placed.size in (None, size), (name, member)
