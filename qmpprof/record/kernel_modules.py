"""A Linux guest's loaded kernel modules, read into the Analyzer (guest/linux/modules.py).

Read once per connection, after the KASLR slide (the list head moves with it), and
again when a sample's PC is in the kernel half but in neither the kernel's code nor a
known module's (a module loaded since): at most once per REREAD_INTERVAL_S, so a guest
running code nowhere known costs one walk a second, not one per tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from qmpprof.analysis import Analyzer
from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.modules import MAX_MODULES, ModuleListLayout, ModuleWalk
from qmpprof.guest.linux.modules import module_list_layout as _layout_of
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_HALF, CapturedSample, KernelModule, MemoryWindow
from qmpprof.symbols.kernel_object import ModuleFiles
from qmpprof.target.memory import MemoryBackend

REREAD_INTERVAL_S = 1.0
#: The list head, then one struct module per read.
MAX_READS = MAX_MODULES + 1


async def walk_modules(
    memory: MemoryBackend, vcpu: int, layout: ModuleListLayout, slide: int
) -> tuple[KernelModule, ...]:
    """The guest's module list, read through `vcpu`'s page tables one struct at a time;
    as far as it is readable (a node that cannot be read ends it)."""
    walk = ModuleWalk(layout, slide)
    window = WindowMemory(())
    for _ in range(MAX_READS):
        try:
            return walk.advance(window)
        except MemoryFault as fault:
            data = await memory.read_window(vcpu, fault.address, fault.size)
            if len(data) < fault.size:
                break
            window = WindowMemory([MemoryWindow(fault.address, data)])
    return tuple(walk.found)


class KernelModules:
    """Keeps an Analyzer's kernel modules up to date with the guest's."""

    def __init__(
        self,
        analyzer: Analyzer,
        memory: MemoryBackend,
        vcpu: int,
        layout: ModuleListLayout,
        files: ModuleFiles | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`files`: the modules' .ko files (--module-dir), for their symbols."""
        self._files = files
        self._analyzer = analyzer
        self._memory = memory
        self._vcpu = vcpu
        self._layout = layout
        self._clock = clock
        self._last: float | None = None

    @classmethod
    def of_guest(
        cls, analyzer: Analyzer, memory: MemoryBackend, vcpu: int, files: ModuleFiles | None
    ) -> KernelModules | None:
        """For a Linux kernel whose vmlinux describes its module list; else None."""
        types = analyzer.kernel_types
        if types is None or not isinstance(analyzer.adapter, LinuxAdapter):
            return None
        layout = _layout_of(types)
        return None if layout is None else cls(analyzer, memory, vcpu, layout, files)

    async def read(self) -> None:
        self._last = self._clock()
        slide = self._analyzer.kernel_bias
        loaded = await walk_modules(self._memory, self._vcpu, self._layout, slide)
        files = self._files.for_modules(loaded) if self._files is not None else None
        self._analyzer.place_kernel_modules(loaded, files)

    async def check(self, samples: Iterable[CapturedSample]) -> None:
        """Read the list again if a sample ran kernel code nowhere known, and the last
        read is REREAD_INTERVAL_S old."""
        if self._last is not None and self._clock() - self._last < REREAD_INTERVAL_S:
            return
        if any(self._unknown(sample.raw.registers.rip) for sample in samples):
            await self.read()

    def _unknown(self, pc: int) -> bool:
        kernel = self._analyzer.kernel
        if pc < KERNEL_HALF or kernel is None:
            return False
        bias = self._analyzer.kernel_bias
        in_kernel = kernel.extent[0] + bias <= pc < kernel.extent[1] + bias
        return not in_kernel and self._analyzer.kernel_module_at(pc) is None
