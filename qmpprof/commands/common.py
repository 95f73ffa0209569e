"""Setup shared by the commands that talk to QEMU: binaries, connection, memory."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.errors import UsageError
from qmpprof.guest.adapter import GenericAdapter, OsAdapter
from qmpprof.guest.registry import choose_adapter
from qmpprof.modules import load_module, load_user_modules
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.target.memory import MemoryBackend, open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.recovery import claim, release
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


def cfi_problems(analyzer: Analyzer, compile_all: bool) -> list[str]:
    """One line per module with functions whose CFI could not be compiled; `compile_all`
    checks every function (seconds for a large binary), else only those samples reached."""
    modules = [analyzer.kernel, *analyzer.users.values()]
    lines = []
    for module in modules:
        if module is not None and (uncompiled := module.cfi.uncompiled(compile_all)):
            lines.append(f"{module.symbols.name}: {uncompiled.summary()}")
    return lines


def module_paths(analyzer: Analyzer) -> dict[str, Path]:
    """The ELF file of each module, by the name frames carry (the file name)."""
    modules = [analyzer.kernel, *analyzer.users.values()]
    return {m.symbols.name: m.path for m in modules if m is not None}


def _adapter(kernel: Path | None) -> OsAdapter:
    """The OS adapter the kernel ELF calls for; the generic one when none applies."""
    return choose_adapter(kernel) if kernel is not None else GenericAdapter()


def say_on_stderr(line: str) -> None:
    print(f"qmpprof: {line}", file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def connected(
    options: TargetOptions, analyzer: Analyzer, notice: Callable[[str], None] = say_on_stderr
) -> AsyncIterator[tuple[QmpSession, MemoryBackend, Capturer]]:
    """A QMP session, a memory backend and a capturer over them, closed on the way out.

    First resumes a VM that a qmpprof which died left paused (telling `notice`, one
    line) and claims the socket's pause marker (target.recovery); raises UsageError
    when `options.cpus` names a vCPU the guest does not have."""
    session = await QmpSession.connect(options.qmp_socket)
    try:
        await claim(session, notice)
        await check_cpus(session, options.cpus)
        memory = await open_memory(session, options.memory, options.mem_path)
        config = CaptureConfig(stack_bytes=options.stack_bytes, cpus=options.cpus)
        try:
            yield session, memory, Capturer(session, memory, analyzer, config)
        finally:
            await memory.close()
    finally:
        release(session)
        await session.close()


async def check_cpus(session: QmpSession, cpus: Collection[int]) -> None:
    """Raise UsageError when `cpus` names a vCPU index QEMU does not have."""
    if not cpus:
        return
    present = {cpu.get("cpu-index") for cpu in await session.execute("query-cpus-fast")}
    missing = sorted(set(cpus) - present)
    if missing:
        have = ", ".join(str(i) for i in sorted(i for i in present if isinstance(i, int)))
        raise UsageError(
            f"--cpus: no vCPU {', '.join(map(str, missing))} in this guest (it has {have})"
        )
