"""A Linux kernel, recognised from its symbol table: the task running on each vCPU.

Chosen when the kernel ELF has `linux_banner` or `init_task`, at no DWARF cost. The task
on a CPU is the per-CPU variable `current_task` (6.1; the first member of `pcpu_hot`
from 6.2), at that CPU's offset in `__per_cpu_offset[]`; its pid and `comm` come from
`struct task_struct`, the only type read (bounded: guest/dwarf_types.py). Per-CPU
symbols are offsets into each CPU's area and do not move with KASLR; `__per_cpu_offset`
does (`relocate`). Linux numbers its CPUs as QEMU numbers its vCPUs here: CPU n is
vCPU n, which holds for QEMU's x86 machines as they boot.
"""

from __future__ import annotations

from qmpprof.guest.adapter import KernelFacts, TaskFields, task_fields
from qmpprof.guest.dwarf_types import read_layout
from qmpprof.memory import MemoryReader
from qmpprof.model import Process, RegisterSet

#: Linux's NR_CPUS ceiling on x86-64: a vCPU index beyond it is not a Linux CPU.
MAX_CPUS = 8192
_CURRENT = ("current_task", "pcpu_hot")
#: Symbols only a Linux kernel has: either says it is one.
_MARKERS = frozenset({"linux_banner", "init_task"})


class LinuxAdapter:
    name = "linux"
    probe_symbols = _MARKERS | {"__per_cpu_offset", *_CURRENT}

    def __init__(
        self,
        per_cpu_offsets: int | None = None,
        current_task: int | None = None,
        fields: TaskFields | None = None,
    ) -> None:
        self.per_cpu_offsets = per_cpu_offsets
        self.current_task = current_task
        self.fields = fields
        self.bias = 0

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool:
        return not _MARKERS.isdisjoint(facts.symbols)

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> LinuxAdapter:
        """Names tasks when the kernel has the symbols and task_struct's layout; else
        chosen all the same, naming none."""
        offsets = facts.symbols.get("__per_cpu_offset")
        current = next((facts.symbols[n] for n in _CURRENT if n in facts.symbols), None)
        if offsets is None or current is None:
            return cls()
        members = read_layout(facts.path, set(), {"task_struct"}).structs.get("task_struct", {})
        if "pid" not in members or "comm" not in members:
            return cls()
        comm = members["comm"]
        return cls(
            offsets, current, task_fields(members["pid"].offset, comm.offset, comm.size or 16)
        )

    def relocate(self, bias: int) -> None:
        self.bias = bias

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        """The task on this vCPU (pid 0 is its idle task, `swapper/N`); None when the
        kernel gave no way to tell. Raises MemoryFault for memory it needs."""
        if self.fields is None or self.per_cpu_offsets is None or self.current_task is None:
            return None
        if not 0 <= registers.vcpu < MAX_CPUS:
            return None
        area = memory.read_u64(self.per_cpu_offsets + self.bias + 8 * registers.vcpu)
        task = memory.read_u64((area + self.current_task) % (1 << 64))
        if task == 0:
            return None
        return self.fields.read(memory, task)
