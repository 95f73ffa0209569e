"""The Linux example guest (Debian's 6.1 kernel, KASLR off, 2 vCPUs; QMPPROF_LINUX_GDB_ABI
and QMPPROF_LINUX_GDB_KASLR=1 pick another kernel and KASLR on, QMPPROF_LINUX_GDB_CPU=max
QEMU's CPU model with 5-level paging): with GDB holding
the VM stopped at random points, `qmpprof dump --json` must agree with GDB frame for
frame on each vCPU, by the rules of test_gdb_agreement.py (same addresses, same
function wherever GDB names one, inlined calls listed above their caller).

GDB is the oracle, given the debug vmlinux and, per vCPU, the workload its current task
runs (examples/linux/build/COMM, static and not PIE: add-symbol-file at link addresses).
Each vCPU's sample falls in one class, decided from what GDB reads in the guest:
  idle            the per-CPU idle task (pid 0)
  kernel thread   a task with PF_KTHREAD
  user task (kernel)  a user task in kernel mode: its kernel frames, and its whole
                  stack, the user frames below them as perf draws it. GDB's user part
                  is a second backtrace from the user registers the kernel saved
                  (pt_regs at the top of the task's stack), set into GDB's registers
                  for that one backtrace and restored exactly afterwards
  user            a user task in user mode
Every class must agree in full (docs/accuracy.md's figures: every class, every sample,
over sweeps of 100 and 150 pauses). Where GDB itself cannot be trusted, see
`trusted_kernel_frames`; the samples that have no oracle are counted apart, each decided
from GDB's frames, never from qmpprof's: a leaf in __switch_to_asm (NO_ORACLE), and, for
the whole stack only, a vCPU still saving the user's registers (saving_user_registers) or
mid context switch (switching_address_space).

At each pause qmpprof runs twice: given the debug vmlinux, loop.ko and each workload
(`--user`), and given no file at all, as a user with a stock guest runs it (kernel,
modules and programs read from the guest's memory). The second has no DWARF, so GDB's
inlined calls are left out of what it is compared with (`Agreement.from_memory`).

With KASLR on, GDB loads the vmlinux at the slide the guest says (init prints where
/proc/kallsyms puts asm_exc_divide_error), not at qmpprof's. When the loopread workload
runs, GDB loads loop.ko's debug file (from the kernel's -dbg .deb) at the sections
/sys/module/loop/sections gives, and qmpprof is given the guest's loop.ko (--module-dir).

With page-table isolation (QMPPROF_LINUX_GDB_APPEND=pti=on) a vCPU in user mode, or in
the entry code before it switches CR3, runs on the user half of its PGD pair, which maps
almost none of the kernel, and GDB reads memory through the vCPU's own CR3 (QEMU's
gdbstub): the task, the per-CPU areas, the kernel stack were unreadable. The oracle then
sets the vCPU's CR3 to the kernel half of the pair (bit 12 clear: the kernel allocates the
two as an 8 KiB pair, its own first) for its reads, through QEMU's gdbstub, which writes
CR3 as the guest would, and puts it back exactly afterwards, checked (LinuxOracle.
kernel_tables); qmpprof reads the kernel through the kernel's tables by itself
(target/direct.py: isolated_kernel_root).

The pauses are drawn from a fixed seed (tests.seeds; QMPPROF_SEED=N draws others).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.guest_vm import qmp_call
from tests.integration.conftest import run_cached
from tests.integration.gdb_mi import (
    Frames,
    GdbFrame,
    GdbMi,
    agree,
    same_function,
    text_aliases,
    without_hidden_inline_leaf,
)
from tests.linux_vm import (
    BOOT,
    MID_SWITCH,
    LinuxGuest,
    kernel_slide,
    module_debug_file,
    module_sections,
    nm_symbols,
    running_linux,
)
from tests.seeds import seeded

VCPUS = 2
BUILD = BOOT.parent / "build"
#: The programs init starts (examples/linux/Makefile), each named after its comm.
PROGRAMS = ("init", "crunch", "crunchnofp", "sysloop", "pinned", "sleeper", "loopread")
#: The kernel (`fetch.sh --list`; boot.sh's default if unset) and KASLR (on if "1").
ABI = os.environ.get("QMPPROF_LINUX_GDB_ABI") or None
KASLR = os.environ.get("QMPPROF_LINUX_GDB_KASLR") == "1"
#: QEMU's CPU model (boot.sh's default, qemu64, if unset; `max`: 5-level paging).
CPU = os.environ.get("QMPPROF_LINUX_GDB_CPU") or None
#: Kernel command-line arguments added at boot (`pti=on`: page-table isolation).
APPEND = os.environ.get("QMPPROF_LINUX_GDB_APPEND") or None
#: The module the loopread workload loads (its path under lib/modules/ABI/kernel/).
LOOP_MODULE = "drivers/block/loop"
PAUSES = int(os.environ.get("QMPPROF_LINUX_GDB_PAUSES", "20"))
#: The wider sweep: QMPPROF_LINUX_GDB_SWEEP=N pauses (hundreds). Each pause costs a
#: `qmpprof dump` that loads the 600 MB vmlinux (8-15 s on a busy 2-core TCG host), so
#: the sweep only runs when asked for, or `make test` would grow by most of an hour.
SWEEP_PAUSES = int(os.environ.get("QMPPROF_LINUX_GDB_SWEEP", "0"))
KERNEL_HALF = 0xFFFF_8000_0000_0000
#: CR3's bit that picks the user half of a PTI PGD pair (arch/x86/mm/pti.c: PTI_PGTABLE_SWITCH_BIT).
PTI_USER_HALF = 0x1000
PF_KTHREAD = 0x0020_0000
#: Where the kernel is entered and left: assembly without CFI, below which GDB guesses.
#: error_entry (called by the asm_* stubs to push and switch to the task's stack) has a
#: pt_regs frame in ORC: the kernel's own unwinder, and qmpprof, go from it straight to
#: the interrupted code, where GDB lists the asm_* stub it returns to or, while the
#: return address is in a register (5.10, between `popq %r12` and `pushq %r12`),
#: garbage. On the way out, swapgs_restore_regs_and_return_to_usermode (6.1; at the same
#: address as common_interrupt_return and the __irqentry_text_end label, GDB names it
#: by either) pops pt_regs and ends in iretq: ORC describes the iret frame left on the
#: stack, GDB lists the words above it as frames (seen: 0x33, the user CS, named
#: fixed_percpu_data).
#: The interrupt exits end in native_iret (5.10) or early_xen_iret_patch (6.1, 6.12; the
#: check of the stack segment, the iretq at native_irq_return_iret): exit code too.
#: Entry and exit code. asm_load_gs_index is not: an ordinary leaf (swapgs, mov to %gs,
#: swapgs, ret) that __switch_to calls; GDB's frames past it are its callers.
ENTRY = re.compile(
    r"entry_SYSCALL_64\w*|asm_(?!load_gs_index$)\w+|ret_from_fork\w*|entry_INT80\w*|error_entry"
    r"|__irqentry_text_end|common_interrupt_return|swapgs_restore_regs_and_return_to_usermode"
    r"|restore_regs_and_return_to_kernel|error_return"
    r"|native_iret|native_irq_return_iret|native_irq_return_ldt|early_xen_iret_patch"
)
#: GDB's registers that pt_regs holds, with pt_regs's name for each.
USER_REGISTERS = {
    **{f"r{n}": f"r{n}" for n in range(8, 16)},
    **{f"r{name}": name for name in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip")},
}
GDB_TIMEOUT_S = 900  # see LinuxOracle: GDB's first look into struct task_struct
TASK_COMM_LEN = 16

IDLE, KTHREAD, USER_TASK_KERNEL, USER_TASK_WHOLE, USER = (
    "idle",
    "kernel thread",
    "user task in the kernel, kernel part",
    "user task in the kernel, whole stack",
    "user",
)
THRESHOLDS = {IDLE: 1.0, KTHREAD: 1.0, USER_TASK_KERNEL: 1.0, USER_TASK_WHOLE: 1.0, USER: 1.0}
#: A stop in __switch_to_asm's return stack buffer fill (test_a_stop_in_the_return_stack_
#: buffer_fill_agrees_with_gdb), kernel frames only: the user frames below are the next
#: task's, named after the task switched out (switching_address_space).
SWITCHED = "switching to the next task's stack"
THRESHOLDS[SWITCHED] = 1.0
#: struct inactive_task_frame (arch/x86/include/asm/switch_to.h), from its lowest word:
#: GDB's name of each register it saves.
TASK_FRAME = ("r15", "r14", "r13", "r12", "rbx", "rbp", "return")


@dataclass(frozen=True)
class KernelLayout:
    """What the oracle needs of the vmlinux, from its symbol table (nm), not from qmpprof.
    Per-CPU symbols are offsets in each CPU's area, which KASLR does not move."""

    current_task: int  # the per-CPU variable's offset: current_task, or pcpu_hot (6.12)
    in_pcpu_hot: bool  # current_task is pcpu_hot.current_task (GDB gives the member's offset)
    thread_size: int  # the init task's stack: __end_init_task - __start_init_task (6.1)

    @classmethod
    def of(cls, vmlinux: Path) -> KernelLayout:
        nm = subprocess.run(["nm", str(vmlinux)], capture_output=True, text=True, check=True)
        symbols = {
            name: int(address, 16)
            for address, _, name in (line.split() for line in nm.stdout.splitlines())
            if name in (*INIT_STACK_SYMBOLS, "current_task", "pcpu_hot")
        }
        start, end = next(
            (symbols[f"__start_{name}"], symbols[f"__end_{name}"])
            for name in ("init_task", "init_stack")
            if f"__start_{name}" in symbols
        )
        if "current_task" in symbols:
            return cls(symbols["current_task"], False, end - start)
        return cls(symbols["pcpu_hot"], True, end - start)


