"""A Linux kernel, recognised from its symbol table: the task running on each vCPU.

Chosen when the kernel ELF has `linux_banner` or `init_task`, at no DWARF cost. The task
on a CPU is the per-CPU variable `current_task` (6.1; the first member of `pcpu_hot`
from 6.2), at that CPU's offset in `__per_cpu_offset[]`; what names it comes from
`struct task_struct`, the only type read, four members of it (bounded:
guest/dwarf_types.py). Per-CPU symbols are offsets into each CPU's area and do not move
with KASLR; `__per_cpu_offset` does (`relocate`).

Which Linux CPU a vCPU is, is read, not assumed (`linux_cpu`): in kernel mode the GS
base is that CPU's per-CPU area, so a GS base equal to `__per_cpu_offset[vcpu]` says
vCPU n is CPU n at no extra read. Otherwise (user mode, where the kernel's GS base is
in an MSR `info registers` does not print, or kernel entry code before `swapgs`) the
CPU number comes from the vCPU's GDT, where Linux keeps it for getcpu(): the limit of
descriptor GDT_ENTRY_CPUNODE is `node << 12 | cpu`. A dump without these registers (an
older capture) falls back to CPU n = vCPU n.

An i386 kernel (an ELF32 vmlinux, `word` 4) differs in three ways. Its per-CPU symbols
are absolute addresses in the image, moved by KASLR like every other symbol, and a CPU's
variable is at symbol + `__per_cpu_offset[cpu]` (4-byte entries). The kernel reaches
them through FS, not GS: in kernel mode the FS base is the CPU's offset (checked against
`__per_cpu_offset[vcpu]`, as GS is on x86-64). Otherwise (user mode, entry code before it
loads FS) the offset is the base of the CPU's GDT descriptor GDT_ENTRY_PERCPU (27),
which the kernel sets to it when the CPU starts. And the words read (the task pointer,
the stack top) are 4 bytes.

Labels, as perf and ps draw them: a user task is `comm (tgid)`, its pid kept as the
thread id; a kernel thread (PF_KTHREAD in its flags, which the kernel itself tests: a
user task that is exiting has no mm either) is `[comm]`; a CPU's idle task (pid 0,
`swapper/N`) is IDLE_CONTEXT.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from qmpprof.guest.adapter import NAME_LIMIT, KernelFacts, UserRegisters, task_name
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.linux import syscall_entry, syscall_entry_32
from qmpprof.guest.linux.page_cache import LinearBases
from qmpprof.guest.linux.syscall_entry import SystemCallEntry
from qmpprof.guest.linux.syscall_entry_32 import SystemCallEntry32
from qmpprof.memory import FetchingMemory, MemoryReader, read_word
from qmpprof.model import IDLE_CONTEXT, MemoryWindow, Process, RegisterSet
from qmpprof.unwind.orc import PT_REGS
from qmpprof.unwind.rules import REGISTER_COUNT, RIP

#: Linux's NR_CPUS ceiling on x86-64: a vCPU index beyond it is not a Linux CPU.
MAX_CPUS = 8192
_CURRENT = ("current_task", "pcpu_hot")
#: Symbols only a Linux kernel has: either says it is one.
_MARKERS = frozenset({"linux_banner", "init_task"})

#: task_struct.flags of a kernel thread (include/linux/sched.h; 6.1 and 6.12 alike).
PF_KTHREAD = 0x0020_0000
TASK_MEMBERS = ("pid", "tgid", "comm", "flags")
#: The most bytes of a task_struct read per sample, in one span from its first member
#: read to the end of its last: one capture window (a page past the address) holds it.
MAX_TASK_SPAN = 4096
#: Where the GDT keeps the CPU number (GDT_ENTRY_CPUNODE, entry 15, x86-64 Linux).
CPUNODE_OFFSET = 15 * 8
_CPU_MASK = 0xFFF
#: A present, DPL 3, code-or-data descriptor: what Linux writes there.
_USER_SEGMENT = 0xF0
#: Where an i386 kernel's GDT keeps the per-CPU segment (GDT_ENTRY_PERCPU, 27): its base
#: is the CPU's offset; a present, DPL 0, writable data descriptor (access byte 0x93).
PERCPU_OFFSET_32 = 27 * 8
_PERCPU_ACCESS_MASK = 0xFA
_PERCPU_ACCESS = 0x92
#: sizeof(struct pt_regs) on x86-64, and where it keeps CS (the privilege level's home).
PT_REGS_SIZE = 21 * 8
#: THREAD_SIZE, a task's kernel stack on x86-64 (16 KiB, 32 KiB only with KASAN), its
#: top the per-CPU top of stack: where an interrupt's unwind goes when it leaves the IRQ
#: stack, and where the entry from user space saved the user's registers.
THREAD_SIZE = 16 * 1024
_PT_CS = PT_REGS[RIP] + 8
#: i386's struct pt_regs (17 4-byte slots: bx cx dx si di bp ax ds es fs gs orig_ax ip
#: cs flags sp ss), by the unwinder's (x86-64 DWARF) register numbers; it ends 8 bytes
#: below the stack top (TOP_OF_KERNEL_STACK_PADDING), and its CS slot's upper half holds
#: entry flags (CS_FROM_KERNEL ...). THREAD_SIZE is 8 KiB there.
PT_REGS_32 = {3: 0, 2: 4, 1: 8, 4: 12, 5: 16, 6: 20, 0: 24, RIP: 48, 7: 60}
PT_REGS_SIZE_32 = 17 * 4
PT_REGS_PADDING_32 = 8
_PT_CS_32 = 52
THREAD_SIZE_32 = 8 * 1024
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class _EntryFrame:
    """What an entry from user space leaves below a task's kernel stack top, for one
    pointer size: struct pt_regs (`size` bytes of `word`-byte slots, `registers` by
    DWARF number, CS at `cs`) ending `padding` bytes below the top of a stack of
    `thread_size` bytes."""

    registers: Mapping[int, int]
    size: int
    padding: int
    cs: int
    word: int
    thread_size: int

    def user_registers(self, top: int, memory: MemoryReader) -> UserRegisters:
        """The user's registers saved below `top`; None when the saved CS is not ring
        3's (a kernel thread, the idle task). Raises MemoryFault."""
        start = (top - self.padding - self.size) % (1 << 8 * self.word)
        saved = memory.read(start, self.size)
        if saved[self.cs] & 3 != 3:
            return None
        values: list[int | None] = [None] * REGISTER_COUNT
        for number, offset in self.registers.items():
            values[number] = int.from_bytes(saved[offset : offset + self.word], "little")
        return values

    def kernel_stack(self, top: int) -> tuple[int, int]:
        """The task's kernel stack (start, size) that ends at `top`."""
        return (top - self.thread_size) % (1 << 8 * self.word), self.thread_size


