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
from qmpprof.guest.linux.module_symbols import (
    ModuleSymbolsLayout,
    module_from_memory,
    strings_needed,
)
from qmpprof.guest.linux.modules import MAX_MODULES, ModuleListLayout, ModuleWalk
from qmpprof.guest.linux.modules import module_list_layout as _layout_of
from qmpprof.memory import WindowMemory
from qmpprof.model import KERNEL_HALF, CapturedSample, KernelModule, MemoryWindow
from qmpprof.modules import Module
from qmpprof.symbols.kernel_object import ModuleFiles
from qmpprof.target.memory import MemoryBackend
from qmpprof.unwind.orc import ENTRY_SIZE, Layout

REREAD_INTERVAL_S = 1.0
#: The list head, then one struct module per read.
MAX_READS = MAX_MODULES + 1


async def walk_modules(
    memory: MemoryBackend, vcpu: int, layout: ModuleListLayout, slide: int
) -> ModuleWalk:
    """The guest's module list, read through `vcpu`'s page tables one struct at a time;
    as far as it is readable (a node that cannot be read ends it): `found`, `structs`."""
    walk = ModuleWalk(layout, slide)
    window = WindowMemory(())
    for _ in range(MAX_READS):
        try:
            walk.advance(window)
            return walk
        except MemoryFault as fault:
            data = await memory.read_window(vcpu, fault.address, fault.size)
            if len(data) < fault.size:
                break
            window = WindowMemory([MemoryWindow(fault.address, data)])
    return walk


async def read_module_symbols(
    memory: MemoryBackend,
    vcpu: int,
    layout: ModuleSymbolsLayout,
    loaded: KernelModule,
    struct_at: int,
    orc_layout: Layout | None,
) -> Module:
    """`loaded`'s symbols (and ORC, given the kernel's `orc_layout`) from its struct
    module, as far as they read; by name alone where nothing does."""
    pointers = layout.pointers(await memory.read_window(vcpu, struct_at, layout.span))
    symtab = await memory.read_window(vcpu, pointers.symtab, 24 * pointers.symbols)
    strtab = await memory.read_window(vcpu, pointers.strtab, strings_needed(symtab))
    orc = None
    if orc_layout is not None and pointers.orcs:
        ips = await memory.read_window(vcpu, pointers.orc_ip, 4 * pointers.orcs)
        entries = await memory.read_window(vcpu, pointers.orc, ENTRY_SIZE * pointers.orcs)
        orc = (ips, pointers.orc_ip, entries, orc_layout)
    return module_from_memory(loaded, symtab, strtab, orc)


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
        """`files`: the modules' .ko files (--module-dir), for their symbols; a module
        without one has them read from its struct module (`symbols`) when the kernel's
        types describe it."""
        self._files = files
        self._symbols = (
            ModuleSymbolsLayout.of(analyzer.kernel_types) if analyzer.kernel_types else None
        )
        self._from_memory: dict[tuple[str, int, int], Module] = {}
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
        walk = await walk_modules(self._memory, self._vcpu, self._layout, slide)
        loaded = tuple(walk.found)
        files = self._files.for_modules(loaded) if self._files is not None else {}
        for module in loaded:
            if module.name not in files and module.name in walk.structs:
                found = await self._read_symbols(module, walk.structs[module.name])
                if found is not None:
                    files[module.name] = found
        self._analyzer.place_kernel_modules(loaded, files)

    async def _read_symbols(self, loaded: KernelModule, struct_at: int) -> Module | None:
        """A module's symbols from its struct module, read once per load of it."""
        key = (loaded.name, loaded.base, loaded.size)
        if self._symbols is None:
            return None
        if key not in self._from_memory:
            if len(self._from_memory) >= MAX_MODULES:
                self._from_memory.clear()
            kernel = self._analyzer.kernel
            orc_layout = kernel.orc.layout if kernel is not None and kernel.orc else None
            self._from_memory[key] = await read_module_symbols(
                self._memory, self._vcpu, self._symbols, loaded, struct_at, orc_layout
            )
        return self._from_memory[key]

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
