"""Linux on arm64: the task on each vCPU, its user registers and page tables, found
without data symbols.

Debian's arm64 kernels have kallsyms without data symbols (no CONFIG_KALLSYMS_ALL):
no `__per_cpu_offset`, no per-CPU symbols. What is needed comes from elsewhere:
- each vCPU's per-CPU offset is its TPIDR_EL1 (RegisterSet.tpidr, read once per
  connection through QEMU's gdbstub: target/roots.py);
- a per-CPU variable's place in the per-CPU section is its offset in BTF's
  `.data..percpu` section (every per-CPU variable is listed there);
- where that section lies (`__per_cpu_start`, page-aligned, between the init text and
  the kernel's data) is found once per connection (`_find_per_cpu_start`): the page
  for which a vCPU's `__entry_task` is a task_struct on that vCPU's CPU (its
  `cpu_number` says which, before 6.12) with a kernel stack.
The running task is `__entry_task` (arch/arm64/kernel/process.c sets it at every
context switch; the kernel's own `current`, SP_EL0, is not in QEMU's dump). Its user
registers are the `struct pt_regs` at the top of its kernel stack (task->stack +
THREAD_SIZE, the entry from EL0 saves them there), its user page tables those of
task->active_mm->pgd, a linear-map address (physical = virtual - PAGE_OFFSET +
PHYS_OFFSET, both from VMCOREINFO).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from qmpprof.errors import MemoryFault
from qmpprof.guest.adapter import KernelFacts, UserRegisters
from qmpprof.guest.btf import SIZE
from qmpprof.guest.dwarf_types import Member
from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.guest.linux.adapter import MAX_CPUS, TASK_MEMBERS, LinuxAdapter, TaskLayout
from qmpprof.memory import MemoryReader
from qmpprof.model import KERNEL_HALF, RegisterSet
from qmpprof.unwind.numbering import REGISTER_COUNT, from_aarch64

#: THREAD_SIZE with 4 KiB pages and no KASAN (arch/arm64/include/asm/memory.h).
THREAD_SIZE = 16 * 1024
PAGE = 4096
#: A pgd's alignment: a page, or 64 bytes for LPA2's 16-entry level -1 tables (6.12).
_ROOT_ALIGN = 64
#: Pages looked at for the per-CPU section, at most (Debian's 6.1: about 300).
MAX_SEARCH_PAGES = 1 << 14
#: pt_regs: regs[31], sp, pc, pstate (arch/arm64/include/asm/ptrace.h, every version).
_USER_PT_REGS = struct.Struct("<34Q")
#: PSTATE's mode bits: 0 is EL0t in AArch64 (bit 4 set: AArch32).
_MODE_BITS = 0x1F
#: pt_regs' pc, after x0..x30 and sp: AArch64's DWARF numbers 0..32 in order.
_PC_SLOT = 32
_U32 = struct.Struct("<I")
#: The BTF data section that lists per-CPU variables, and those read.
PER_CPU_SECTION = ".data..percpu"
PER_CPU_VARIABLES = frozenset({"__entry_task", "cpu_number"})
#: Of those, what a lookup cannot do without (6.12 has no cpu_number).
_REQUIRED_PER_CPU = "__entry_task"
_TASK = frozenset({*TASK_MEMBERS, "stack", "active_mm", "thread_info", "cpu"})


@dataclass(frozen=True)
class Arm64Layout:
    """The offsets an arm64 task lookup reads, from BTF."""

    entry_task: int  # in the per-CPU section
    cpu_number: int | None  # in the per-CPU section (before 6.12)
    task_cpu: int  # in task_struct (thread_info.cpu)
    stack: int
    active_mm: int
    pgd: int  # in mm_struct
    pt_regs_size: int

    @classmethod
    def of(cls, types: KernelTypes, per_cpu: Mapping[str, int]) -> Arm64Layout | None:
        structs = {"task_struct", "thread_info", "mm_struct", "pt_regs"}
        layout = types.layout(set(), structs, (*_TASK, "pgd", SIZE))
        found = layout.structs
        task, info = found.get("task_struct", {}), found.get("thread_info", {})
        cpu = _task_cpu(task, info)
        wanted = (task.get("stack"), task.get("active_mm"), found.get("mm_struct", {}).get("pgd"))
        size = found.get("pt_regs", {}).get(SIZE)
        if cpu is None or None in wanted or size is None or _REQUIRED_PER_CPU not in per_cpu:
            return None
        stack, active_mm, pgd = (member.offset for member in wanted if member is not None)
        return cls(
            per_cpu["__entry_task"],
            per_cpu.get("cpu_number"),
            cpu,
            stack,
            active_mm,
            pgd,
            size.offset,
        )


def _task_cpu(task: Mapping[str, Member], info: Mapping[str, Member]) -> int | None:
    """Where task_struct keeps its CPU: in its thread_info (from 5.16), else itself."""
    if "thread_info" in task and "cpu" in info:
        return task["thread_info"].offset + info["cpu"].offset
    return task["cpu"].offset if "cpu" in task else None


@dataclass(frozen=True)
class LinearMap:
    """Where the kernel maps all of RAM: virtual [page_offset, page_offset + size) is
    physical phys_offset upward (VMCOREINFO's VA_BITS and PHYS_OFFSET)."""

    page_offset: int
    size: int
    phys_offset: int

    def physical(self, address: int) -> int | None:
        if not 0 <= address - self.page_offset < self.size:
            return None
        return address - self.page_offset + self.phys_offset


class Arm64LinuxAdapter(LinuxAdapter):
    """See the module's docstring."""

    name = "linux-arm64"
    gives_user_roots = True
    #: In a vmlinux: what says it is arm64's (x86 has no __entry_task).
    probe_symbols = frozenset({"__entry_task", "cpu_number", "linux_banner"})

    def __init__(
        self,
        layout: Arm64Layout,
        task: TaskLayout,
        search: tuple[int, int],
        linear: LinearMap | None = None,
        banner: int | None = None,
    ) -> None:
        """`search`: the link addresses between which the per-CPU section starts;
        `linear`: the linear map, where the memory read cannot translate."""
        super().__init__(task=task, banner=banner)
        self.layout = layout
        self._search = search
        self._linear = linear
        #: The per-CPU section's runtime address, once found (per connection).
        self._per_cpu_start: int | None = None

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool:
        return "__entry_task" in facts.symbols

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> LinuxAdapter:
        """A vmlinux's: the per-CPU variables at their link addresses, measured from the
        page `__entry_task` is in (checked as a search of one page is: its symbol table
        has no `__per_cpu_start`, a symbol of no type); without the types a lookup needs,
        one that names no task."""
        base = facts.symbols["__entry_task"] // PAGE * PAGE
        banner = facts.symbols.get("linux_banner")
        names = PER_CPU_VARIABLES & facts.symbols.keys()
        per_cpu = {name: facts.symbols[name] - base for name in names}
        found = cls.of(facts.types, per_cpu, (base, base + 1))
        if found is None:
            return LinuxAdapter(banner=banner)
        found.banner = banner
        return found

    @classmethod
    def of(
        cls,
        types: KernelTypes,
        per_cpu: Mapping[str, int],
        search: tuple[int, int],
        linear: LinearMap | None = None,
    ) -> Arm64LinuxAdapter | None:
        """None when the types lack what a lookup needs."""
        layout = Arm64Layout.of(types, per_cpu)
        members = types.layout(set(), {"task_struct"}, TASK_MEMBERS).structs.get("task_struct")
        task = TaskLayout.from_members(members or {})
        if layout is None or task is None:
            return None
        return cls(layout, task, search, linear)

    def new_connection(self) -> None:
        super().new_connection()
        self._per_cpu_start = None

    def task_address(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """`__entry_task` of this vCPU's CPU; None before the per-CPU section is found
        (user_root finds it) or without the vCPU's TPIDR_EL1. Raises MemoryFault."""
        if self._per_cpu_start is None or not registers.tpidr:
            return None
        task = self._per_cpu_word(registers, memory, self.layout.entry_task)
        return task if task >= KERNEL_HALF else None

    def user_root(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """The physical address of the running task's page tables (task->active_mm->pgd);
        None for a task without them. Finds the per-CPU section first, once. Raises
        MemoryFault."""
        if self._per_cpu_start is None and registers.tpidr:
            self._per_cpu_start = self._find_per_cpu_start(registers, memory)
        task = self.task_address(registers, memory)
        if task is None:
            return None
        mm = memory.read_u64(task + self.layout.active_mm)
        if mm < KERNEL_HALF:
            return None
        pgd = memory.read_u64(mm + self.layout.pgd)
        if pgd % _ROOT_ALIGN or pgd < KERNEL_HALF:
            return None
        # The memory read translates through the kernel's page tables where it can:
        # target/paging.VirtualMemory, always in a capture.
        translate = getattr(memory, "translate", None)
        if callable(translate):
            return int(translate(pgd))
        return None if self._linear is None else self._linear.physical(pgd)

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        """The registers the entry from EL0 saved at the top of the task's stack; None
        when they are not a 64-bit EL0's (a kernel thread's are zero). Raises MemoryFault."""
        stack = self.kernel_stack(registers, memory)
        if stack is None:
            return None
        start = stack[0] + stack[1] - self.layout.pt_regs_size
        saved = _USER_PT_REGS.unpack(memory.read(start, _USER_PT_REGS.size))
        pc, pstate = saved[_PC_SLOT], saved[_PC_SLOT + 1]
        if pstate & _MODE_BITS or not 0 < pc < KERNEL_HALF:
            return None
        values: list[int | None] = [None] * REGISTER_COUNT
        for number in range(_PC_SLOT + 1):
            values[from_aarch64(number)] = saved[number]  # x0..x30, sp, pc
        return values

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        """task->stack, THREAD_SIZE bytes. Raises MemoryFault."""
        task = self.task_address(registers, memory)
        if task is None:
            return None
        stack = memory.read_u64(task + self.layout.stack)
        return (stack, THREAD_SIZE) if stack >= KERNEL_HALF and not stack % PAGE else None

    def _per_cpu_word(self, registers: RegisterSet, memory: MemoryReader, offset: int) -> int:
        assert self._per_cpu_start is not None
        return memory.read_u64((registers.tpidr + self._per_cpu_start + offset) % (1 << 64))

    def _find_per_cpu_start(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """The runtime address of the per-CPU section: the first page in the search span
        where this vCPU's __entry_task is a task_struct on its CPU, with a kernel stack:
        the CPU its cpu_number says (6.1), else the vCPU's index (6.12 has no
        cpu_number: QEMU's virt board numbers its CPUs as Linux does)."""
        start, end = (address + self.bias for address in self._search)
        first = start + -start % PAGE
        for candidate in range(first, min(end, first + MAX_SEARCH_PAGES * PAGE), PAGE):
            area = (registers.tpidr + candidate) % (1 << 64)
            with contextlib.suppress(MemoryFault):
                if self._is_entry_task_at(registers, memory, area):
                    return candidate
        return None

    def _is_entry_task_at(self, registers: RegisterSet, memory: MemoryReader, area: int) -> bool:
        """Raises MemoryFault."""
        layout = self.layout
        cpu = registers.vcpu
        if layout.cpu_number is not None:
            cpu = _U32.unpack(memory.read(area + layout.cpu_number, 4))[0]
        task = memory.read_u64(area + layout.entry_task)
        if cpu >= MAX_CPUS or task < KERNEL_HALF:
            return False
        if _U32.unpack(memory.read(task + layout.task_cpu, 4))[0] != cpu:
            return False
        stack = memory.read_u64(task + layout.stack)
        return stack >= KERNEL_HALF and not stack % PAGE


def per_cpu_search_span(first: int | None, data: int | None) -> tuple[int, int] | None:
    """Where the per-CPU section may start: after the init text (`_einittext`) and
    before the kernel's data (`init_uts_ns`, which VMCOREINFO names), link addresses."""
    if first is None or data is None or not first < data:
        return None
    return first, data
