"""OS awareness as a plug-in: which process runs on a vCPU.

An adapter is pure: it reads guest memory through a MemoryReader (which may raise
MemoryFault with the address it needs; the capture step then fetches it and asks
again) and returns a Process, or None when it cannot tell. Which adapter a kernel
gets is decided by cheap probes of its ELF (guest/registry.py): `KernelFacts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qmpprof.guest.kernel_types import KernelTypes
from qmpprof.memory import MemoryReader
from qmpprof.model import Process, RegisterSet

#: A task's user-space registers, indexed by DWARF register number (None: unknown).
UserRegisters = list[int | None] | None


class OsAdapter(Protocol):
    name: str
    #: Whether `user_root` can answer (where the register dump lacks the root).
    gives_user_roots: bool

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        """The process running on this vCPU. Raises MemoryFault for memory it needs."""
        ...

    def relocate(self, bias: int) -> None:
        """The kernel runs `bias` bytes from its link address (a KASLR slide): the
        kernel addresses the adapter reads move with it."""
        ...

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        """The registers the running task had in user space when it last entered the
        kernel (DWARF-numbered), for a kernel sample whose unwind did not get there; None
        for a kernel thread, or when the OS keeps no such record. Raises MemoryFault."""
        ...

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        """The running task's kernel stack, (start, size), when the OS keeps one per task
        and an unwind may leave the stack RSP is on for it (an interrupt stack's); None
        when it does not or cannot tell. Raises MemoryFault."""
        ...

    def user_root(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        """The page-table root of the running task's user half, where the register dump
        lacks it (AArch64's TTBR0_EL1: its value, ASID included); None where the OS
        does not say. Raises MemoryFault."""
        ...


class GenericAdapter:
    """Knows no OS: samples are labelled by address space (CR3) only."""

    name = "generic"
    gives_user_roots = False

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        return None

    def relocate(self, bias: int) -> None:
        pass

    def user_registers(self, registers: RegisterSet, memory: MemoryReader) -> UserRegisters:
        return None

    def kernel_stack(self, registers: RegisterSet, memory: MemoryReader) -> tuple[int, int] | None:
        return None

    def user_root(self, registers: RegisterSet, memory: MemoryReader) -> int | None:
        return None


#: Longest process name read from a guest.
NAME_LIMIT = 64


@dataclass(frozen=True)
class TaskFields:
    """Where a guest's process structure keeps its pid (a 32-bit signed integer) and its
    name (NUL-terminated bytes), from the kernel's type information. Make it with
    `task_fields`, which bounds the name."""

    pid_offset: int
    name_offset: int
    name_size: int

    def read(self, memory: MemoryReader, task: int) -> Process:
        """The process whose structure is at `task`. Raises MemoryFault."""
        pid = int.from_bytes(memory.read(task + self.pid_offset, 4), "little", signed=True)
        return Process(pid, task_name(memory.read(task + self.name_offset, self.name_size)))


def task_name(raw: bytes) -> str:
    """A process name as the guest stores it: bytes up to the first NUL ("?" if none)."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or "?"


def task_fields(pid_offset: int, name_offset: int, name_size: int) -> TaskFields:
    return TaskFields(pid_offset, name_offset, min(name_size, NAME_LIMIT))


@dataclass(frozen=True)
class KernelFacts:
    """What adapters probe a kernel ELF for, read without touching its DWARF: the
    addresses of the symbols some adapter asked about (data, and code labels such as
    entry_SYSCALL_64), and its section names."""

    path: Path
    symbols: dict[str, int]
    sections: frozenset[str]
    #: Where its struct layouts and other data symbols come from.
    types: KernelTypes
    #: The size of a pointer in it: 8 (ELF64), 4 (ELF32).
    word: int = 8


class AdapterKind(Protocol):
    """An adapter class in the registry: a probe, then a constructor reading only what
    that adapter needs (None when the kernel turns out not to fit after all)."""

    name: str
    probe_symbols: frozenset[str]

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool: ...

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> OsAdapter | None: ...
