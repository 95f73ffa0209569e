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

from qmpprof.memory import MemoryReader
from qmpprof.model import Process, RegisterSet


class OsAdapter(Protocol):
    name: str

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        """The process running on this vCPU. Raises MemoryFault for memory it needs."""
        ...


class GenericAdapter:
    """Knows no OS: samples are labelled by address space (CR3) only."""

    name = "generic"

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        return None


@dataclass(frozen=True)
class KernelFacts:
    """What adapters probe a kernel ELF for, read without touching its DWARF: the
    addresses of the data symbols some adapter asked about, and its section names."""

    path: Path
    symbols: dict[str, int]
    sections: frozenset[str]


class AdapterKind(Protocol):
    """An adapter class in the registry: a probe, then a constructor reading only what
    that adapter needs (None when the kernel turns out not to fit after all)."""

    name: str
    probe_symbols: frozenset[str]

    @classmethod
    def probe(cls, facts: KernelFacts) -> bool: ...

    @classmethod
    def from_facts(cls, facts: KernelFacts) -> OsAdapter | None: ...
