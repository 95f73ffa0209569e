"""Which user binary runs in each address space: the SHA-256 of each candidate's .text,
as the guest has it mapped, compared with the file's. Cached per CR3; re-checked when a
user PC leaves the matched binary, and (for address spaces nothing matched) at most once
a second while they run user code."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from qmpprof.guest.mode import mode_of
from qmpprof.model import Mode, RegisterSet
from qmpprof.modules import Module
from qmpprof.target.memory import MemoryBackend

RETRY_UNMATCHED_S = 1.0


class AddressSpaceIdentifier:
    """Matches address spaces (CR3) to user binaries by reading their .text from the guest."""

    def __init__(self, memory: MemoryBackend, candidates: Mapping[str, Module]) -> None:
        self._memory = memory
        self._candidates = [m for m in candidates.values() if m.text is not None]
        self._cache: dict[int, tuple[str | None, float]] = {}

    async def identify(self, registers: RegisterSet) -> str | None:
        """The name of the binary mapped in this vCPU's address space, or None."""
        if not self._candidates:
            return None
        cr3 = registers.cr3 & ~0xFFF
        cached = self._cache.get(cr3)
        if cached is not None and not self._stale(cached, registers):
            return cached[0]
        name = await self._match(registers.vcpu)
        self._cache[cr3] = (name, time.monotonic())
        return name

    def _stale(self, cached: tuple[str | None, float], registers: RegisterSet) -> bool:
        name, checked = cached
        if mode_of(registers) is not Mode.USER:
            return False
        if name is None:
            return time.monotonic() - checked > RETRY_UNMATCHED_S
        module = next(m for m in self._candidates if m.name == name)
        return module.text is not None and not module.text.contains(registers.rip)

    async def _match(self, vcpu: int) -> str | None:
        digests: dict[tuple[int, int], str] = {}
        for module in self._candidates:
            assert module.text is not None
            key = (module.text.address, module.text.size)
            if key not in digests:
                data = await self._memory.read_window(vcpu, *key)
                digests[key] = hashlib.sha256(data).hexdigest() if len(data) == key[1] else ""
            if digests[key] == module.text.sha256:
                return module.name
        return None
