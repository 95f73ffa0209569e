"""Setup shared by the commands that talk to QEMU: symbols, connection, memory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.symbols.elf import load_symbols
from qmpprof.symbols.image import load_code
from qmpprof.symbols.symbolizer import Symbolizer
from qmpprof.target.memory import MemoryBackend, open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.unwinder import Strategy


@dataclass(frozen=True)
class TargetOptions:
    """How to reach the guest and what to read from it."""

    qmp_socket: str
    kernel: Path | None
    memory: str = "auto"
    stack_bytes: int = 16 * 1024
    max_depth: int = 128
    unwind: Strategy = Strategy.AUTO


def build_analyzer(options: TargetOptions) -> Analyzer:
    """Load the guest's symbols (raises BadElf) and make the analyzer that uses them."""
    if options.kernel is None:
        return Analyzer(Symbolizer([]), strategy=options.unwind, max_depth=options.max_depth)
    return Analyzer(
        Symbolizer([load_symbols(options.kernel)]),
        cfi=load_cfi(options.kernel),
        code=load_code(options.kernel),
        strategy=options.unwind,
        max_depth=options.max_depth,
    )


@contextlib.asynccontextmanager
async def connected(options: TargetOptions) -> AsyncIterator[tuple[QmpSession, MemoryBackend]]:
    """A QMP session and a memory backend, both closed on the way out."""
    session = await QmpSession.connect(options.qmp_socket)
    try:
        memory = await open_memory(session, options.memory)
        try:
            yield session, memory
        finally:
            await memory.close()
    finally:
        await session.close()