#: The init task's stack, whose size is every task's: 6.1 names it *_init_task, 6.12
#: *_init_stack.
INIT_STACK_SYMBOLS = (
    "__start_init_task",
    "__end_init_task",
    "__start_init_stack",
    "__end_init_stack",
)


@dataclass(frozen=True)
class Task:
    address: int
    pid: int
    flags: int
    comm: str
    stack: int
    tgid: int

    @property
    def label(self) -> str:
        """How qmpprof must label a sample of this task (as perf and ps do): the idle
        task `[idle]`, a kernel thread `[comm]`, a user task `comm (tgid)`."""
        if self.pid == 0:
            return "[idle]"
        if self.flags & PF_KTHREAD:
            return f"[{self.comm}]"
        return f"{self.comm} ({self.tgid})"


@dataclass(frozen=True)
class Observed:
    """One vCPU as GDB sees it: its class, its kernel frames (trusted part) and user frames."""

    kind: str
    kernel: list[GdbFrame]
    kernel_complete: bool  # False: cut at an entry frame, more may follow in truth
    user: list[GdbFrame]
    comm: str
    #: The user registers GDB read are whole: where the entry pushed them (not yet
    #: copied to the task's stack), or in pt_regs on the way back to user space.
    user_registers_whole: bool = False
    #: The label of the task GDB reads as current (Task.label).
    label: str = ""


@dataclass(frozen=True)
class Aliases:
    kernel: dict[str, str]
    programs: dict[str, dict[str, str]]

    @classmethod
    def of(cls, vmlinux: Path) -> Aliases:
        programs = {name: text_aliases(BUILD / name) for name in PROGRAMS}
        return cls(text_aliases(vmlinux), programs)

    def name(self, address: int, function: str | None, comm: str) -> str | None:
        if not function:
            return function
        table = self.kernel if address >= KERNEL_HALF else self.programs.get(comm, {})
        return same_function(function, table)

    def gdb(self, frames: list[GdbFrame], comm: str) -> list[GdbFrame]:
        return [replace(f, function=self.name(f.address, f.function, comm)) for f in frames]

    def ours(self, frames: Frames, comm: str) -> Frames:
        return [(address, self.name(address, name, comm)) for address, name in frames]


class KernelLabels:
    """The vmlinux's assembly labels inside a sized function (nm -S: a label has no size),
    e.g. entry_SYSCALL_64_after_hwframe inside entry_SYSCALL_64. kallsyms keeps no sizes,
    so a kernel read from memory names a pc past such a label by the label, as perf does
    with /proc/kallsyms; GDB names the function. Agreement then means: the label lies in
    the function GDB names."""

    def __init__(self, vmlinux: Path) -> None:
        listed = subprocess.run(
            ["nm", "-S", "--defined-only", str(vmlinux)], capture_output=True, text=True, check=True
        )
        self.functions: list[tuple[int, int, str]] = []
        self.labels: dict[str, int] = {}
        for line in listed.stdout.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[2] in "tT" and int(fields[1], 16):
                start = int(fields[0], 16)
                self.functions.append((start, start + int(fields[1], 16), fields[3]))
            elif len(fields) == 3 and fields[1] in "tT":
                self.labels[fields[2]] = int(fields[0], 16)
        self.functions.sort()

    def function(self, address: int, name: str | None, slide: int) -> str | None:
        """The sized function `name` is a label inside, if it is one at `address`."""
        label = self.labels.get(name or "")
        index = bisect.bisect_right(self.functions, (address - slide, 1 << 64, "")) - 1
        if label is None or index < 0:
            return name
        start, end, function = self.functions[index]
        # A return address may be the function's end (its last instruction is a call).
        inside = start <= address - slide <= end and start <= label < end
        return function if inside else name


