"""OS awareness as a plug-in: which process runs on a vCPU.

An adapter is pure: it reads guest memory through a MemoryReader (which may raise
MemoryFault with the address it needs; the capture step then fetches it and asks
again) and returns a Process, or None when it cannot tell. A Linux adapter (per-CPU
`current_task`, KASLR from a known symbol) fits the same interface.
"""

from __future__ import annotations

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
