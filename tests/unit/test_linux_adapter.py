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
from qmpprof.guest.linux.adapter import (
    CPUNODE_OFFSET,
    PERCPU_OFFSET_32,
    LinuxAdapter,
    TaskLayout,
    linux_cpu,
    per_cpu_area_32,
    segment_base,
)
from qmpprof.guest.linux.kaslr import linked_string, mismatch_banner
from qmpprof.memory import FetchingMemory, WindowFetch, WindowMemory
from qmpprof.model import IDLE_CONTEXT, MemoryWindow, Process
from qmpprof.target.registers import parse_all
from qmpprof.unwind.numbering import REGISTER_COUNT
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


#: The i386 guest (examples/linux/i386: Debian 12's 6.1.0-50-686-pae, KASLR on, one vCPU
#: in user mode, one in the kernel), recorded by tests/unit/data/linux/i386/record_tasks.py.
I386 = json.loads((Path(__file__).parent / "data/linux/i386/tasks.json").read_text())
I386_NM = {name: int(address, 16) for name, address in I386["nm"].items()}
I386_SLIDE = int(I386["kallsyms_divide_error"], 16) - I386_NM["asm_exc_divide_error"]
I386_REGISTERS = parse_all(I386["registers"])


def i386_adapter() -> LinuxAdapter:
    gdb = I386["gdb_task_struct"]
    members = {m: Member(gdb[m], gdb["comm_size"] if m == "comm" else 4) for m in gdb}
    task = TaskLayout.from_members(members)
    nm = I386_NM
    linux = LinuxAdapter(
        nm["__per_cpu_offset"],
        nm["current_task"],
        task,
        top_of_stack=nm["cpu_current_top_of_stack"],
        word=4,
    )
    linux.relocate(I386_SLIDE)
    return linux


def i386_memory(vcpu: int) -> WindowMemory:
    return WindowMemory(window(w) for w in I386["vcpus"][vcpu]["windows"])


def i386_offsets() -> list[int]:
    """__per_cpu_offset[] as the guest had it: 4-byte entries."""
    areas = I386_NM["__per_cpu_offset"] + I386_SLIDE
    memory = i386_memory(0)
    return [int.from_bytes(memory.read(areas + 4 * n, 4), "little") for n in range(2)]


def test_i386_vcpus_in_user_and_kernel_mode_run_tasks_init_started() -> None:
    started = {name: int(pid) for name, pid in I386["started"].items()}
    assert I386_SLIDE == 0x1800_0000
    assert sorted(regs.cpl for regs in I386_REGISTERS) == [0, 3]
    linux = i386_adapter()
    for regs in I386_REGISTERS:
        process = linux.process(regs, i386_memory(regs.vcpu))
        assert process is not None and process.name in started, process
        assert started[process.name] == process.pid == process.tid


def test_i386_per_cpu_offset_is_the_kernels_fs_base_or_the_gdts_per_cpu_segment() -> None:
    """In kernel mode FS's base is the CPU's __per_cpu_offset entry; in user mode FS is
    the user's (0) and GDT entry 27 still has it as its base."""
    offsets = i386_offsets()
    assert offsets[0] != offsets[1]
    for regs in I386_REGISTERS:
        memory = i386_memory(regs.vcpu)
        areas = I386_NM["__per_cpu_offset"] + I386_SLIDE
        if regs.cpl == 0:
            assert regs.fs_base == offsets[regs.vcpu]
        else:
            assert regs.fs_base == 0
            descriptor = memory.read_u64(regs.gdt_base + PERCPU_OFFSET_32)
            assert segment_base(descriptor) == offsets[regs.vcpu]
        assert per_cpu_area_32(areas, regs, memory) == offsets[regs.vcpu]
        # without the GDT (an older capture): CPU n is vCPU n
        assert (
            per_cpu_area_32(areas, replace(regs, gdt_base=0, fs_base=0), memory)
            == (offsets[regs.vcpu])
        )


def test_i386_user_registers_are_the_pt_regs_below_the_stack_top() -> None:
    """A vCPU in the kernel on behalf of a user task: the user's registers from the 17
    4-byte pt_regs slots 8 bytes below cpu_current_top_of_stack; the stack is 8 KiB."""
    linux = i386_adapter()
    (kernel,) = (regs for regs in I386_REGISTERS if regs.cpl == 0)
    memory = i386_memory(kernel.vcpu)
    user = linux.user_registers(kernel, memory)
    assert user is not None
    # recorded inside entry_SYSENTER_32, before it fills its frame's ip and sp (0 there
    # yet): the saved CS (user mode) is what says these are a user's registers
    assert len(user) == REGISTER_COUNT and user[16] is not None and user[7] is not None
    stack = linux.kernel_stack(kernel, memory)
    assert stack is not None and stack[1] == 8192 and stack[0] % 8192 == 0