class LinuxOracle:
    """GDB's view of each vCPU of the paused Linux guest."""

    def __init__(self, gdb: GdbMi, layout: KernelLayout, module_dir: Path | None) -> None:
        self.gdb = gdb
        self.layout = layout
        self.module_dir = module_dir  # qmpprof's --module-dir, if the guest loaded one
        with self.kernel_tables(1):  # vCPU 0 may be in user mode (pti=on)
            self.per_cpu = {self.number(f"__per_cpu_offset[{cpu}]", 1) for cpu in range(VCPUS)}
        gdb.command("-gdb-set backtrace past-main on")  # qmpprof goes on to _start
        # GDB's first member of struct task_struct takes minutes (it expands compilation
        # units that only declare the struct): paid here, once, not in the first pause.
        assert self.number("sizeof(((struct task_struct *)0)->comm)", 1) == TASK_COMM_LEN
        member = "(unsigned long)&((struct pcpu_hot *)0)->current_task"
        self.current_task = layout.current_task + (
            self.number(member, 1) if layout.in_pcpu_hot else 0
        )

    def number(self, expression: str, thread: int) -> int:
        value = self.gdb.evaluate(f'"{expression}"', thread)  # one MI argument
        assert value is not None, f"GDB cannot evaluate {expression}"
        return int(value.split()[0], 0) & (1 << 64) - 1  # GDB prints some registers signed

    def task(self, thread: int) -> Task:
        """The current task of the CPU on this vCPU: per-CPU current_task, at whichever of
        GS and KERNEL_GS is this CPU's per-CPU area (swapgs swaps them at entry)."""
        bases = {self.number(f"${r}", thread) for r in ("gs_base", "k_gs_base")} & self.per_cpu
        assert len(bases) == 1, f"vCPU {thread - 1}: no per-CPU area in GS or KERNEL_GS"
        address = self.number(f"*(unsigned long *){bases.pop() + self.current_task:#x}", thread)
        field = f"((struct task_struct *){address:#x})->"
        comm = self.gdb.evaluate(f'"{field}comm"', thread) or ""
        quoted = re.match(r'^\\"([^\\]*)', comm)  # "crunch\000…" or "sleeper", '\000' <repeats…>
        return Task(
            address,
            self.number(f"{field}pid", thread),
            self.number(f"{field}flags", thread),
            quoted.group(1) if quoted else "",
            self.number(f"(unsigned long){field}stack", thread),
            self.number(f"{field}tgid", thread),
        )

    def observe(self, thread: int, pushed_at: int | None = None) -> Observed:
        """`pushed_at`: where the entry pushed the user registers, when they are not yet
        copied to the task's stack (a stop at sync_regs's first instruction)."""
        with self.kernel_tables(thread):
            task = self.task(thread)
            return replace(self._observe(thread, task, pushed_at), label=task.label)

    @contextmanager
    def kernel_tables(self, thread: int) -> Iterator[None]:
        """The vCPU on the kernel's half of its PTI PGD pair for the block (see the
        module's docstring), its CR3 put back exactly afterwards; as it is without PTI
        or where it holds the kernel's half already."""
        cr3 = self.cr3(thread)
        if not cr3 & PTI_USER_HALF:
            yield
            return
        self.gdb.write_register(thread, "cr3", cr3 & ~PTI_USER_HALF)
        try:
            yield
        finally:
            self.gdb.write_register(thread, "cr3", cr3)
            self.gdb.console("maintenance flush register-cache")
            assert self.cr3(thread) == cr3, "the vCPU's CR3 was not restored"

    def cr3(self, thread: int) -> int:
        """The vCPU's CR3 (GDB prints the expression `$cr3` as its fields)."""
        return int(self.gdb.registers(thread)["cr3"], 16)

    def _observe(self, thread: int, task: Task, pushed_at: int | None) -> Observed:
        user_mode = self.number("$cs", thread) & 3 == 3
        if user_mode:
            return Observed(USER, [], True, self.user_frames(thread, task.comm), task.comm)
        kernel, complete = trusted_kernel_frames(self.frames(thread))
        if task.pid == 0:
            return Observed(IDLE, kernel, complete, [], task.comm)
        if task.flags & PF_KTHREAD:
            return Observed(KTHREAD, kernel, complete, [], task.comm)
        user = self.frames_from_saved_user_registers(thread, task, pushed_at)
        return Observed(USER_TASK_KERNEL, kernel, complete, user, task.comm, pushed_at is not None)

    def user_frames(self, thread: int, comm: str) -> list[GdbFrame]:
        program = BUILD / comm
        if comm not in PROGRAMS or not program.exists():
            return self.frames(thread)
        with self.gdb.symbols_from(program):
            return self.frames(thread)

    def frames(self, thread: int) -> list[GdbFrame]:
        """GDB's backtrace without the frames it makes up for tail calls (hrtimer_interrupt
        calls tick_program_event, which jumps to clockevents_program_event: GDB lists
        tick_program_event at the address after that jump; no unwinder can see it)."""
        made_up = self.gdb.tail_call_levels(thread)
        return [f for f in self.gdb.frames(thread) if f.level not in made_up]

    def frames_from_saved_user_registers(
        self, thread: int, task: Task, pushed_at: int | None = None
    ) -> list[GdbFrame]:
        """GDB's backtrace from the pt_regs at the top of the task's kernel stack (where
        every entry from user mode saves the user registers), or at `pushed_at`, with
        GDB's registers set to them for that backtrace only: each is put back as it was,
        and checked. (In the first instructions of entry_SYSCALL_64, before it pushes
        them, they are the previous entry's: a rare sample there can disagree in its user
        part.)"""
        top = task.stack + self.layout.thread_size
        pointer = f"{pushed_at:#x}" if pushed_at is not None else f"{top:#x} - 1"
        regs = f"((struct pt_regs *){pointer})->"
        if self.number(f"{regs}cs", thread) & 3 != 3:
            return []  # not (yet) user registers: a task that never left the kernel
        values = {r: self.number(f"{regs}{member}", thread) for r, member in USER_REGISTERS.items()}
        with self.registers_set(thread, values):
            return self.user_frames(thread, task.comm)

    def frames_from_pt_regs(self, thread: int, address: int) -> tuple[list[GdbFrame], bool]:
        """GDB's kernel frames (trusted_kernel_frames) from the kernel registers an
        interrupt or exception taken in kernel mode saved at `address` (its pt_regs),
        GDB's registers set to them for that backtrace only."""
        regs = f"((struct pt_regs *){address:#x})->"
        assert self.number(f"{regs}cs", thread) & 3 == 0, "not a kernel mode's pt_regs"
        values = {r: self.number(f"{regs}{member}", thread) for r, member in USER_REGISTERS.items()}
        with self.registers_set(thread, values):
            return trusted_kernel_frames(self.frames(thread))

    @contextmanager
    def registers_set(self, thread: int, values: dict[str, int]) -> Iterator[None]:
        """GDB's registers of `thread` set to `values` for the block (a backtrace from
        them), each put back as it was afterwards, and checked."""
        saved = self.gdb.registers(thread)
        try:
            for register, value in values.items():
                self.gdb.set_register(thread, register, value)
            yield
        finally:
            for register in values:
                self.gdb.set_register(thread, register, int(saved[register], 16))
            self.gdb.console("maintenance flush register-cache")
            assert self.gdb.registers(thread) == saved, "the vCPU's registers were not restored"

    def observe_switch(self, thread: int, fill: range, pushed: int) -> Observed:
        """A vCPU stopped in __switch_to_asm's return stack buffer fill (`fill`: its code)
        after its slots pushed `pushed` bytes, on the next task's stack: its kernel
        frames are __switch_to_asm's and GDB's backtrace from the struct
        inactive_task_frame above them (r15, r14, r13, r12, rbx, rbp, return address),
        which the next task pushed when it was switched out."""
        leaf = self.number("$pc", thread)
        rsp = self.number("$rsp", thread)
        slots = [self.word(rsp + 8 * n) for n in range(pushed // 8)]
        assert all(address in fill for address in slots), f"not the fill's slots: {slots}"
        frame = {name: self.word(rsp + pushed + 8 * n) for n, name in enumerate(TASK_FRAME)}
        frame |= {"rip": frame.pop("return"), "rsp": rsp + pushed + 8 * len(TASK_FRAME)}
        with self.registers_set(thread, frame):
            above = self.frames(thread)
        frames = [GdbFrame(0, leaf, "__switch_to_asm"), *above]
        kernel, complete = trusted_kernel_frames(frames)
        task = self.task(thread)
        return Observed(SWITCHED, kernel, complete, [], task.comm, label=task.label)

    def word(self, address: int) -> int:
        return int.from_bytes(self.gdb.read_memory(address, 8), "little")


def trusted_kernel_frames(frames: list[GdbFrame]) -> tuple[list[GdbFrame], bool]:
    """GDB's kernel frames down to the first entry frame (entry_SYSCALL_64, asm_*,
    error_entry, ret_from_fork), and whether nothing was cut. These are assembly without CFI in
    .debug_frame: GDB goes on past them by guessing and lists garbage (addresses like 0x1
    named fixed_percpu_data). What lies below an entry frame taken in kernel mode (the
    interrupted kernel code) is therefore not checked; below one taken in user mode the
    user frames come from pt_regs instead."""
    for index, frame in enumerate(frames):
        if frame.function and ENTRY.fullmatch(frame.function):
            return frames[: index + 1], index + 1 == len(frames)
    while frames and frames[-1].address == 0:
        # The zero return address under secondary_startup_64 marks the stack's end; GDB
        # still lists it as a frame at pc 0 ("??"), qmpprof ends the stack there.
        frames = frames[:-1]
    return frames, True


def test_gdb_is_trusted_down_to_the_exit_path_as_to_an_entry() -> None:
    """GDB's frames at a pause in 6.1's return to user mode (make test, 2026-11-27):
    past the exit path's first frame they are the iret frame's words read as frames."""
    seen = [
        (0xFFFF_FFFF_81C0_11E9, "__irqentry_text_end"),
        (0x5C_D0D4_B86F_0569, None),
        (0x4016D8, None),
        (0x33, None),
        (0x2B, "fixed_percpu_data"),
    ]
    frames = [GdbFrame(level, address, name) for level, (address, name) in enumerate(seen)]
    assert trusted_kernel_frames(frames) == (frames[:1], False)


def test_gdb_is_trusted_down_to_error_return() -> None:
    """A pause in 6.1's error_return, an exception's way back to user mode (make test,
    2026-11-28): GDB listed the words of pt_regs as frames (0x1 named
    fixed_percpu_data, 0x401650 unnamed), qmpprof went from its pt_regs row to mix."""
    seen = [(0xFFFF_FFFF_81C0_1620, "error_return"), (0x1, "fixed_percpu_data"), (0x4, None)]
    frames = [GdbFrame(level, address, name) for level, (address, name) in enumerate(seen)]
    assert trusted_kernel_frames(frames) == (frames[:1], False)


def test_gdb_is_trusted_past_asm_load_gs_index() -> None:
    """A pause in __switch_to's asm_load_gs_index (make test, 2026-11-27): GDB's frames
    were cut there as at an interrupt's asm_ entry, and the kernel thread switched out
    seemed to have the next task's user frames below its kernel stack."""
    seen = [
        (0xFFFF_FFFF_81C0_12E0, "asm_load_gs_index"),
        (0xFFFF_FFFF_8107_E875, "native_load_gs_index"),
        (0xFFFF_FFFF_8103_1359, "__switch_to"),
        (0xFFFF_FFFF_81C0_0126, "entry_SYSCALL_64"),
    ]
    frames = [GdbFrame(level, address, name) for level, (address, name) in enumerate(seen)]
    assert trusted_kernel_frames(frames) == (frames, True)


def test_a_kernel_thread_under_an_interrupt_s_entry_is_compared_as_far_as_gdb_went() -> None:
    """make test, 2026-11-27: GDB ended ksoftirqd/0's stack at the timer interrupt's
    entry and qmpprof went on into the interrupted softirq down to ret_from_fork; a
    kernel thread's stack never ends at an interrupt's entry (taken in kernel mode). A
    user task's may (taken in user mode)."""
    seen = [
        (0xFFFF_FFFF_81A3_C97D, "sysvec_apic_timer_interrupt"),
        (0xFFFF_FFFF_81C0_0F06, "asm_sysvec_apic_timer_interrupt"),
    ]
    frames = [GdbFrame(level, address, name) for level, (address, name) in enumerate(seen)]
    ours: Frames = [*seen, (0xFFFF_FFFF_81A4_F129, "_raw_spin_unlock_irqrestore")]
    for kind in (KTHREAD, IDLE):
        assert kernel_part_agrees(Observed(kind, frames, True, [], "ksoftirqd/0"), ours)
    assert not kernel_part_agrees(Observed(USER_TASK_KERNEL, frames, True, [], "crunch"), ours)


def kernel_part_agrees(observed: Observed, ours: Frames) -> bool:
    if observed.kernel_complete and not gdb_gave_up(observed):
        return agree(observed.kernel, ours)
    return agree(observed.kernel, ours[: len(observed.kernel)])


#: x86-64's MODULES_VADDR with KASLR's 1 GiB kernel image: module code lies above it.
MODULES_START = 0xFFFF_FFFF_C000_0000


def without_module_inlines(frames: list[GdbFrame], start: int = MODULES_START) -> list[GdbFrame]:
    """GDB's frames with the calls inlined in a module's code left out: of the frames GDB
    lists at one module address, the last (the function whose code it is). qmpprof reads
    a module's symbols and ORC, not its DWARF (qmpprof/symbols/kernel_object.py), so it
    names module code by its symbol only (seen: GDB's lo_read_simple, do_req_filebacked,
    loop_handle_cmd, loop_process_work at one address of loop.ko, qmpprof's
    loop_process_work), which issue 15 asks of modules ("at least by name"). `start`:
    from where on; KERNEL_HALF for a kernel read from memory (kallsyms: no DWARF), 0 for
    programs read from memory too (their symbol tables: no DWARF)."""
    return [
        frame
        for frame, older in zip(frames, [*frames[1:], None], strict=False)
        if not (frame.address >= start and older and older.address == frame.address)
    ]


#: Assembly without CFI where GDB's backtrace is a guess (seen: data words listed as
#: frames in __switch_to_asm): a vCPU sample that stopped there at random has no oracle.
#: Where __switch_to_asm fills the return stack buffer, with calls the kernel patched in
#: at boot that 6.1's ORC does not describe (qmpprof took a saved register for the
#: caller's pc before unwind/orc_mends.py), test_a_stop_in_the_return_stack_buffer_fill_
#: agrees_with_gdb stops it on purpose and builds the oracle from the frame it switches to.
NO_ORACLE = frozenset({"__switch_to_asm"})


def gdb_gave_up(observed: Observed) -> bool:
    """A kernel stack always ends at an entry frame (from user space; ret_from_fork for
    a kernel thread) or, for an idle task, at secondary_startup_64; GDB's that ends
    elsewhere is where GDB stopped, not the stack: what it has is compared, not what it
    lacks. Seen on every class: GDB ends an interrupt at sysvec_apic_timer_interrupt,
    without asm_sysvec_apic_timer_interrupt and the interrupted code below it (the
    handler ran on the IRQ stack; when the interrupted task's stack lies below it in
    memory, the caller's frame is "inner" to the handler's, and GDB stops there as it
    does on a corrupt stack), where qmpprof, like the kernel's ORC unwinder, goes on to
    the idle loop, the kworker's process_one_work or the system call. An idle task's or
    kernel thread's stack never ends at an interrupt's entry (it was taken in kernel
    mode): GDB that ends there stopped (seen: ksoftirqd under
    asm_sysvec_apic_timer_interrupt, where qmpprof goes on to ret_from_fork)."""
    last = observed.kernel[-1].function if observed.kernel else None
    if observed.kind in (IDLE, KTHREAD):
        return not (last and (last in STACK_BOTTOMS or last.startswith("ret_from_fork")))
    return not (last and (ENTRY.fullmatch(last) or last in STACK_BOTTOMS))


#: Where an idle task's stack ends (the boot CPU's through start_kernel, the others'
#: through start_secondary).
STACK_BOTTOMS = {"secondary_startup_64"}


@dataclass
class ClassTally:
    samples: int = 0
    agreed: int = 0
    disagreements: list[str] = field(default_factory=list)

    def add(
        self, agrees: bool, observed: Observed, gdb: list[GdbFrame], ours: Frames, label: str
    ) -> None:
        """`label`: qmpprof's, which must be the task's as GDB read it."""
        agrees = agrees and label == observed.label
        self.samples += 1
        self.agreed += agrees
        if not agrees:
            self.disagreements.append(
                f"{observed.label}, labelled {label!r} by qmpprof:\n"
                f"    gdb:     {[(hex(f.address), f.function) for f in gdb]}"
                f"{'' if observed.kernel_complete else ' (GDB cut at the entry frame)'}\n"
                f"    qmpprof: {[(hex(a), n) for a, n in ours]}"
            )

    @property
    def agreement(self) -> float:
        """The share of samples that agreed; none for a class never seen."""
        return self.agreed / self.samples if self.samples else 0.0


@dataclass
class Agreement:
    pauses: int
    aliases: Aliases
    guest: str = ""  # the kernel and KASLR
    seconds: float = 0.0
    classes: dict[str, ClassTally] = field(
        default_factory=lambda: {kind: ClassTally() for kind in THRESHOLDS}
    )
    #: qmpprof's frames came without a kernel file or the programs' files: GDB's
    #: inlined calls (DWARF only), the kernel's and the programs', are left out, as for
    #: a module.
    from_memory: bool = False
    #: The same pauses, qmpprof given no kernel file (measure).
    memory: Agreement | None = None
    #: With `from_memory`: the vmlinux's labels, and the guest's slide.
    labels: KernelLabels | None = None
    slide: int = 0
    #: Samples with no oracle (NO_ORACLE), counted in no class.
    unjudged: int = 0
    #: User tasks' kernel samples whose whole stack has no oracle (saving_user_registers,
    #: switching_address_space): their kernel part is counted, their whole stack is not.
    whole_unjudged: int = 0
    #: GDB's leaf function of each, counted (the table says where they were).
    unjudged_leaves: Counter[str] = field(default_factory=Counter)

    def add(self, seen: Observed, dumped: Dumped) -> None:
        label, frames = dumped
        if seen.kernel and seen.kernel[0].function in NO_ORACLE and seen.kind != SWITCHED:
            self.unjudged += 1
            return
        comm = seen.comm
        gdb = self.aliases.gdb
        inlines_from = KERNEL_HALF if self.from_memory else MODULES_START
        gdb_kernel = without_module_inlines(gdb(seen.kernel, comm), inlines_from)
        gdb_user = gdb(seen.user, comm)
        if self.from_memory:
            gdb_user = without_module_inlines(gdb_user, 0)
        observed = replace(seen, kernel=gdb_kernel, user=gdb_user)
        gdb_leaf_first = observed.kernel or observed.user
        if self.labels is not None:
            labels, slide = self.labels, self.slide
            frames = [
                (a, labels.function(a, n, slide) if a >= KERNEL_HALF else n) for a, n in frames
            ]
        ours = without_hidden_inline_leaf(self.aliases.ours(frames, comm), gdb_leaf_first)
        ours_kernel = [(a, n) for a, n in ours if a >= KERNEL_HALF]
        ours_user = [(a, n) for a, n in ours if a < KERNEL_HALF]
        if observed.kind == USER:
            self.classes[USER].add(agree(observed.user, ours), observed, observed.user, ours, label)
            return
        kernel = kernel_part_agrees(observed, ours_kernel)
        if observed.kind == SWITCHED:
            self.classes[SWITCHED].add(kernel, observed, observed.kernel, ours, label)
            return
        if observed.kind != USER_TASK_KERNEL:
            # Mid context switch RSP is already on the next task's stack while `current`
            # still names the idle task or kernel thread switched out: the next task's
            # user frames may follow (seen: swapper/0 in __switch_to over a pread).
            user_allowed = switching_address_space(seen)
            agrees = kernel and (user_allowed or not ours_user)
            self.classes[observed.kind].add(agrees, observed, observed.kernel, ours, label)
            return
        self.classes[USER_TASK_KERNEL].add(kernel, observed, observed.kernel, ours, label)
        # GDB's own frames, its inlined calls included (context_switch inside __schedule).
        if saving_user_registers(seen) or switching_address_space(seen):
            self.whole_unjudged += 1
            self.unjudged_leaves[str(seen.kernel[0].function if seen.kernel else None)] += 1
            return
        whole = kernel and agree(observed.user, ours_user)
        both = observed.kernel + observed.user
        self.classes[USER_TASK_WHOLE].add(whole, observed, both, ours, label)

    def table(self) -> str:
        lines = [f"Linux guest vs GDB: {self.pauses} pauses in {self.seconds:.0f} s ({self.guest})"]
        if self.unjudged:
            lines.append(f"  no oracle (a leaf in {', '.join(sorted(NO_ORACLE))}): {self.unjudged}")
        if self.whole_unjudged:
            lines.append(
                f"  whole stack without an oracle (saving the user's registers, or mid context"
                f" switch): {self.whole_unjudged}"
            )
            leaves = ", ".join(f"{n} {leaf}" for leaf, n in self.unjudged_leaves.most_common())
            lines.append(f"    their leaves: {leaves}")
        for kind, tally in self.classes.items():
            if kind == SWITCHED and not tally.samples:
                continue  # only its own test stops there
            lines.append(
                f"  {kind:<38} {tally.agreed:>4}/{tally.samples:<4} {tally.agreement:6.1%}"
                f"  (needs {THRESHOLDS[kind]:.0%})"
            )
        for kind, tally in self.classes.items():
            for text in tally.disagreements[:3]:
                lines.append(f"  disagreement, {kind}, {text}")
        return "\n".join(lines)


class Dumped(NamedTuple):
    """One vCPU in `dump --json`: its process's label (`comm (pid)` as perf draws it, a
    kernel thread `[comm]`, idle `[idle]`) and its frames."""

    label: str
    frames: Frames

    @classmethod
    def of(cls, vcpu: dict[str, Any]) -> Dumped:
        process = vcpu["process"] or {"pid": None, "name": ""}
        pid = process["pid"]
        label = process["name"] if pid is None else f"{process['name']} ({pid})"
        return cls(label, [(int(f["address"], 16), f["function"]) for f in vcpu["frames"]])


def qmpprof_frames(
    guest: LinuxGuest, module_dir: Path | None, from_memory: bool = False
) -> dict[int, Dumped]:
    """`dump --json`'s vCPUs, given the debug vmlinux, loop.ko and the workloads, or with
    `from_memory` none of them: the kernel, its modules and the programs read from the
    guest's memory (the page cache holds the initramfs's files)."""
    users = [] if from_memory else [a for n in PROGRAMS for a in ("--user", str(BUILD / n))]
    modules = ["--module-dir", str(module_dir)] if module_dir and not from_memory else []
    kernel = [] if from_memory else ["--kernel", str(guest.kernel)]
    done = run_cached("dump", "--json", "--qmp-socket", guest.qmp, *kernel, *users, *modules)
    assert done.returncode == 0, done.stderr
    return {int(vcpu["vcpu"]): Dumped.of(vcpu) for vcpu in json.loads(done.stdout)["vcpus"]}


def measure(guest: LinuxGuest, oracle: LinuxOracle, pauses: int, name: str) -> Agreement:
    """GDB against qmpprof given the vmlinux, and (`Agreement.memory`) against qmpprof
    given no kernel file, at the same pauses."""
    rng = seeded(name)
    result, memory = agreements(guest, pauses, "")
    started = time.monotonic()
    for _ in range(pauses):
        oracle.gdb.resume()
        time.sleep(rng.uniform(0.001, 0.05))  # chooses where to pause; not a synchronisation
        oracle.gdb.interrupt()
        ours = qmpprof_frames(guest, oracle.module_dir)
        from_memory = qmpprof_frames(guest, oracle.module_dir, from_memory=True)
        status = qmp_call(guest.qmp, "query-status")
        assert isinstance(status, dict) and status["status"] == "paused", "qmpprof resumed it"
        for vcpu in range(VCPUS):
            observed = oracle.observe(vcpu + 1)
            result.add(observed, ours[vcpu])
            memory.add(observed, from_memory[vcpu])
    result.seconds = memory.seconds = time.monotonic() - started
    print(result.table())
    print(memory.table())
    return result


def agreements(guest: LinuxGuest, pauses: int, where: str) -> tuple[Agreement, Agreement]:
    """Empty tallies of qmpprof given the vmlinux (its `memory` the other) and of qmpprof
    given no kernel file, for `pauses` pauses (`where`: what they are, if not random)."""
    aliases = Aliases.of(guest.kernel)
    said = f"{guest.abi}, KASLR {'on' if KASLR else 'off'}{', ' + APPEND if APPEND else ''}{where}"
    result = Agreement(pauses, aliases, said)
    result.memory = Agreement(pauses, aliases, f"{said}, no --kernel", from_memory=True)
    result.memory.labels, result.memory.slide = KernelLabels(guest.kernel), kernel_slide(guest)
    return result, result.memory


@contextmanager
def guest_under_gdb(workdir: Path, *boot: str) -> Iterator[tuple[LinuxGuest, LinuxOracle]]:
    gdb_socket = str(workdir / "gdb.sock")
    kaslr = () if KASLR else ("--nokaslr",)
    cpu = ("--cpu", CPU) if CPU else ()
    append = ("--append", APPEND) if APPEND else ()
    with running_linux(
        workdir, *kaslr, *cpu, *append, "--smp", str(VCPUS), "--gdb", gdb_socket, *boot, abi=ABI
    ) as guest:
        gdb = GdbMi(guest.kernel, gdb_socket, timeout=GDB_TIMEOUT_S, offset=kernel_slide(guest))
        try:
            module_dir = load_loop_module(guest, gdb, workdir / "modules")
            yield guest, LinuxOracle(gdb, KernelLayout.of(guest.kernel), module_dir)
        finally:
            gdb.close()


def load_loop_module(guest: LinuxGuest, gdb: GdbMi, module_dir: Path) -> Path | None:
    """If the guest loaded loop.ko (the loopread workload): its debug file into GDB where
    the guest put its sections, and into `module_dir` for qmpprof's --module-dir (the
    same file: the guest's loop.ko has ORC but no DWARF, and without DWARF qmpprof could
    not list the calls inlined in the module as GDB does). None if it did not."""
    sections = module_sections(guest, "loop")
    if not sections:
        return None
    debug = module_debug_file(guest.abi, LOOP_MODULE)
    gdb.add_module(debug, sections)
    module_dir.mkdir(exist_ok=True)
    (module_dir / "loop.ko").symlink_to(debug)
    return module_dir


@pytest.fixture(scope="module")
def linux_under_gdb(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LinuxGuest, LinuxOracle]]:
    with guest_under_gdb(tmp_path_factory.mktemp("linux-gdb")) as guest_and_oracle:
        yield guest_and_oracle


@pytest.fixture(scope="module")
def agreement(linux_under_gdb: tuple[LinuxGuest, LinuxOracle]) -> Agreement:
    return measure(*linux_under_gdb, PAUSES, "linux gdb agreement")


@pytest.fixture(scope="module")
def quiet_agreement(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agreement]:
    """The guest with only `sleeper` and `loopread` running: its CPUs idle much of the
    time, and the loop device's kworker copies what loopread reads (the busy guest leaves
    neither idle nor kernel threads any time)."""
    workdir = tmp_path_factory.mktemp("linux-gdb-quiet")
    with guest_under_gdb(workdir, "--workloads", "sleeper,loopread") as (guest, oracle):
        yield measure(guest, oracle, PAUSES, "linux gdb agreement, quiet")


def saving_user_registers(observed: Observed) -> bool:
    """The vCPU stopped in the system-call or interrupt entry itself, while it still
    pushes the user's registers or copies them to the task's stack (sync_regs), and the
    oracle did not read them where they were pushed: its pt_regs then mix this entry's
    registers with the last one's (seen: `__libc_write` under `ask_parent`, which only calls
    `getppid`), so the whole stack has no oracle there; its kernel part still counts."""
    leaf = observed.kernel[0].function if observed.kernel else None
    if observed.user_registers_whole or leaf is None:
        return False
    return ENTRY.fullmatch(leaf) is not None or leaf == "sync_regs"  # copying them


def switching_address_space(observed: Observed) -> bool:
    """The vCPU stopped mid context switch: the user registers are the old task's, its
    address space is the new one's. GDB names the old task's user frames from its
    comm; qmpprof reads user memory and build-ids through the loaded CR3, so it leaves
    them unnamed (a known gap, README): the kernel part still counts."""
    names = {f.function for f in observed.kernel}
    leaf = observed.kernel[0].function if observed.kernel else None
    return bool(names & MID_SWITCH) or leaf == "context_switch"


def check(result: Agreement, kind: str) -> None:
    """Every sample of `kind` agrees, and there is one: each test asks it of the guest
    whose workloads give that class (the busy one user tasks, the quiet one idle CPUs
    and the loop device's kworker)."""
    tally = result.classes[kind]
    assert tally.samples > 0, f"no {kind} sample in {result.pauses} pauses\n{result.table()}"
    assert tally.agreement >= THRESHOLDS[kind], result.table()


def test_every_class_of_sample_was_seen(agreement: Agreement) -> None:
    """The workloads keep both vCPUs busy in user code and in system calls."""
    for kind in (USER, USER_TASK_KERNEL):
        assert agreement.classes[kind].samples > 0, agreement.table()


def test_user_samples_agree_with_gdb(agreement: Agreement) -> None:
    check(agreement, USER)


def test_idle_samples_agree_with_gdb(quiet_agreement: Agreement) -> None:
    """The disagreement once seen here (an idle CPU in rq_lock_irqsave, under a timer
    interrupt's softirq) was GDB's: it ended the stack at sysvec_apic_timer_interrupt
    (see gdb_gave_up)."""
    assert quiet_agreement.classes[IDLE].samples > 0, quiet_agreement.table()
    check(quiet_agreement, IDLE)


def test_kernel_thread_samples_agree_with_gdb(quiet_agreement: Agreement) -> None:
    """loopread keeps the loop device's kworker busy: kernel threads are always seen."""
    assert quiet_agreement.classes[KTHREAD].samples > 0, quiet_agreement.table()
    check(quiet_agreement, KTHREAD)


def test_kernel_part_of_user_task_samples_agrees_with_gdb(agreement: Agreement) -> None:
    check(agreement, USER_TASK_KERNEL)


def test_whole_stack_of_user_task_kernel_samples_agrees_with_gdb(agreement: Agreement) -> None:
    check(agreement, USER_TASK_WHOLE)


@pytest.mark.slow
@pytest.mark.skipif(SWEEP_PAUSES == 0, reason="QMPPROF_LINUX_GDB_SWEEP=N runs N pauses (hundreds)")
def test_a_wider_sweep_agrees_with_gdb_in_every_class(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """Every class at once, over many more pauses."""
    result = measure(*linux_under_gdb, SWEEP_PAUSES, "linux gdb sweep")
    # The busy guest may give no idle or kernel-thread sample (the quiet guest's tests
    # ask for them); a stop in __switch_to_asm's fill comes only from its own test.
    may_be_empty = {IDLE, KTHREAD, SWITCHED}
    for tally in (result, from_memory(result)):
        seen = {k for k, c in tally.classes.items() if c.samples or k not in may_be_empty}
        failed = [k for k in seen if tally.classes[k].agreement < THRESHOLDS[k]]
        assert not failed, tally.table()


def from_memory(result: Agreement) -> Agreement:
    assert result.memory is not None
    return result.memory


def stop_at(gdb: GdbMi, pc: int) -> tuple[int, str]:
    """Run the VM until a vCPU reaches `pc` (a hardware breakpoint, then deleted): that
    vCPU's GDB thread, and GDB's record of the stop."""
    return stop_at_any(gdb, [pc])


def stop_at_any(gdb: GdbMi, pcs: list[int]) -> tuple[int, str]:
    """stop_at, for the first vCPU to reach any of `pcs`."""
    for pc in pcs:
        gdb.command(f"-break-insert -h *{pc:#x}")
    gdb.resume()
    stopped = gdb.wait_for("*stopped")[-1]
    gdb.command("-break-delete")
    thread = int(re.search(r'thread-id="(\d+)"', stopped).group(1))  # type: ignore[union-attr]
    return thread, stopped


def judge(
    result: Agreement, guest: LinuxGuest, oracle: LinuxOracle, thread: int, observed: Observed
) -> None:
    """Tally qmpprof's frames of the vCPU GDB calls `thread`, given the vmlinux (in
    `result`) and given none (in its `memory`), against what GDB `observed`."""
    result.add(observed, qmpprof_frames(guest, oracle.module_dir)[thread - 1])
    from_memory(result).add(observed, qmpprof_frames(guest, oracle.module_dir, True)[thread - 1])


def every_stop_agreed(result: Agreement, kind: str | None, stops: int) -> None:
    """Both tallies printed, given the vmlinux and given no file; in each, `stops`
    samples of class `kind`, all agreeing (kind None: at least `stops` samples over
    the classes, every one agreeing)."""
    print(result.table())
    print(from_memory(result).table())
    for tally in (result, from_memory(result)):
        judged = [tally.classes[kind]] if kind is not None else tally.classes.values()
        samples = sum(t.samples for t in judged)
        assert samples == stops if kind is not None else samples >= stops, tally.table()
        assert all(t.agreed == t.samples for t in judged), tally.table()


#: Stops at sync_regs's first instruction.
SYNC_REGS_STOPS = 3


def test_a_stop_in_sync_regs_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stopped (a GDB breakpoint) as an interrupt or exception from user mode
    enters sync_regs, which copies the registers error_entry pushed on the entry stack to
    the task's: its return address is the stub's, where ORC's table says an interrupt
    frame 8 bytes up while every register lies pushed there (unwind/orc.py mends it;
    before, a user stack address was taken for a pc and the user frames were lost). GDB's
    user frames come from that copy's source, sync_regs's argument. qmpprof, with the
    vmlinux and with none, must agree on every stop."""
    guest, oracle = linux_under_gdb
    (site,) = nm_symbols(guest.kernel)["sync_regs"]
    site += kernel_slide(guest)
    result, _ = agreements(guest, SYNC_REGS_STOPS, ", stopped in sync_regs")
    gdb = oracle.gdb
    for _ in range(SYNC_REGS_STOPS):
        thread, stopped = stop_at(gdb, site)
        observed = oracle.observe(thread, pushed_at=oracle.number("$rdi", thread))
        assert observed.kind == USER_TASK_KERNEL and observed.kernel[0].address == site, stopped
        judge(result, guest, oracle, thread, observed)
    every_stop_agreed(result, USER_TASK_WHOLE, SYNC_REGS_STOPS)


#: One slot of a return stack buffer fill (a call past an int3), and the `add` that
#: drops two.
FILL_SLOT = b"\xe8\x01\x00\x00\x00\xcc"
DROP_TWO_SLOTS = b"\x48\x83\xc4\x10"


def test_a_stop_in_the_return_stack_buffer_fill_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stopped (GDB breakpoints) in the loop the kernel patched into
    __switch_to_asm at boot, which fills the return stack buffer with calls: at its
    first slot, its second and the `add` that drops them (0, 8 and 16 bytes pushed).
    ORC's entries there describe another alternative of the site: on 6.1 all three
    were unwound 8 or 16 bytes off (a saved register taken for the caller's pc) until
    unwind/orc_mends.py mended them from the code as it runs. qmpprof, with the vmlinux
    and with none, must agree with GDB on the next task's kernel frames at every stop."""
    guest, oracle = linux_under_gdb
    gdb = oracle.gdb
    (switch,) = nm_symbols(guest.kernel)["__switch_to_asm"]
    switch += kernel_slide(guest)
    code = gdb.read_memory(switch, 128)  # as the kernel patched it
    first = code.find(FILL_SLOT)
    assert first >= 0, f"no return stack buffer fill in __switch_to_asm: {code.hex()}"
    assert code[first + 6 : first + 16] == FILL_SLOT + DROP_TWO_SLOTS, code.hex()
    fill = range(switch + first, switch + first + 16)
    stops = {fill.start: 0, fill.start + 6: 8, fill.start + 12: 16}
    result, _ = agreements(guest, len(stops), ", stopped in the return stack buffer fill")
    for pc, pushed in stops.items():
        thread, stopped = stop_at(gdb, pc)
        observed = oracle.observe_switch(thread, fill, pushed)
        assert observed.kernel[0].address == pc, stopped
        judge(result, guest, oracle, thread, observed)
    every_stop_agreed(result, SWITCHED, len(stops))


#: The instruction after the system-call and interrupt exits switch to the CPU's entry
#: stack, pt_regs popped (`pushq RSP-RDI(%rdi)`, `pushq 6*8(%rdi)`): from the symbol
#: whose code holds it, its bytes.
RETURN_STOPS = {"entry_SYSCALL_64": b"\xff\x77\x28", "common_interrupt_return": b"\xff\x77\x30"}
#: Stops at each.
RETURN_STOP_COUNT = 2


def return_stop(gdb: GdbMi, guest: LinuxGuest, symbol: str) -> int:
    """The address in `symbol`'s code of RETURN_STOPS' instruction, read by GDB."""
    names = nm_symbols(guest.kernel)
    (start,) = names.get(symbol) or names["swapgs_restore_regs_and_return_to_usermode"]
    start += kernel_slide(guest)
    code = gdb.read_memory(start, 512)
    at = code.find(RETURN_STOPS[symbol])
    assert at >= 0, f"no {RETURN_STOPS[symbol].hex()} in {symbol}: {code.hex()}"
    return start + at


def test_a_stop_on_the_way_back_to_user_space_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stopped (GDB breakpoints) in the exits to user mode of a system call
    (sysretq's path) and of an interrupt or exception (iretq's), once pt_regs are popped
    and the CPU's entry stack is loaded: the kernel's ORC ends the stack there, and the
    user frames come from the registers the task's pt_regs still hold, as they will be
    restored (analysis.py's _with_user_side). Random pauses rarely land there. GDB's
    user frames come from that pt_regs; qmpprof, with the vmlinux and with none, must
    agree on every stop, the whole stack included."""
    guest, oracle = linux_under_gdb
    gdb = oracle.gdb
    sites = {symbol: return_stop(gdb, guest, symbol) for symbol in RETURN_STOPS}
    stops = len(sites) * RETURN_STOP_COUNT
    result, _ = agreements(guest, stops, ", stopped on the way back to user space")
    for site in sites.values():
        for _ in range(RETURN_STOP_COUNT):
            thread, stopped = stop_at(gdb, site)
            observed = replace(oracle.observe(thread), user_registers_whole=True)
            assert observed.kind == USER_TASK_KERNEL and observed.user, stopped
            assert observed.kernel[0].address == site, stopped
            judge(result, guest, oracle, thread, observed)
    every_stop_agreed(result, USER_TASK_WHOLE, stops)


def return_from_system_call(gdb: GdbMi) -> int:
    """Where entry_SYSCALL_64 goes on once do_syscall_64 has returned: the address after
    its call, from GDB's disassembly of the running kernel."""
    code = gdb.instructions("entry_SYSCALL_64", 120)
    calls = [
        i for i, (_, op, args) in enumerate(code) if op == "call" and "<do_syscall_64>" in args
    ]
    assert calls and calls[0] + 1 < len(code), f"no call of do_syscall_64 in {code}"
    return code[calls[0] + 1][0]


def step_instruction(gdb: GdbMi, thread: int) -> None:
    gdb.command(f"-thread-select {thread}")
    gdb.command("-exec-step-instruction", done="^running")
    gdb.wait_for("*stopped")


#: x86's `call rel32` (e8 and four bytes): entry_SYSCALL_64's call of do_syscall_64.
CALL_REL32_BYTES = 5
#: The most instructions from do_syscall_64's return to user mode (6.1's path is ~60).
MAX_RETURN_STEPS = 200


def test_every_instruction_of_the_system_call_return_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stepped (GDB's stepi) through the whole of a system call's return to user
    space, from do_syscall_64's return into entry_SYSCALL_64 to the user instruction
    after `sysretq`: pt_regs checked and popped off the task's stack, the switch to the
    CPU's entry stack, the last pops, the user stack pointer back in RSP, swapgs (issue
    48: on 5.10 a pause there gave the kernel frame alone). At every instruction GDB's
    user frames come from the pt_regs the return restores (its memory still holds
    them); qmpprof, with the vmlinux and with none, must agree on the whole stack."""
    guest, oracle = linux_under_gdb
    gdb = oracle.gdb
    thread, stopped = stop_at(gdb, return_from_system_call(gdb))
    result, _ = agreements(guest, 0, ", stepped from do_syscall_64's return to user mode")
    for steps in range(MAX_RETURN_STEPS):
        if oracle.number("$cs", thread) & 3 == 3:
            break  # back in user mode: sysretq ran
        observed = replace(oracle.observe(thread), user_registers_whole=True)
        assert observed.kind == USER_TASK_KERNEL and observed.user, (steps, stopped)
        judge(result, guest, oracle, thread, observed)
        step_instruction(gdb, thread)
    else:
        raise AssertionError(f"still in the kernel after {MAX_RETURN_STEPS} instructions")
    result.pauses = from_memory(result).pauses = steps
    assert steps >= 10, steps
    every_stop_agreed(result, USER_TASK_WHOLE, steps)


def test_every_instruction_of_the_system_call_entry_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stepped (GDB's stepi) through the whole of a system call's entry, from
    entry_SYSCALL_64's first instruction to its call of do_syscall_64: swapgs, the user
    stack pointer set aside, the switch to the task's stack, pt_regs pushed register by
    register. The user registers at each of these instructions are those the entry
    saves, so GDB's user frames come from the pt_regs complete at the call; its kernel
    frame is the leaf it names. qmpprof (its dump taken at each instruction), with the
    vmlinux and with none, must agree with them at every one."""
    guest, oracle = linux_under_gdb
    gdb = oracle.gdb
    (entry,) = nm_symbols(guest.kernel)["entry_SYSCALL_64"]
    entry += kernel_slide(guest)
    call = return_from_system_call(gdb) - CALL_REL32_BYTES
    thread, stopped = stop_at(gdb, entry)
    taken: list[tuple[GdbFrame, Dumped, Dumped]] = []
    while oracle.number("$pc", thread) != call:
        assert len(taken) < MAX_RETURN_STEPS, f"no call of do_syscall_64 after {len(taken)}"
        leaf = gdb.frames(thread)[0]
        with_files = qmpprof_frames(guest, oracle.module_dir)[thread - 1]
        no_files = qmpprof_frames(guest, oracle.module_dir, True)[thread - 1]
        taken.append((leaf, with_files, no_files))
        step_instruction(gdb, thread)
    saved = replace(oracle.observe(thread), user_registers_whole=True)
    assert saved.kind == USER_TASK_KERNEL and saved.user, stopped
    result, _ = agreements(guest, len(taken), ", stepped from entry_SYSCALL_64 to its call")
    for leaf, with_files, no_files in taken:
        observed = replace(saved, kernel=[leaf], kernel_complete=False)
        result.add(observed, with_files)
        from_memory(result).add(observed, no_files)
    assert len(taken) >= 10, len(taken)
    every_stop_agreed(result, USER_TASK_WHOLE, len(taken))


#: Interrupts and exceptions stopped at error_entry (or an exit) until one came from the
#: mode asked for.
MAX_ENTRY_STOPS = 40
#: Each instruction judged costs two `qmpprof dump`s: by default the first few and every
#: ENTRY_STRIDE-th of error_entry's path are judged (10-30 s a test), and of each other
#: window stepped the first EXIT_FIRST, every EXIT_STRIDE-th and its iretq;
#: QMPPROF_LINUX_GDB_EVERY_INSTRUCTION=1 judges every one.
EVERY_INSTRUCTION = os.environ.get("QMPPROF_LINUX_GDB_EVERY_INSTRUCTION") == "1"
ENTRY_STRIDE = 1 if EVERY_INSTRUCTION else 7
ENTRY_FIRST = 4
EXIT_STRIDE = 1 if EVERY_INSTRUCTION else 4
EXIT_FIRST = 2
#: Above error_entry's return address at its first instruction: the error code (or -1),
#: then the interrupt frame's RIP and CS.
INTERRUPTED_CS_AT = 3 * 8
#: Where pt_regs keeps CS (offsetof(struct pt_regs, cs)).
PT_REGS_CS_AT = 17 * 8


def entry_from(oracle: LinuxOracle, site: int, user_mode: bool) -> tuple[int, int]:
    """Stop at error_entry's first instruction (`site`) until a vCPU reaches it from user
    mode (or kernel mode: the interrupt frame's CS): its GDB thread, and the return
    address into the stub that called it (at RSP, on the CPU's entry stack, which the
    user half of a PTI pair maps)."""
    for _ in range(MAX_ENTRY_STOPS):
        thread, _ = stop_at(oracle.gdb, site)
        oracle.gdb.command(f"-thread-select {thread}")
        rsp = oracle.number("$rsp", thread)
        if (oracle.word(rsp + INTERRUPTED_CS_AT) & 3 == 3) == user_mode:
            return thread, oracle.word(rsp)
    mode = "user" if user_mode else "kernel"
    raise AssertionError(f"no entry from {mode} mode in {MAX_ENTRY_STOPS} stops at error_entry")


def with_stub(frames: list[GdbFrame], stub: GdbFrame) -> list[GdbFrame]:
    """GDB's kernel frames down to the entry code (trusted_kernel_frames), the stub that
    called error_entry added where GDB's frames end at error_entry: below it GDB reads
    whatever word RSP points at (the pushed registers), the stub's return address only
    at error_entry's first instruction and once they are all pushed."""
    kernel, _ = trusted_kernel_frames(frames)
    if kernel and kernel[-1].function == "error_entry":
        return [*kernel, replace(stub, level=len(kernel))]
    return kernel


class Step(NamedTuple):
    """One instruction judged: GDB's backtrace there (the kernel's tables loaded) and
    qmpprof's dumps, with the files and with none."""

    frames: list[GdbFrame]
    with_files: Dumped
    no_files: Dumped

    @classmethod
    def take(cls, oracle: LinuxOracle, guest: LinuxGuest, thread: int) -> Step:
        with oracle.kernel_tables(thread):
            frames = oracle.frames(thread)
        with_files = qmpprof_frames(guest, oracle.module_dir)[thread - 1]
        return cls(frames, with_files, qmpprof_frames(guest, oracle.module_dir, True)[thread - 1])


def stepped(
    oracle: LinuxOracle,
    guest: LinuxGuest,
    thread: int,
    done: Callable[[int], bool],
    judged: Callable[[int, int], bool],
) -> tuple[list[int], list[Step]]:
    """Step `thread` (GDB's stepi) until `done(pc)`: the distinct pcs it ran (`rep movsq`
    repeats its pc, once per word), and a Step at each pc `judged(pc, its number)`."""
    pcs: list[int] = []
    taken: list[Step] = []
    while not done(pc := oracle.number("$pc", thread)):
        assert len(pcs) < MAX_RETURN_STEPS, f"still stepping after {len(pcs)} instructions"
        if pc not in pcs:
            pcs.append(pc)
            if judged(pc, len(pcs)):
                taken.append(Step.take(oracle, guest, thread))
        step_instruction(oracle.gdb, thread)
    return pcs, taken


def entry_judged(_: int, number: int) -> bool:
    return number <= ENTRY_FIRST or number % ENTRY_STRIDE == 0


def test_every_instruction_of_an_interrupt_entry_from_user_mode_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stepped (GDB's stepi) through error_entry, called by an interrupt's or an
    exception's asm_* stub from user mode, to its return into the stub: the registers
    pushed one by one (the return address moved to RSI, then pushed again), the swapgs,
    the CR3 switch (`pti=on`), sync_regs's copy to the task's stack (5.10: the switch to
    it inside error_entry, the return address in R12). Issue 48: a pause there gave the
    user frames with the stub's frame missing (unwind/orc_mends.py). The oracle at each
    instruction: GDB's leaf frames down to error_entry, the stub at the address GDB
    stops at when error_entry returns, and GDB's backtrace from the pt_regs complete
    there. qmpprof, with the vmlinux and with none, must agree on the whole stack."""
    guest, oracle = linux_under_gdb
    (site,) = nm_symbols(guest.kernel)["error_entry"]
    thread, returns_to = entry_from(oracle, site + kernel_slide(guest), user_mode=True)
    pcs, taken = stepped(oracle, guest, thread, lambda pc: pc == returns_to, entry_judged)
    saved = replace(oracle.observe(thread), user_registers_whole=True)
    assert saved.kind == USER_TASK_KERNEL and saved.user, saved
    stub = saved.kernel[0]
    assert stub.address == returns_to and stub.function and ENTRY.fullmatch(stub.function), stub
    result, _ = agreements(guest, len(taken) + 1, ", stepped through error_entry")
    for step in taken:
        observed = replace(saved, kernel=with_stub(step.frames, stub), kernel_complete=True)
        result.add(observed, step.with_files)
        from_memory(result).add(observed, step.no_files)
    judge(result, guest, oracle, thread, replace(saved, kernel_complete=True))
    print(f"error_entry: {len(pcs)} instructions from {stub.function}, {len(taken)} judged")
    assert len(pcs) >= 30, len(pcs)
    every_stop_agreed(result, USER_TASK_WHOLE, len(taken) + 1)


def test_every_instruction_of_an_interrupt_entry_from_kernel_mode_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """As above, for an interrupt or exception taken in kernel mode (a timer interrupt
    in a system call, a kernel thread or the idle loop; error_entry's
    .Lerror_kernelspace path: no swapgs, no stack switch, pt_regs on the interrupted
    stack), to error_entry's return into the stub. The oracle at each instruction: GDB's
    leaf frames down to error_entry, the stub, and GDB's backtrace from the pt_regs
    error_entry returns (the interrupted kernel code, down to its own entry frame), with
    a user task's user frames below; qmpprof, with the vmlinux and with none, must agree
    on the whole stack."""
    guest, oracle = linux_under_gdb
    (site,) = nm_symbols(guest.kernel)["error_entry"]
    thread, returns_to = entry_from(oracle, site + kernel_slide(guest), user_mode=False)
    pcs, taken = stepped(oracle, guest, thread, lambda pc: pc == returns_to, entry_judged)
    taken.append(Step.take(oracle, guest, thread))
    saved = replace(oracle.observe(thread), user_registers_whole=True)
    stub = saved.kernel[0]
    assert stub.address == returns_to and stub.function and ENTRY.fullmatch(stub.function), stub
    interrupted, complete = oracle.frames_from_pt_regs(thread, oracle.number("$rsp", thread))
    result, _ = agreements(guest, len(taken), ", stepped through error_entry from the kernel")
    for step in taken:
        kernel = [*with_stub(step.frames, stub), *interrupted]
        observed = replace(saved, kernel=relevelled(kernel), kernel_complete=complete)
        result.add(observed, step.with_files)
        from_memory(result).add(observed, step.no_files)
    print(f"error_entry from the kernel: {len(pcs)} instructions, {len(taken)} judged, GDB's")
    print(f"  {names(observed)}")
    assert len(pcs) >= 20, len(pcs)
    every_stop_agreed(result, None, len(taken))


def names(observed: Observed) -> str:
    """The functions of what GDB `observed`, leaf first (a test's record of its stack)."""
    frames = [*observed.kernel, *observed.user]
    return f"{observed.label}: " + " < ".join(f.function or hex(f.address) for f in frames)


def relevelled(frames: list[GdbFrame]) -> list[GdbFrame]:
    """Frames put together from several backtraces, numbered again from the leaf."""
    return [replace(frame, level=level) for level, frame in enumerate(frames)]


def exit_judged(iret: int) -> Callable[[int, int], bool]:
    """An exit's instructions judged: the first EXIT_FIRST, every EXIT_STRIDE-th and the
    iretq (at `iret`), where the hardware frame alone is left."""
    return lambda pc, number: number <= EXIT_FIRST or number % EXIT_STRIDE == 0 or pc == iret


def exit_from(oracle: LinuxOracle, site: int, user_mode: bool) -> tuple[int, int]:
    """Stop at an exit's first instruction (`site`, pt_regs at RSP) until a vCPU returns
    there to user mode (or kernel mode: pt_regs' CS): its GDB thread and pt_regs."""
    for _ in range(MAX_ENTRY_STOPS):
        thread, _ = stop_at(oracle.gdb, site)
        oracle.gdb.command(f"-thread-select {thread}")
        with oracle.kernel_tables(thread):
            rsp = oracle.number("$rsp", thread)
            if (oracle.word(rsp + PT_REGS_CS_AT) & 3 == 3) == user_mode:
                return thread, rsp
    mode = "user" if user_mode else "kernel"
    raise AssertionError(f"no return to {mode} mode in {MAX_ENTRY_STOPS} stops at {site:#x}")


def exit_sites(guest: LinuxGuest) -> tuple[int, int, int]:
    """The returns to user mode (common_interrupt_return: 5.10, 6.1 and 6.12 all have
    it, at swapgs_restore_regs_and_return_to_usermode) and to kernel mode
    (restore_regs_and_return_to_kernel), and the iretq both end in."""
    symbols, slide = nm_symbols(guest.kernel), kernel_slide(guest)
    names = ("common_interrupt_return", "restore_regs_and_return_to_kernel")
    (user, kernel, iret) = (min(symbols[n]) + slide for n in (*names, "native_irq_return_iret"))
    return user, kernel, iret


def test_every_instruction_of_an_interrupt_return_to_user_mode_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stepped (GDB's stepi) through an interrupt's or exception's return to user
    mode, from common_interrupt_return's first instruction to the user instruction
    after its iretq: pt_regs popped, the switch to the CPU's entry stack, the iret frame
    copied there, the CR3 switch to the user tables (`pti=on`: the kernel's stack is
    unmapped from there on), swapgs, the iretq. At every instruction GDB's user frames
    come from the pt_regs the exit restores (the task's stack still holds them) and its
    kernel frame is the leaf; qmpprof, with the vmlinux and with none, must agree on the
    whole stack."""
    guest, oracle = linux_under_gdb
    user, _, iret = exit_sites(guest)
    thread, _ = exit_from(oracle, user, user_mode=True)
    saved = replace(oracle.observe(thread), user_registers_whole=True)
    assert saved.kind == USER_TASK_KERNEL and saved.user, saved

    def returned(_: int) -> bool:
        return oracle.number("$cs", thread) & 3 == 3

    pcs, taken = stepped(oracle, guest, thread, returned, exit_judged(iret))
    result, _ = agreements(guest, len(taken), ", stepped from common_interrupt_return to user")
    for step in taken:
        observed = replace(saved, kernel=step.frames[:1], kernel_complete=True)
        result.add(observed, step.with_files)
        from_memory(result).add(observed, step.no_files)
    print(f"return to user mode: {len(pcs)} instructions, {len(taken)} judged")
    assert iret in pcs and len(pcs) >= 20, [hex(pc) for pc in pcs]
    every_stop_agreed(result, USER_TASK_WHOLE, len(taken))


def test_every_instruction_of_an_interrupt_return_to_kernel_mode_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stepped (GDB's stepi) through an interrupt's or exception's return to
    kernel mode, from restore_regs_and_return_to_kernel's first instruction to the
    interrupted instruction its iretq goes back to: pt_regs popped, the iretq. The oracle
    at every instruction: GDB's leaf and its backtrace from the pt_regs being restored
    (the interrupted kernel code down to its entry frame), with a user task's user
    frames below; qmpprof, with the vmlinux and with none, must agree on the whole
    stack."""
    guest, oracle = linux_under_gdb
    _, to_kernel, iret = exit_sites(guest)
    thread, regs = exit_from(oracle, to_kernel, user_mode=False)
    resumes = oracle.number(f"((struct pt_regs *){regs:#x})->ip", thread)
    interrupted, complete = oracle.frames_from_pt_regs(thread, regs)
    saved = replace(oracle.observe(thread), user_registers_whole=True)
    pcs, taken = stepped(oracle, guest, thread, lambda pc: pc == resumes, exit_judged(iret))
    result, _ = agreements(guest, len(taken), ", stepped from the return to the kernel")
    for step in taken:
        kernel = relevelled([*step.frames[:1], *interrupted])
        observed = replace(saved, kernel=kernel, kernel_complete=complete)
        result.add(observed, step.with_files)
        from_memory(result).add(observed, step.no_files)
    print(f"return to kernel mode: {len(pcs)} instructions, {len(taken)} judged, GDB's")
    print(f"  {names(observed)}")
    assert iret in pcs and len(pcs) >= 10, [hex(pc) for pc in pcs]
    every_stop_agreed(result, None, len(taken))


#: Stops at the first instruction of a retpoline thunk.
THUNK_STOPS = 4


def test_a_stop_at_a_retpoline_thunk_agrees_with_gdb(
    linux_under_gdb: tuple[LinuxGuest, LinuxOracle],
) -> None:
    """A vCPU stopped (GDB breakpoints) at the first instruction of a retpoline thunk
    other than %rax's: `__x86_indirect_thunk_r12` and the others are labels inside the
    sized `__x86_indirect_thunk_array`. ORC ends the stack in the thunks, and the caller
    is the return address at RSP, as at any function's first instruction; given the
    vmlinux, qmpprof took the label for a spot inside the array and went from the thunk
    straight to the interrupted user code, its callers left out (seen once in a random
    pause, 2026-11-28: call_timer_fn's `cs call __x86_indirect_thunk_r12` in a softirq).
    qmpprof, with the vmlinux and with none, must agree on every stop."""
    guest, oracle = linux_under_gdb
    symbols, slide = nm_symbols(guest.kernel), kernel_slide(guest)
    (array,) = symbols["__x86_indirect_thunk_array"]
    thunks = [
        min(symbols[name]) + slide
        for name in symbols
        if name.startswith("__x86_indirect_thunk_r") and min(symbols[name]) != array
    ]
    assert len(thunks) >= 8, sorted(symbols)[:20]
    result, _ = agreements(guest, THUNK_STOPS, ", stopped at a retpoline thunk")
    for _ in range(THUNK_STOPS):
        thread, stopped = stop_at_any(oracle.gdb, thunks)
        observed = oracle.observe(thread)
        assert observed.kernel[0].address in thunks, stopped
        judge(result, guest, oracle, thread, observed)
    every_stop_agreed(result, None, THUNK_STOPS)


def test_user_samples_agree_with_gdb_without_a_kernel_file(agreement: Agreement) -> None:
    check(from_memory(agreement), USER)


def test_idle_samples_agree_with_gdb_without_a_kernel_file(quiet_agreement: Agreement) -> None:
    check(from_memory(quiet_agreement), IDLE)


def test_kernel_thread_samples_agree_with_gdb_without_a_kernel_file(
    quiet_agreement: Agreement,
) -> None:
    check(from_memory(quiet_agreement), KTHREAD)


def test_kernel_part_of_user_task_samples_agrees_with_gdb_without_a_kernel_file(
    agreement: Agreement,
) -> None:
    check(from_memory(agreement), USER_TASK_KERNEL)


def test_whole_stack_of_user_task_kernel_samples_agrees_with_gdb_without_a_kernel_file(
    agreement: Agreement,
) -> None:
    check(from_memory(agreement), USER_TASK_WHOLE)
