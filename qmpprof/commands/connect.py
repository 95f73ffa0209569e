"""Connecting the commands that talk to QEMU: the QMP session, memory and capturer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, say_on_stderr
from qmpprof.errors import BadElf, KernelMismatch, UsageError
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.guest.linux.from_memory import GuestKernel
from qmpprof.modules import load_module
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.record.guest_kernel import ADVICE, check_build_id, read_kernel
from qmpprof.record.kernel_modules import KernelModules
from qmpprof.record.process_maps import ProcessMaps
from qmpprof.record.relocation import KernelPlacement, kernel_slide_of
from qmpprof.symbols.kernel_object import ModuleFiles
from qmpprof.target.direct import identify_qemu
from qmpprof.target.memory import MemoryBackend, open_memory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.recovery import claim, release
from qmpprof.visible import visible


@contextlib.asynccontextmanager
async def connected(
    options: TargetOptions, analyzer: Analyzer, notice: Callable[[str], None] = say_on_stderr
) -> AsyncIterator[tuple[QmpSession, MemoryBackend, Capturer]]:
    """A QMP session, a memory backend and a capturer over them, closed on the way out.

    First resumes a VM that a qmpprof which died left paused (telling `notice`, one
    line) and claims the socket's pause marker (target.recovery); raises UsageError
    when `options.cpus` names a vCPU the guest does not have. Without a kernel file, a
    Linux guest's kernel is read from its memory (record/guest_kernel.py), or fetched
    from debuginfod by the build-id found there. A Linux kernel's KASLR
    slide is found before the first sample (record/relocation.py) and given to
    `analyzer` as the kernel's bias, and its loaded modules are read then
    (record/kernel_modules.py) and again when samples run in kernel code nowhere known;
    each process's file mappings are read as its samples come (record/process_maps.py).
    With `options.libvirt`, the domain is reached through libvirt's QMP proxy, started
    and stopped here (target/libvirt.py); either way QEMU's pid is checked before its
    memory is read (target/direct.py identify_qemu)."""
    async with (
        _session(options) as (session, described),
        _capturing(session, options, analyzer, notice, described) as connection,
    ):
        yield connection


@contextlib.asynccontextmanager
async def _session(options: TargetOptions) -> AsyncIterator[tuple[QmpSession, str | None]]:
    """The QMP session, QEMU's process identified; through libvirt's proxy for
    --libvirt, with a line saying which QEMU that is."""
    async with contextlib.AsyncExitStack() as stack:
        if options.libvirt is not None:
            from qmpprof.target.libvirt import proxied  # a subprocess: only when asked

            await stack.enter_async_context(
                proxied(options.libvirt, options.libvirt_uri, options.qmp_socket)
            )
        session = await QmpSession.connect(options.qmp_socket)
        stack.push_async_callback(session.close)
        described = None
        if options.libvirt is not None:
            described = await _identify_libvirt_qemu(session, options.libvirt, options)
        else:
            await identify_qemu(session, options.qemu_pid)
        yield session, described


async def _identify_libvirt_qemu(session: QmpSession, domain: str, options: TargetOptions) -> str:
    """QEMU's pid from libvirt (or --pid), checked; none on another host (memory is
    then read through the monitor, and direct says why not). Says which QEMU."""
    from qmpprof.target.libvirt import describe_owner, find_qemu

    found = await find_qemu(session, options.libvirt_uri)
    given, how = (options.qemu_pid, "--pid") if options.qemu_pid else (found.pid, found.how)
    await identify_qemu(session, given, how)
    if given is None:
        session.qemu_pid, session.not_qemu = None, found.how
        return f"libvirt domain {visible(domain)}: {found.how}"
    owner = describe_owner(given)
    return f"libvirt domain {visible(domain)}: QEMU pid {given} ({owner}, from {how})"


@contextlib.asynccontextmanager
async def _capturing(
    session: QmpSession,
    options: TargetOptions,
    analyzer: Analyzer,
    notice: Callable[[str], None],
    described: str | None,
) -> AsyncIterator[tuple[QmpSession, MemoryBackend, Capturer]]:
    """connected()'s work once QEMU is identified (`described`: the line for libvirt)."""
    try:
        await claim(session, notice)
        await check_cpus(session, options.cpus)
        memory = await open_memory(session, options.memory, options.mem_path, notice)
        if described is not None:
            notice(f"{described}; memory backend: {describe_memory(memory)}")
        config = CaptureConfig(options.stack_bytes, options.cpus, options.unwind_paused)
        try:
            found = None
            if analyzer.kernel is None:
                found = await _kernel_from_guest(session, memory, analyzer, notice)
            placed = await _placement(session, memory, analyzer, found, notice)
            if found is None and analyzer.kernel and isinstance(analyzer.adapter, LinuxAdapter):
                check_build_id(session, memory, analyzer.kernel)  # after the IDT's say
            modules = None
            if placed is not None:
                if placed.slide:
                    analyzer.relocate_kernel(placed.slide)
                files = ModuleFiles(options.module_dirs, notice)
                modules = KernelModules.of_guest(analyzer, memory, placed.vcpu, files)
            if modules is not None:
                await modules.read()
            maps = ProcessMaps.of_guest(analyzer.kernel_types, analyzer.adapter, memory)
            capturer = Capturer(session, memory, analyzer, config, modules, maps)
            yield session, memory, capturer
        finally:
            await memory.close()
    finally:
        release(session)


