"""Setup shared by the commands that talk to QEMU: binaries, connection, memory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.guest.adapter import GenericAdapter, OsAdapter
from qmpprof.guest.example import ExampleGuestAdapter
from qmpprof.modules import load_module, load_user_modules
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.target.memory import MemoryBackend, open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.unwind.unwinder import Strategy


@dataclass(frozen=True)
class TargetOptions:
    """How to reach the guest, which binaries it runs and what to read from it."""

    qmp_socket: str
    kernel: Path | None
    user_dirs: tuple[Path, ...] = ()
    user_files: tuple[Path, ...] = ()
    memory: str = "auto"
    mem_path: str | None = None
    stack_bytes: int = 16 * 1024
    max_depth: int = 128
    unwind: Strategy = Strategy.AUTO
    cpus: tuple[int, ...] = field(default=())


def build_analyzer(options: TargetOptions) -> Analyzer:
    """Load the guest's binaries (raises BadElf) and make the analyzer that uses them."""
    kernel = load_module(options.kernel) if options.kernel is not None else None
    users = load_user_modules(list(options.user_dirs), list(options.user_files))
    return Analyzer(kernel, users, _adapter(options.kernel), options.unwind, options.max_depth)


def module_paths(analyzer: Analyzer) -> dict[str, Path]:
    """The ELF file of each module, by the name frames carry (the file name)."""
    modules = [analyzer.kernel, *analyzer.users.values()]
    return {m.symbols.name: m.path for m in modules if m is not None}


def _adapter(kernel: Path | None) -> OsAdapter:
    """The OS adapter the kernel ELF calls for; the generic one when none applies."""
    if kernel is not None and (example := ExampleGuestAdapter.from_kernel(kernel)) is not None:
        return example
    return GenericAdapter()


@contextlib.asynccontextmanager
async def connected(
    options: TargetOptions, analyzer: Analyzer
) -> AsyncIterator[tuple[QmpSession, MemoryBackend, Capturer]]:
    """A QMP session, a memory backend and a capturer over them, closed on the way out."""
    session = await QmpSession.connect(options.qmp_socket)
    try:
        memory = await open_memory(session, options.memory, options.mem_path)
        config = CaptureConfig(stack_bytes=options.stack_bytes, cpus=options.cpus)
        try:
            yield session, memory, Capturer(session, memory, analyzer, config)
        finally:
            await memory.close()
    finally:
        await session.close()
