"""The bundled example guest: `struct process *cpu_current[NCPU]`, fields from DWARF."""

from __future__ import annotations

from pathlib import Path

from qmpprof.guest.adapter import KernelFacts, UserRegisters, task_fields
from qmpprof.guest.dwarf_types import KernelLayout, read_layout
from qmpprof.memory import MemoryReader, read_word
from qmpprof.model import KERNEL_ONLY, Process, RegisterSet


class ExampleGuestAdapter:
    """Reads cpu_current[vcpu]->pid and ->name; NULL means the CPU runs no process."""

    name = "example-guest"

    def __init__(
        self, cpu_current: int, pid_offset: int, name_offset: int, name_size: int, word: int = 8
    ):
        self.cpu_current = cpu_current
        self.fields = task_fields(pid_offset, name_offset, name_size)
        self.bias = 0
        #: The size of a pointer in cpu_current[]: 8 in the 64-bit build, 4 in the i386 one.
        self.word = word

    probe_symbols = frozenset({"cpu_current"})

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool:
        return "cpu_current" in facts.symbols

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> ExampleGuestAdapter | None:
        """The adapter, if the kernel also declares struct process (the only type read)."""
        layout = facts.types.layout(set(), {"process"})
        return cls._from_layout(facts.symbols.get("cpu_current"), layout, facts.word)

    @classmethod
    def from_kernel(cls, kernel: Path, word: int = 8) -> ExampleGuestAdapter | None:
        """The adapter, if the kernel ELF declares cpu_current and struct process."""
        layout = read_layout(kernel, {"cpu_current"}, {"process"})
        return cls._from_layout(layout.variables.get("cpu_current"), layout, word)

    @classmethod
    def _from_layout(
        cls, address: int | None, layout: KernelLayout, word: int
    ) -> ExampleGuestAdapter | None:
        members = layout.structs.get("process", {})
        if address is None or "pid" not in members or "name" not in members:
            return None
        name_size = members["name"].size or 16
        return cls(address, members["pid"].offset, members["name"].offset, name_size, word)

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        slot = self.cpu_current + self.bias + self.word * registers.vcpu
        pointer = read_word(memory, slot, self.word)
        if pointer == 0:
            return KERNEL_ONLY
        return self.fields.read(memory, pointer)

    def relocate(self, bias: int) -> None:
        self.bias = bias

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        """The example guest's kernel saves no user registers where this could find them."""
        return None

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        """One stack per CPU, the one RSP is on: nothing to add."""
        return None
