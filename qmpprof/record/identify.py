"""Which user binary runs in each address space: each candidate's .text, as far as the
guest has it mapped, compared with the file's. Cached per CR3; re-checked when a
user PC leaves the matched binary, and (for address spaces nothing matched) at most once
a second while they run user code."""

from __future__ import annotations

import time
from collections.abc import Mapping

from qmpprof.defaults import PAGE_SIZE
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
        if registers.isa != "x86_64" and not registers.cr3:
            # No page-table root in the dump (AArch64's TTBR0 is not there): no key to
            # remember a match by, each sample's text is compared again.
            return await self._match(registers.vcpu)
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
        return module.text is not None and not module.text.contains(registers.pc)

    async def _match(self, vcpu: int) -> str | None:
        for module in self._candidates:
            if await self._text_matches(vcpu, module):
                return module.name
        return None

    async def _text_matches(self, vcpu: int, module: Module) -> bool:
        """Whether every page of the module's .text the guest has mapped holds the
        file's bytes, and one page at least is mapped. Page by page: Linux maps a
        program's pages as they first run, so most of a large .text is not mapped."""
        text = module.text
        assert text is not None
        end = text.address + text.size
        mapped = 0
        for page in range(text.address - text.address % PAGE_SIZE, end, PAGE_SIZE):
            start = max(page, text.address)
            data = await self._memory.read_window(vcpu, start, min(page + PAGE_SIZE, end) - start)
            if not data:
                continue
            if data != module.code.read(start, len(data)):
                return False
            mapped += 1
        return mapped > 0
