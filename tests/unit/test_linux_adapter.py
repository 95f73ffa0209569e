"""The Linux adapter and the KASLR check on guest memory read from Debian 12's 6.1 kernel
booted with KASLR on (tests/unit/data/linux/tasks.json, recorded by record_tasks.py
there). The oracles are not qmpprof's: nm's symbols, GDB's task_struct offsets, the
banner pyelftools reads in the vmlinux, the pids the guest's init printed, and Linux's
own facts (init_task is CPU 0's idle task; kthreadd, pid 2, is the first kernel thread;
QEMU's x86 vCPU n boots as Linux CPU n)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from qmpprof.errors import MemoryFault
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.linux.adapter import CPUNODE_OFFSET, LinuxAdapter, TaskLayout, linux_cpu
from qmpprof.guest.linux.kaslr import linked_string, mismatch_banner
from qmpprof.memory import FetchingMemory, WindowFetch, WindowMemory
from qmpprof.model import IDLE_CONTEXT, MemoryWindow, Process
from qmpprof.target.registers import parse_all
from tests.unit.conftest import build_elf

DATA = json.loads((Path(__file__).parent / "data" / "linux" / "tasks.json").read_text())
NM = {name: int(address, 16) for name, address in DATA["nm"].items()}
SLIDE = int(DATA["kallsyms_divide_error"], 16) - NM["asm_exc_divide_error"]
REGISTERS = parse_all(DATA["registers"])


def window(entry: list[Any]) -> MemoryWindow:
    return MemoryWindow(entry[0], bytes.fromhex(entry[1]))


def layout() -> TaskLayout:
    gdb = DATA["gdb_task_struct"]
    members = {m: Member(gdb[m], gdb["comm_size"] if m == "comm" else 4) for m in gdb}
    task = TaskLayout.from_members(members)
    assert task is not None
    return task


def adapter() -> LinuxAdapter:
    linux = LinuxAdapter(NM["__per_cpu_offset"], NM["current_task"], layout())
    linux.relocate(SLIDE)
    return linux


def memory_of(vcpu: int) -> WindowMemory:
    return WindowMemory(window(w) for w in DATA["vcpus"][vcpu]["windows"])


def task_memory(name: str) -> tuple[int, WindowMemory]:
    address, page = DATA["tasks"][name]
    return address, WindowMemory([window(page)])


def test_the_guest_ran_with_kaslr() -> None:
    assert SLIDE != 0


def test_each_vcpu_runs_a_task_init_started_labelled_comm_tgid_with_its_tid() -> None:
    started = {name: int(pid) for name, pid in DATA["started"].items()}
    assert {"crunch", "sysloop"} <= started.keys()
    linux = adapter()
    for regs in REGISTERS:
        process = linux.process(regs, memory_of(regs.vcpu))
        assert process is not None
        if process.pid is not None:  # a process: one init started, one thread each
            assert started[process.name] == process.pid == process.tid
        else:  # else a kernel thread or the idle task
            assert process == IDLE_CONTEXT or process.name.startswith("[")


def test_a_kernel_thread_is_its_name_in_brackets() -> None:
    address, memory = task_memory("kthreadd")
    assert layout().read(memory, address) == Process(None, "[kthreadd]", 2)


def test_the_idle_task_is_the_idle_context() -> None:
    address, memory = task_memory("init_task")
    assert layout().read(memory, address) == IDLE_CONTEXT


def test_the_cpu_number_is_read_from_the_gs_base_and_from_the_gdt() -> None:
    areas = NM["__per_cpu_offset"] + SLIDE
    for regs in REGISTERS:
        memory = memory_of(regs.vcpu)
        assert linux_cpu(areas, regs, memory) == regs.vcpu
        # as in user mode: no kernel GS base, the GDT's CPUNODE descriptor instead
        user = replace(regs, cpl=3, gs_base=0)
        assert linux_cpu(areas, user, memory) == regs.vcpu
        # a dump without the bases (an older capture): vCPU n is taken for CPU n
        assert linux_cpu(areas, replace(user, gdt_base=0), memory) == regs.vcpu


def test_kernel_mode_asks_for_the_offsets_table_and_user_mode_for_the_gdt() -> None:
    """The first address each way needs: in kernel mode __per_cpu_offset[vcpu], to
    compare with the GS base; in user mode the GDT's CPUNODE descriptor."""
    areas = NM["__per_cpu_offset"] + SLIDE
    for regs in REGISTERS:
        kernel, user = replace(regs, cpl=0, gs_base=regs.gs_base or 1), replace(regs, cpl=3)
        for mode, first in (
            (kernel, areas + 8 * regs.vcpu),
            (user, regs.gdt_base + CPUNODE_OFFSET),
        ):
            with pytest.raises(MemoryFault) as fault:
                linux_cpu(areas, mode, WindowMemory([]))
            assert fault.value.address == first


