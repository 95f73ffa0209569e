"""From a captured RawSample to a symbolized Sample: pure, replayable, safe on any guest data.

Each sample runs in one address space: the kernel's module covers the upper half, the
user binary identified for its CR3 (if any) the lower half.
"""

from __future__ import annotations

from collections.abc import Mapping

from qmpprof.errors import MemoryFault
from qmpprof.guest.adapter import GenericAdapter, OsAdapter
from qmpprof.guest.mode import mode_of
from qmpprof.memory import WindowMemory
from qmpprof.model import (
    FrameAddress,
    FrameKind,
    Mode,
    Process,
    RawSample,
    Sample,
    StopReason,
    UnwoundStack,
    is_kernel_address,
)
from qmpprof.modules import Module
from qmpprof.symbols.symbolizer import Symbolizer
from qmpprof.unwind.callsite import follows_call
from qmpprof.unwind.framepointer import DEFAULT_MAX_DEPTH
from qmpprof.unwind.rules import UnwindRow
from qmpprof.unwind.unwinder import Strategy, dwarf_registers, unwind

#: Return-site answers an AddressSpace keeps (a profile meets a few thousand).
MAX_RETURN_SITES = 1 << 14


class AddressSpace:
    """The modules one sample can run in, routed by address half."""

    def __init__(self, kernel: Module | None, user: Module | None) -> None:
        self.kernel = kernel
        self.user = user
        self.symbolizer = Symbolizer([m.symbols for m in (kernel, user) if m is not None])
        self._return_sites: dict[int, bool | None] = {}

    def _module(self, address: int) -> Module | None:
        return self.kernel if is_kernel_address(address) else self.user

    def row_for(self, address: int) -> UnwindRow | None:
        module = self._module(address)
        return module.cfi.row_for(address) if module is not None else None

    def read(self, address: int, size: int) -> bytes:
        """Code bytes from the module's file (for the frame-pointer leaf heuristic)."""
        module = self._module(address)
        if module is None:
            raise MemoryFault(address, size)
        return module.code.read(address, size)

    def read_u64(self, address: int) -> int:
        return int.from_bytes(self.read(address, 8), "little")

    def is_return_site(self, address: int) -> bool | None:
        """Whether `address` can be a return address: in the code of the module that covers
        its half of the address space, right after a call. None when no module is known.

        Asked for every frame of every sample, and the modules' code never changes: the
        answers are kept (a bounded number)."""
        if address in self._return_sites:
            return self._return_sites[address]
        if len(self._return_sites) >= MAX_RETURN_SITES:
            self._return_sites.clear()
        known = self._return_sites[address] = self._decode_return_site(address)
        return known

    def _decode_return_site(self, address: int) -> bool | None:
        if self._module(address) is None:
            return None
        try:
            self.read(address - 1, 1)
        except MemoryFault:
            return False  # a known module's half, but not its code: garbage or torn
        return follows_call(self, address)


#: Capture-time unwinds kept for the analysis of the same RawSample (see missing_address).
MAX_REMEMBERED = 4096


class Analyzer:
    """Unwinds, symbolizes and labels raw samples with one kernel and its user binaries."""

    def __init__(
        self,
        kernel: Module | None = None,
        users: Mapping[str, Module] | None = None,
        adapter: OsAdapter | None = None,
        strategy: Strategy = Strategy.AUTO,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self.kernel = kernel
        self.users = dict(users or {})
        self.adapter: OsAdapter = adapter or GenericAdapter()
        self.strategy = strategy
        self.max_depth = max_depth
        self._spaces: dict[str | None, AddressSpace] = {}
        self._remembered: dict[int, tuple[RawSample, UnwoundStack, Process | None]] = {}

    @property
    def has_symbols(self) -> bool:
        return self.kernel is not None and len(self.kernel.symbols) > 0

    def space(self, raw: RawSample) -> AddressSpace:
        name = raw.user_module if raw.user_module in self.users else None
        if name not in self._spaces:
            self._spaces[name] = AddressSpace(self.kernel, self.users.get(name or ""))
        return self._spaces[name]

    def unwind(self, raw: RawSample) -> UnwoundStack:
        """The addresses of `raw`'s stack, leaf first."""
        regs = raw.registers
        if not raw.windows:
            leaf = FrameAddress(regs.rip, FrameKind.INSTRUCTION)
            return UnwoundStack((leaf,), StopReason.NO_STACK)
        space = self.space(raw)
        memory = WindowMemory(raw.windows)
        return unwind(dwarf_registers(regs), memory, space, self.strategy, space, self.max_depth)

    def process(self, raw: RawSample) -> Process | None:
        """The process the OS adapter sees on this vCPU; None if it cannot tell."""
        try:
            return self.adapter.process(raw.registers, WindowMemory(raw.windows))
        except MemoryFault:
            return None

    def missing_address(self, raw: RawSample) -> int | None:
        """An address this sample's unwind or process lookup needs and its windows lack.

        When nothing is missing, the unwind and process are remembered for `analyze`
        of this same RawSample, so a capture does not cost two unwinds.
        """
        stack = self.unwind(raw)
        if stack.stop is StopReason.FAULT and stack.fault_address is not None:
            return stack.fault_address
        try:
            process = self.adapter.process(raw.registers, WindowMemory(raw.windows))
        except MemoryFault as fault:
            return fault.address
        self._remember(raw, stack, process)
        return None

    def analyze(self, raw: RawSample) -> Sample:
        """Unwind, symbolize and label one vCPU's capture."""
        return self.symbolize(raw, *self.unwound(raw))

    def unwound(self, raw: RawSample) -> tuple[UnwoundStack, Process | None]:
        """`raw`'s stack and process: as `missing_address` left them, else found now."""
        remembered = self._remembered.pop(id(raw), None)
        if remembered is not None and remembered[0] is raw:
            return remembered[1], remembered[2]
        return self.unwind(raw), self.process(raw)

    def _remember(self, raw: RawSample, stack: UnwoundStack, process: Process | None) -> None:
        if len(self._remembered) >= MAX_REMEMBERED:  # samples never analysed: drop the oldest
            del self._remembered[next(iter(self._remembered))]
        self._remembered[id(raw)] = (raw, stack, process)

    def symbolize(self, raw: RawSample, stack: UnwoundStack, process: Process | None) -> Sample:
        """The Sample for an unwound stack of `raw` (a replay passes the recorded stack)."""
        space = self.space(raw)
        frames = tuple(space.symbolizer.symbolize(f) for f in stack.frames)
        mode = mode_of(raw.registers)
        return Sample(
            time=raw.time,
            vcpu=raw.vcpu,
            mode=mode,
            frames=frames,
            stop=stack.stop,
            address_space=raw.address_space,
            process=process,
            fault_address=stack.fault_address,
            unsymbolized=self._why_unsymbolized(raw, mode, frames[0].function),
            torn=any(
                f.kind is FrameKind.RETURN and space.is_return_site(f.address) is False
                for f in stack.frames
            ),
        )

    def _why_unsymbolized(self, raw: RawSample, mode: Mode, leaf: str | None) -> str | None:
        if mode is not Mode.USER or leaf is not None:
            return None
        if not self.users:
            return "no user binaries given (--user-dir / --user)"
        if raw.user_module is None:
            return f"no given binary matches address space cr3:{raw.address_space:#x}"
        return f"pc outside the symbols of {raw.user_module}"