async def _kernel_from_guest(
    session: QmpSession, memory: MemoryBackend, analyzer: Analyzer, notice: Callable[[str], None]
) -> GuestKernel | None:
    """No --kernel: the kernel read from the guest's memory, given to `analyzer`."""
    found = read_kernel(session, memory, notice)
    if found is None:
        return None
    analyzer.use_kernel(found.module, found.adapter, found.types)
    analyzer.kernel_source = found.describe()
    analyzer.kernel_release = found.info.release
    servers = analyzer.files.servers
    vmlinux = servers.debuginfo(found.info.build_id) if servers and found.info.build_id else None
    if vmlinux is not None:
        _use_vmlinux(analyzer, vmlinux, found, notice)
    return found


def _use_vmlinux(
    analyzer: Analyzer, vmlinux: Path, found: GuestKernel, notice: Callable[[str], None]
) -> None:
    """The guest kernel's own debug file, fetched by its build-id: inlined frames and
    source lines, as with --kernel (its banner is checked against the guest's as with
    --kernel). One that does not load leaves the kernel read from memory."""
    from qmpprof.guest.registry import choose_adapter  # every adapter: only for an ELF

    try:
        module = load_module(vmlinux, "vmlinux", shown="vmlinux")  # cached as `debuginfo`
    except BadElf as err:
        notice(f"debuginfod's vmlinux for {visible(found.info.release)} is unusable: {err}")
        return
    analyzer.use_kernel(module, choose_adapter(vmlinux), ElfTypes(vmlinux))
    analyzer.kernel_source = found.describe_from(f"debuginfod: {visible(str(vmlinux))}")


async def _placement(
    session: QmpSession,
    memory: MemoryBackend,
    analyzer: Analyzer,
    found: GuestKernel | None,
    notice: Callable[[str], None],
) -> KernelPlacement | None:
    """The kernel's slide (record/relocation.py). A kernel `found` in guest memory is
    kept only when the IDT's divide-error gate, read through its symbols, gives the
    slide its VMCOREINFO says; else it is dropped, with one line to `notice`."""
    if found is None:
        return await kernel_slide_of(session, memory, analyzer)
    try:
        placed = await kernel_slide_of(session, memory, analyzer)
    except KernelMismatch:
        placed = None
    slide = found.info.kernel_offset
    if placed is not None and placed.slide == slide:
        return placed
    seen = "no slide" if placed is None else f"slide {placed.slide:#x}"
    notice(
        f"the kernel in guest memory says KASLR slide {slide:#x}, its IDT gives {seen}: "
        f"not used; {ADVICE}"
    )
    analyzer.forget_kernel()
    return None


def describe_memory(memory: MemoryBackend) -> str:
    """`direct (/proc/PID/mem)`: the backend's name and source."""
    detail = getattr(memory, "detail", None)
    return f"{memory.name} ({detail})" if detail else memory.name


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