def test_the_task_is_read_in_one_span() -> None:
    task = layout()
    assert task.size <= 4096
    address, _ = DATA["tasks"]["kthreadd"]
    with pytest.raises(MemoryFault) as fault:
        task.read(WindowMemory([]), address)
    assert fault.value.address == address + DATA["gdb_task_struct"]["flags"]


def banner_found(size: int) -> bytes:
    page = window(DATA["banner_window"])
    start = NM["linux_banner"] + SLIDE - page.base
    return page.data[start : start + size]


def test_the_guest_banner_at_the_slide_is_the_vmlinux_banner() -> None:
    expected = DATA["elf_banner"].encode()
    assert mismatch_banner("vmlinux", expected, banner_found(len(expected)), 0) is None


def test_another_kernels_banner_is_a_one_line_mismatch(tmp_path: Path) -> None:
    probe = build_elf("linux_probe.c", tmp_path, "-O0", "-no-pie")
    out = subprocess.run(["nm", str(probe)], capture_output=True, text=True, check=True).stdout
    address = next(int(line.split()[0], 16) for line in out.splitlines() if "linux_banner" in line)
    expected = linked_string(probe, address)
    assert expected == b"Linux version 6.1.0-probe (qmpprof test)\n"
    message = mismatch_banner("probe", expected, banner_found(len(expected)), 0x1234)
    assert message is not None and "\n" not in message
    assert "Linux version 6.1.0-probe" in message and "Linux version 6.1.0-" in message
    assert "0x1234" in message


def test_words_the_kernel_never_changes_are_read_once_and_kept_in_every_sample() -> None:
    """__per_cpu_offset[] and the GDT's CPUNODE descriptor (BootConstants): a second
    sample of the same vCPU fetches neither, yet its windows hold their bytes, so its
    replay (a fresh adapter over those windows alone) names the same task."""
    areas = NM["__per_cpu_offset"] + SLIDE
    linux = adapter()
    for regs in REGISTERS:
        everything = [window(w) for w in DATA["vcpus"][regs.vcpu]["windows"]]
        area = WindowMemory(everything).read_u64(areas + 8 * regs.vcpu)
        kernel, user = replace(regs, cpl=0, gs_base=area), replace(regs, cpl=3, gs_base=0)
        for sample in (kernel, user, replace(kernel), replace(user)):  # new objects each
            fetched: list[int] = []
            memory = FetchingMemory([], recording_fetch(everything, fetched), 16)
            process = linux.process(sample, memory)
            assert process == adapter().process(regs, memory_of(regs.vcpu))
            assert adapter().process(sample, WindowMemory(memory.windows)) == process
        constants = {areas + 8 * regs.vcpu, regs.gdt_base + CPUNODE_OFFSET}
        assert not constants & set(fetched)  # the last sample's fetches


def recording_fetch(windows: list[MemoryWindow], fetched: list[int]) -> WindowFetch:
    """A fetch from `windows` that notes each address it is asked for in `fetched`."""

    def fetch(address: int, size: int) -> MemoryWindow | None:
        fetched.append(address)
        return next((w for w in windows if w.base <= address < w.end), None)

    return fetch


def test_a_new_connection_reads_the_boot_constants_again() -> None:
    """The guest may have booted again between two connections (other per-CPU areas)."""
    areas = NM["__per_cpu_offset"] + SLIDE
    linux, regs = adapter(), REGISTERS[0]
    everything = [window(w) for w in DATA["vcpus"][regs.vcpu]["windows"]]
    area = WindowMemory(everything).read_u64(areas + 8 * regs.vcpu)
    kernel = replace(regs, cpl=0, gs_base=area)
    for sample in (kernel, replace(kernel)):
        linux.process(sample, FetchingMemory([], recording_fetch(everything, []), 16))
    linux.new_connection()
    fetched: list[int] = []
    linux.process(replace(kernel), FetchingMemory([], recording_fetch(everything, fetched), 16))
    assert areas + 8 * regs.vcpu in fetched
