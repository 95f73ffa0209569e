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
        self,
        cpu_current: int,
        pid_offset: int,
        name_offset: int,
        name_size: int,
        word: int = 8,
        root_offset: int | None = None,
    ):
        self.cpu_current = cpu_current
        self.fields = task_fields(pid_offset, name_offset, name_size)
        self.bias = 0
        #: The size of a pointer in cpu_current[]: 8 in the 64-bit build, 4 in the i386 one.
        self.word = word
        #: Where struct process keeps its page-table root (`cr3`: the AArch64 build's
        #: TTBR0_EL1 value), if it has one.
        self.root_offset = root_offset
        self.gives_user_roots = root_offset is not None

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
        root = members["cr3"].offset if "cr3" in members else None
        pid, name = members["pid"].offset, members["name"].offset
        return cls(address, pid, name, name_size, word, root)

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        pointer = self._current(registers, memory)
        if pointer == 0:
            return KERNEL_ONLY
        return self.fields.read(memory, pointer)

    def _current(self, registers: RegisterSet, memory: MemoryReader) -> int:
        slot = self.cpu_current + self.bias + self.word * registers.vcpu
        return read_word(memory, slot, self.word)

    def user_root(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """The running process's `cr3` (its TTBR0_EL1); None with none running."""
        pointer = self._current(registers, memory)
        if pointer == 0 or self.root_offset is None:
            return None
        return read_word(memory, pointer + self.root_offset, 8)

    def relocate(self, bias: int) -> None:
        self.bias = bias

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        """The example guest's kernel saves no user registers where this could find them."""
        return None

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        """One stack per CPU, the one RSP is on: nothing to add."""
        return None