_ENTRY_FRAME_64 = _EntryFrame(PT_REGS, PT_REGS_SIZE, 0, _PT_CS, 8, THREAD_SIZE)
_ENTRY_FRAME_32 = _EntryFrame(
    PT_REGS_32, PT_REGS_SIZE_32, PT_REGS_PADDING_32, _PT_CS_32, 4, THREAD_SIZE_32
)


@dataclass(frozen=True)
class TaskLayout:
    """Where task_struct keeps what a label needs: offsets into the span of
    `size` bytes at `start` in the task, read at once."""

    start: int
    size: int
    pid: int
    tgid: int
    flags: int
    comm: int
    comm_size: int

    @classmethod
    def from_members(cls, members: Mapping[str, Member]) -> TaskLayout | None:
        """The layout, if task_struct has the four members within MAX_TASK_SPAN."""
        if any(name not in members for name in TASK_MEMBERS):
            return None
        comm_size = min(members["comm"].size or 16, NAME_LIMIT)
        sizes = {"pid": 4, "tgid": 4, "flags": 4, "comm": comm_size}
        start = min(members[name].offset for name in TASK_MEMBERS)
        end = max(members[name].offset + sizes[name] for name in TASK_MEMBERS)
        if end - start > MAX_TASK_SPAN:
            return None
        pid, tgid, comm, flags = (members[name].offset - start for name in TASK_MEMBERS)
        return cls(start, end - start, pid, tgid, flags, comm, comm_size)

    def read(self, memory: MemoryReader, task: int) -> Process:
        """The label of the task at `task`. Raises MemoryFault."""
        span = memory.read(task + self.start, self.size)
        tid = _I32.unpack_from(span, self.pid)[0]
        if tid == 0:
            return IDLE_CONTEXT
        name = task_name(span[self.comm : self.comm + self.comm_size])
        if _U32.unpack_from(span, self.flags)[0] & PF_KTHREAD:
            return Process(None, f"[{name}]", tid)
        return Process(_I32.unpack_from(span, self.tgid)[0], name, tid)


