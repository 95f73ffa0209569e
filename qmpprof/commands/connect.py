"""Connecting the commands that talk to QEMU: the QMP session, memory and capturer."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator, Callable, Collection
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, say_on_stderr
from qmpprof.errors import BadElf, ConnectionFailed, KernelMismatch, UsageError
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
from qmpprof.target.direct import DirectMemory, identify_qemu
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
    """The QMP session, QEMU's process identified; through libvirt for --libvirt (its
    own QMP socket when the domain has one), with a line saying which QEMU that is."""
    async with contextlib.AsyncExitStack() as stack:
        if options.libvirt is None:
            session = await QmpSession.connect(options.qmp_socket, _timeout(options))
            stack.push_async_callback(session.close)
            await identify_qemu(session, options.qemu_pid)
            yield session, None
            return
        bridged, monitor = await _through_libvirt(stack, options)
        if bridged is None:
            own = await _own_monitor(stack, options, monitor)
            yield own, await _describe_own_monitor(own, options.libvirt, monitor)
            return
        yield bridged, await _identify_libvirt_qemu(bridged, options.libvirt, options)


def _timeout(options: TargetOptions) -> float:
    """How long to wait for a greeting: --connect-timeout, else the default for a QMP
    socket (QEMU greets at once) or for libvirt (a round trip through libvirtd)."""
    from qmpprof.target.libvirt import LIBVIRT_CONNECT_S
    from qmpprof.target.qmp import CONNECT_TIMEOUT_S

    if options.connect_timeout is not None:
        return options.connect_timeout
    return LIBVIRT_CONNECT_S if options.libvirt is not None else CONNECT_TIMEOUT_S


async def _through_libvirt(
    stack: contextlib.AsyncExitStack, options: TargetOptions
) -> tuple[QmpSession | None, str]:
    """The session through libvirt's binding, kept on `stack`; or (None, PATH) when the
    domain has a QMP socket of its own at PATH (the bridge is then closed at once)."""
    from qmpprof.target.libvirt import bridged, dedicated_monitor  # only when asked

    assert options.libvirt is not None
    timeout = _timeout(options)
    async with contextlib.AsyncExitStack() as bridge:
        sock = await bridge.enter_async_context(
            bridged(options.libvirt, options.libvirt_uri, timeout)
        )
        session = await QmpSession.over(sock, options.qmp_socket, timeout)
        session.one_at_a_time = True  # each command a round trip through libvirt
        # A fresh connection is a new bridge: the next command on the domain resumes it.
        uri = f" --libvirt-uri {options.libvirt_uri}" if options.libvirt_uri else ""
        session.resume_hint = f"qmpprof dump --libvirt {options.libvirt}{uri}"
        bridge.push_async_callback(session.close)
        monitor = dedicated_monitor(session.greeting)
        if monitor is not None:
            return None, monitor
        stack.push_async_exit(bridge.pop_all())
        return session, ""


async def _own_monitor(
    stack: contextlib.AsyncExitStack, options: TargetOptions, path: str
) -> QmpSession:
    """A session on the QMP socket the domain's XML gives QEMU, whose peer must be the
    domain's QEMU (checked as for --qmp-socket, and by its -name)."""
    from qmpprof.target.libvirt import names_domain

    try:
        session = await QmpSession.connect(path, _timeout(options))
    except ConnectionFailed as err:
        raise UsageError(f"libvirt domain {options.libvirt}'s own QMP socket: {err}") from err
    stack.push_async_callback(session.close)
    await identify_qemu(session, options.qemu_pid)
    name = str((await session.execute("query-name")).get("name", ""))
    if session.qemu_pid is None or not names_domain(session.qemu_pid, name):
        raise UsageError(
            f"libvirt domain {options.libvirt}'s own QMP socket {path} is not served by "
            f"its QEMU ({session.not_qemu or 'another process'})"
        )
    return session


async def _describe_own_monitor(session: QmpSession, domain: str, path: str) -> str:
    from qmpprof.target.libvirt import describe_owner

    pid = session.qemu_pid
    assert pid is not None
    owner = describe_owner(pid)
    own = f"its own QMP socket {visible(path)}"
    return f"libvirt domain {visible(domain)}: {own}, QEMU pid {pid} ({owner})"


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
        # With no kernel file, the kernel read from memory may say each task's roots.
        roots = analyzer.adapter.gives_user_roots or analyzer.kernel is None
        memory = await open_memory(session, options.memory, options.mem_path, notice, roots)
        found = None
        try:
            if analyzer.kernel is None:
                found = await _kernel_from_guest(session, memory, analyzer, notice)
            if _lacks_user_roots(memory, analyzer):
                await memory.close()
                memory = await open_memory(session, options.memory, options.mem_path, notice)
        except BaseException:
            await memory.close()
            raise
        if described is not None:
            notice(f"{described}; memory backend: {describe_memory(memory)}")
        config = CaptureConfig(options.stack_bytes, options.cpus, options.unwind_paused)
        try:
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


def _lacks_user_roots(memory: MemoryBackend, analyzer: Analyzer) -> bool:
    """Direct memory of an AArch64 guest opened for a kernel from guest memory that
    turned out not to say each task's page tables: to be read through QEMU instead."""
    aarch64 = isinstance(memory, DirectMemory) and memory.aarch64_roots is not None
    return aarch64 and not analyzer.adapter.gives_user_roots


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


#: Commands a stop-mode tick sends with the VM paused, one round trip each through a
#: proxy or libvirt (stop, the registers, cont; memory read on this host adds none).
STOP_TICK_ROUND_TRIPS = 3
#: The share of time a default stop mode may hold the VM paused; above it, through
#: libvirt, sampling is nonblocking unless --stop asks for stop mode.
PAUSE_SHARE_LIMIT = 0.01
#: Round trips timed when connecting (the median is used).
_TIMED_ROUND_TRIPS = 5


async def choose_nonblocking(
    session: QmpSession,
    nonblocking: bool,
    force_stop: bool,
    period_s: float,
    notice: Callable[[str], None] = say_on_stderr,
) -> bool:
    """Whether to sample nonblocking: as asked (--nonblocking, --stop); else, where each
    command is a round trip through libvirt or a proxy (session.one_at_a_time), when
    stop mode at `period_s` would hold the VM paused more than PAUSE_SHARE_LIMIT of the
    time, by the round trip timed here; one line to `notice` says so."""
    if nonblocking or force_stop or not session.one_at_a_time:
        return nonblocking
    trip = await round_trip_s(session)
    share = STOP_TICK_ROUND_TRIPS * trip / period_s
    if share <= PAUSE_SHARE_LIMIT:
        return False
    notice(
        f"a QMP round trip through libvirt takes {trip * 1000:.1f} ms: stop mode would hold "
        f"the VM paused ~{min(share, 1.0):.0%} of the time at {1 / period_s:.0f} Hz, so "
        "sampling nonblocking (--stop pauses it all the same)"
    )
    return True


async def round_trip_s(session: QmpSession) -> float:
    """The median time of a `query-status` round trip, in seconds."""
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(_TIMED_ROUND_TRIPS):
        began = loop.time()
        await session.execute("query-status")
        times.append(loop.time() - began)
    return statistics.median(times)
