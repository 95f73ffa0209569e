"""The example-guest OS adapter on a real ELF: layout from DWARF, bytes from .data."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from qmpprof.errors import MemoryFault
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_ONLY, MemoryWindow, Process, RegisterSet
from tests.unit.conftest import build_elf


@pytest.fixture(scope="module")
def layout_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_elf("os_layout.c", tmp_path_factory.mktemp("os"), "-g", "-O0", "-no-pie")


def data_memory(elf: Path) -> WindowMemory:
    with elf.open("rb") as stream:
        section = ELFFile(stream).get_section_by_name(".data")
        assert section is not None
        return WindowMemory([MemoryWindow(section["sh_addr"], section.data())])


def on_vcpu(vcpu: int) -> RegisterSet:
    return RegisterSet(vcpu, {"rip": 0, "rsp": 0, "rbp": 0}, cs=8, cpl=0, halted=False, bits=64)


def gdb_offset(elf: Path, member: str) -> int:
    out = subprocess.run(
        ["gdb", "-batch", "-nx", "-ex", f"print (long)&((struct process *)0)->{member}", str(elf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split("=")[-1])


def test_member_offsets_match_gdb(layout_elf: Path) -> None:
    adapter = ExampleGuestAdapter.from_kernel(layout_elf)
    assert adapter is not None
    assert adapter.fields.pid_offset == gdb_offset(layout_elf, "pid")
    assert adapter.fields.name_offset == gdb_offset(layout_elf, "name")


def test_processes_per_vcpu_from_real_bytes(layout_elf: Path) -> None:
    adapter = ExampleGuestAdapter.from_kernel(layout_elf)
    assert adapter is not None
    memory = data_memory(layout_elf)
    assert adapter.process(on_vcpu(0), memory) == Process(1, "crunch")
    assert adapter.process(on_vcpu(1), memory) == KERNEL_ONLY
    assert adapter.process(on_vcpu(2), memory) == Process(3, "[bold]x</text>")


def test_missing_memory_faults_with_the_address_to_fetch(layout_elf: Path) -> None:
    adapter = ExampleGuestAdapter.from_kernel(layout_elf)
    assert adapter is not None
    with pytest.raises(MemoryFault) as fault:
        adapter.process(on_vcpu(0), WindowMemory([]))
    assert fault.value.address == adapter.cpu_current


def test_a_kernel_without_the_bookkeeping_gets_no_adapter(symbols_elf: Path) -> None:
    assert ExampleGuestAdapter.from_kernel(symbols_elf) is None