class LinuxAdapter:
    name = "linux"
    gives_user_roots = False  # x86: CR3 is in the register dump
    probe_symbols = _MARKERS | {
        "__per_cpu_offset",
        "cpu_current_top_of_stack",
        syscall_entry.TSS,
        syscall_entry.ENTRY,
        syscall_entry.AFTER_HARDWARE_FRAME,
        *syscall_entry_32.SYMBOLS,
        *_CURRENT,
    }

    def __init__(
        self,
        per_cpu_offsets: int | None = None,
        current_task: int | None = None,
        task: TaskLayout | None = None,
        banner: int | None = None,
        top_of_stack: int | None = None,
        word: int = 8,
        system_call_entry: SystemCallEntry | None = None,
        system_call_entry_32: SystemCallEntry32 | None = None,
    ) -> None:
        self.per_cpu_offsets = per_cpu_offsets
        self.current_task = current_task
        self.task = task
        #: The per-CPU variable holding the top of the running task's kernel stack.
        self.top_of_stack = top_of_stack
        #: linux_banner's link address: what record/relocation.py checks a slide with.
        self.banner = banner
        #: The kernel's pointer size: 8 (x86-64), 4 (i386; see the module's docstring).
        self.word = word
        #: Where a system call's user registers are live, not yet in pt_regs.
        self.system_call_entry = system_call_entry
        #: i386's int $0x80 and sysenter entries, likewise (syscall_entry_32.py).
        self.system_call_entry_32 = system_call_entry_32
        self._entry = _ENTRY_FRAME_32 if word == 4 else _ENTRY_FRAME_64
        self.bias = 0
        #: Per (vCPU, per-CPU variable), the value read for the registers of one moment:
        #: a sample asks for its task and stack top several times (the copy while paused,
        #: the examination, the process maps), and every answer is the same. Keyed by the
        #: RegisterSet object, so a new tick (or a capture's replay) reads again.
        self._per_cpu_values: dict[tuple[int, int], tuple[RegisterSet, int]] = {}
        #: Per vCPU, the task read for the registers of one moment (as above).
        self._processes: dict[int, tuple[RegisterSet, Process]] = {}
        #: What never changes once the kernel is up, read once (see `_constant`).
        self._constants = BootConstants()
        #: Where the vmemmap and direct map are, where no variables say (arm64).
        self.linear_bases: LinearBases | None = None

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool:
        return not _MARKERS.isdisjoint(facts.symbols)

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> LinuxAdapter:
        """Names tasks when the kernel has the symbols and task_struct's layout; else
        chosen all the same, naming none."""
        offsets = facts.symbols.get("__per_cpu_offset")
        current = next((facts.symbols[n] for n in _CURRENT if n in facts.symbols), None)
        banner = facts.symbols.get("linux_banner")
        if offsets is None or current is None:
            return cls(banner=banner, word=facts.word)
        # 6.1 has no pcpu_hot: a kernel without BTF would scan all of its DWARF for it.
        structs = {"task_struct"} | ({"pcpu_hot"} & facts.symbols.keys())
        members: tuple[str, ...] = (*TASK_MEMBERS, "top_of_stack", *syscall_entry.TSS_MEMBERS)
        if facts.word == 8 and syscall_entry.TSS in facts.symbols:
            structs |= syscall_entry.TSS_STRUCTS
        elif facts.word == 4 and facts.symbols.keys() >= syscall_entry_32.DATA:
            structs |= syscall_entry_32.STRUCTS
            members = (*members, *syscall_entry_32.MEMBERS)
        layout = facts.types.layout(set(), structs, members)
        task = TaskLayout.from_members(layout.structs.get("task_struct", {}))
        if task is None:
            return cls(banner=banner, word=facts.word)
        top = _top_of_stack(facts, layout.structs)
        entry = SystemCallEntry.from_facts(facts, layout.structs)
        entry_32 = SystemCallEntry32.from_facts(facts, layout.structs)
        return cls(offsets, current, task, banner, top, facts.word, entry, entry_32)

    def relocate(self, bias: int) -> None:
        self.bias = bias

    def new_connection(self) -> None:
        """Forget what was read of the guest: it may have booted again since."""
        self._per_cpu_values.clear()
        self._processes.clear()
        self._constants = BootConstants()

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        """The task on this vCPU; None when the kernel gave no way to tell. Raises
        MemoryFault for memory it needs."""
        known = self._processes.get(registers.vcpu)
        if known is not None and known[0] is registers:
            return known[1]
        task = self.task_address(registers, memory)
        if task is None or self.task is None:
            return None
        process = self.task.read(memory, task)
        if 0 <= registers.vcpu < MAX_CPUS:
            self._processes[registers.vcpu] = (registers, process)
        return process

    def task_address(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """The address of the task_struct running on this vCPU (`current`); None when
        the kernel gave no way to tell, or none runs. Raises MemoryFault."""
        if self.task is None or self.per_cpu_offsets is None or self.current_task is None:
            return None
        if not 0 <= registers.vcpu < MAX_CPUS:
            return None
        return self._per_cpu_value(registers, memory, self.current_task) or None

    def _per_cpu_value(self, registers: RegisterSet, memory: MemoryReader, offset: int) -> int:
        """The 64-bit per-CPU variable at `offset` of this vCPU's Linux CPU (see
        `_per_cpu_values`); an i386 kernel's 32-bit one at symbol `offset`. Raises
        MemoryFault."""
        key = (registers.vcpu, offset)
        known = self._per_cpu_values.get(key)
        if known is not None and known[0] is registers:
            return known[1]
        if self.word == 4:
            value = self._per_cpu_value_32(registers, memory, offset)
        else:
            value = memory.read_u64((self._cpu_area(registers, memory) + offset) % (1 << 64))
        if len(self._per_cpu_values) >= 4 * MAX_CPUS:
            self._per_cpu_values.clear()
        self._per_cpu_values[key] = (registers, value)
        return value

    def _per_cpu_value_32(self, registers: RegisterSet, memory: MemoryReader, symbol: int) -> int:
        assert self.per_cpu_offsets is not None
        remembering = self._constants.reader(memory)
        area = per_cpu_area_32(self.per_cpu_offsets + self.bias, registers, remembering)
        return read_word(memory, area + symbol + self.bias, 4)

    def _cpu_area(self, registers: RegisterSet, memory: MemoryReader) -> int:
        assert self.per_cpu_offsets is not None
        areas = self.per_cpu_offsets + self.bias
        remembering = self._constants.reader(memory)
        return per_cpu_area(areas, linux_cpu(areas, registers, remembering), remembering)

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        """The `struct pt_regs` at the top of the running task's kernel stack, where every
        entry from user space (system call, interrupt, exception) saves the user's
        registers; None when they are not a user's (a kernel thread, the idle task). In
        a system call's entry before it has saved them, the vCPU's own (syscall_entry.py,
        syscall_entry_32.py)."""
        entry, entry_32 = self.system_call_entry, self.system_call_entry_32

        def per_cpu(regs: RegisterSet, at: int) -> int:
            return self._per_cpu_value(regs, memory, at)

        if entry is not None:
            live = entry.user_registers(registers, self.bias, per_cpu)
            if live is not None:
                return live
        current = functools.partial(self.task_address, registers, memory)
        if entry_32 is not None:
            live = entry_32.user_registers(registers, self.bias, memory, per_cpu, current)
            if live is not None:
                return live
        process = self.process(registers, memory)
        if process is not None and process.pid is None:
            return None  # a kernel thread, or idle: mid switch the stack top is the last task's
        top = self._stack_top(registers, memory)
        saved = None if top is None else self._entry.user_registers(top, memory)
        return saved if entry_32 is None else entry_32.completed(saved, self.bias, memory, current)

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        """The running task's kernel stack, (start, size); None when the kernel gave no
        way to tell. Raises MemoryFault."""
        top = self._stack_top(registers, memory)
        return None if top is None else self._entry.kernel_stack(top)

    def user_root(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """x86's is CR3, in the register dump."""
        return None

    def _stack_top(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        if self.top_of_stack is None or self.per_cpu_offsets is None:
            return None
        if not 0 <= registers.vcpu < MAX_CPUS:
            return None
        return self._per_cpu_value(registers, memory, self.top_of_stack)


class BootConstants:
    """The 64-bit words a task lookup reads that a running kernel never changes, read
    once instead of at every sample (each read is a page walk, and they are half of a
    sample's reads): `__per_cpu_offset[]`, written once while booting (before, every
    entry holds a boot-time value), and each CPU's GDT descriptor that gives its number,
    written when that CPU starts.

    Remembered only once they are final: the per-CPU offsets once one of them equals a
    kernel-mode GS base (the kernel points GS there only after it wrote them all), a GDT
    descriptor once it was read in a user-mode sample with Linux's shape (a CPU runs
    user code only after it started). A sample that takes a word from here still gets
    its bytes (an 8-byte window, `FetchingMemory.keep`), so a capture replays alone."""

    def __init__(self) -> None:
        self.final_offsets = False
        self._words: dict[int, int] = {}

    def reader(self, memory: MemoryReader) -> MemoryReader:
        """`memory`, with remembered words answered from here when it can keep them."""
        if not isinstance(memory, FetchingMemory):
            return memory  # monitor reads in rounds: each round reads what it missed
        return _Remembering(self, memory)

    def get(self, address: int) -> int | None:
        return self._words.get(address)

    def remember(self, address: int, value: int) -> None:
        if len(self._words) < MAX_BOOT_CONSTANTS:
            self._words[address] = value


#: Words kept by BootConstants: two per CPU at most.
MAX_BOOT_CONSTANTS = 2 * MAX_CPUS


class _Remembering:
    """A FetchingMemory whose reads of boot constants go through BootConstants: which
    addresses those are, the task lookup's two functions below say by asking
    `read_constant`; every other read passes through."""

    def __init__(self, constants: BootConstants, memory: FetchingMemory) -> None:
        self.constants = constants
        self._memory = memory

    def read(self, address: int, size: int) -> bytes:
        return self._memory.read(address, size)

    def read_u64(self, address: int) -> int:
        return self._memory.read_u64(address)

    def read_constant(self, address: int, final: bool, size: int = 8) -> int:
        """The `size`-byte word at `address`, remembered once `final` says it cannot
        change."""
        known = self.constants.get(address)
        if known is not None:
            self._memory.keep(MemoryWindow(address, known.to_bytes(size, "little")))
            return known
        value = read_word(self._memory, address, size)
        if final:
            self.constants.remember(address, value)
        return value


def _read_constant(memory: MemoryReader, address: int, final: bool, size: int = 8) -> int:
    if isinstance(memory, _Remembering):
        return memory.read_constant(address, final, size)
    return read_word(memory, address, size)


def per_cpu_area_32(areas: int, registers: RegisterSet, memory: MemoryReader) -> int:
    """Where this vCPU's per-CPU variables are on an i386 kernel (`areas`: where
    `__per_cpu_offset` is in the guest): the offset to add to a per-CPU symbol's
    address. In kernel mode the FS base, once `__per_cpu_offset[vcpu]` says it is the
    kernel's; else the base of GDT_ENTRY_PERCPU; else `__per_cpu_offset[vcpu]` (CPU n =
    vCPU n). Raises MemoryFault."""
    vcpu = registers.vcpu
    final = isinstance(memory, _Remembering) and memory.constants.final_offsets
    own = _read_constant(memory, (areas + 4 * vcpu) % (1 << 32), final, size=4)
    kernel_fs = registers.fs_base if registers.cpl == 0 else 0
    if kernel_fs and own == kernel_fs:
        if isinstance(memory, _Remembering):
            memory.constants.final_offsets = True
        return own
    descriptor = _linux_descriptor(
        registers, memory, PERCPU_OFFSET_32, _PERCPU_ACCESS_MASK, _PERCPU_ACCESS, 32
    )
    return own if descriptor is None else segment_base(descriptor)


def _linux_descriptor(
    registers: RegisterSet, memory: MemoryReader, offset: int, mask: int, access: int, bits: int
) -> int | None:
    """The vCPU's GDT descriptor at `offset`, if its access byte under `mask` is `access`
    (the shape Linux writes there); None without a GDT base or in another shape. One
    read in a user-mode sample is final (the CPU started before it ran user code) and
    is remembered. Raises MemoryFault."""
    if not registers.gdt_base:
        return None
    address = (registers.gdt_base + offset) % (1 << bits)
    descriptor = _read_constant(memory, address, final=False)
    if (descriptor >> 40) & mask != access:
        return None
    if registers.cpl == 3 and isinstance(memory, _Remembering):
        memory.constants.remember(address, descriptor)
    return descriptor


def segment_base(descriptor: int) -> int:
    """The base address of a segment descriptor (an 8-byte GDT entry)."""
    return (descriptor >> 16) & 0xFF_FFFF | ((descriptor >> 56) & 0xFF) << 24


def _top_of_stack(facts: KernelFacts, structs: Mapping[str, Mapping[str, Member]]) -> int | None:
    """The per-CPU offset of the running task's stack top: `cpu_current_top_of_stack`
    (6.1), `pcpu_hot.top_of_stack` (from 6.2), or an x86-64 kernel's TSS's sp1, which
    `cpu_current_top_of_stack` names before 6.1 (5.10: entry_SYSCALL_64 loads RSP from
    %gs:cpu_tss_rw+12)."""
    if "cpu_current_top_of_stack" in facts.symbols:
        return facts.symbols["cpu_current_top_of_stack"]
    if "pcpu_hot" in facts.symbols:
        top = structs.get("pcpu_hot", {}).get("top_of_stack")
        return None if top is None else facts.symbols["pcpu_hot"] + top.offset
    return syscall_entry.tss_member(facts, structs, "sp1")


def per_cpu_area(areas: int, cpu: int, memory: MemoryReader) -> int:
    """Where Linux CPU `cpu`'s per-CPU variables are: its entry of __per_cpu_offset,
    which is at `areas` in the guest."""
    final = isinstance(memory, _Remembering) and memory.constants.final_offsets
    return _read_constant(memory, areas + 8 * cpu, final)


def linux_cpu(areas: int, registers: RegisterSet, memory: MemoryReader) -> int:
    """The Linux CPU number of this vCPU (see the module's docstring). Raises
    MemoryFault."""
    vcpu = registers.vcpu
    kernel_gs = registers.gs_base if registers.cpl == 0 else 0
    if kernel_gs and per_cpu_area(areas, vcpu, memory) == kernel_gs:
        if isinstance(memory, _Remembering):
            memory.constants.final_offsets = True
        return vcpu
    descriptor = _linux_descriptor(
        registers, memory, CPUNODE_OFFSET, _USER_SEGMENT, _USER_SEGMENT, 64
    )
    return vcpu if descriptor is None else descriptor & _CPU_MASK
