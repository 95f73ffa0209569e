"""From a captured RawSample to a symbolized Sample: pure, replayable, safe on any guest data."""

from __future__ import annotations

from qmpprof.guest.mode import mode_of
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import FrameAddress, FrameKind, RawSample, Sample, StopReason, UnwoundStack
from qmpprof.symbols.symbolizer import Symbolizer
from qmpprof.unwind.framepointer import DEFAULT_MAX_DEPTH
from qmpprof.unwind.unwinder import CfiLookup, Strategy, dwarf_registers, unwind


class Analyzer:
    """Unwinds and symbolizes raw samples with one set of modules."""

    def __init__(
        self,
        symbolizer: Symbolizer,
        cfi: CfiLookup | None = None,
        code: MemoryReader | None = None,
        strategy: Strategy = Strategy.AUTO,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self.symbolizer = symbolizer
        self.cfi = cfi
        self.code = code
        self.strategy = strategy
        self.max_depth = max_depth

    def unwind(self, raw: RawSample) -> UnwoundStack:
        """The addresses of `raw`'s stack, leaf first."""
        regs = raw.registers
        if raw.stack is None:
            leaf = FrameAddress(regs.rip, FrameKind.INSTRUCTION)
            return UnwoundStack((leaf,), StopReason.NO_STACK)
        memory = WindowMemory([raw.stack])
        return unwind(
            dwarf_registers(regs), memory, self.cfi, self.strategy, self.code, self.max_depth
        )

    def analyze(self, raw: RawSample) -> Sample:
        """Unwind and symbolize one vCPU's capture."""
        stack = self.unwind(raw)
        return Sample(
            time=raw.time,
            vcpu=raw.vcpu,
            mode=mode_of(raw.registers),
            frames=tuple(self.symbolizer.symbolize(f) for f in stack.frames),
            stop=stack.stop,
            fault_address=stack.fault_address,
        )
