"""A Linux kernel, recognised from its symbol table; processes are not named yet.

Chosen when the kernel ELF has `linux_banner` or `init_task`, at no DWARF cost.
Naming the task on each vCPU (per-CPU `current_task`, layouts from BTF) is the next
step (issue 15); until then samples are labelled by address space, as the generic
adapter does, but the summary says which OS it is.
"""

from __future__ import annotations

from qmpprof.guest.adapter import KernelFacts
from qmpprof.memory import MemoryReader
from qmpprof.model import Process, RegisterSet


class LinuxAdapter:
    name = "linux"
    probe_symbols = frozenset({"linux_banner", "init_task"})

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool:
        return not cls.probe_symbols.isdisjoint(facts.symbols)

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> LinuxAdapter:
        return cls()

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        return None
