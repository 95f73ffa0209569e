"""Capture one tick: every vCPU's registers, the guest memory needed to unwind it, and the
unwind itself.

Memory is read on demand: a first window around RSP, then one more window wherever the
examination (Analyzer.examine) reads an address no window holds (a user stack after a
syscall frame, the OS adapter's process struct); a few at most. Where the guest's RAM is
read on this host (target/direct.py) a read costs no round trip, so the examination
fetches each window the moment it misses it (memory.FetchingMemory) and runs once.
Through QEMU's monitor every read is a command: the examination runs, the windows it
missed are read, and it runs again, a few rounds at most, starting with the addresses
the vCPU's recent samples needed. The last examination is the result: the stack and
process travel on with the sample.
"""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace

from qmpprof.analysis import Analyzer
from qmpprof.defaults import DEFAULT_STACK_BYTES, PAGE_SIZE
from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.adapter import LinuxAdapter
from qmpprof.isa import aarch64
from qmpprof.memory import FetchingMemory, WindowFetch, WindowMemory
from qmpprof.model import (
    KERNEL_HALF,
    CapturedSample,
    FileMapping,
    MemoryWindow,
    RawSample,
    RegisterSet,
)
from qmpprof.record.identify import AddressSpaceIdentifier
from qmpprof.record.kernel_modules import KernelModules
from qmpprof.record.process_maps import ProcessMaps
from qmpprof.target.direct import DirectMemory
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import MAX_KEPT_BLOCKS, ParsedRegisters
from qmpprof.unwind.rules import RIP, RSP

#: Also read this much below RSP: CFI may restore a register from a slot the leaf
#: has already popped (GCC keeps the save rule until the `ret`), and GDB reads it.
BELOW_RSP = 128
#: Windows read beyond the stack's: a Linux task takes three (the per-CPU offsets, the
#: CPU's area, the task), an interrupt on the IRQ stack one for the task's stack, the
#: unwind into user space one or two for the user stack, an unreadable end one.
MAX_EXTRA_WINDOWS = 8
#: Windows fetched per sample where each read is direct (no round trip): smaller ones,
#: a page at most, so more of them.
MAX_LIVE_FETCHES = 16
#: Addresses remembered per vCPU and read ahead of its next sample.
MAX_PREFETCHED = 6
#: The frame an interrupt or exception from ring 3 pushes: RIP, CS, RFLAGS, RSP, SS.
_INTERRUPT_FRAME = struct.Struct("<5Q")
#: Where the 64-bit task-state segment keeps RSP0 (after a reserved 32-bit field).
_TSS_RSP0 = 4
#: The HMP command that gives every vCPU's registers.
REGISTERS = "info registers -a"


def registers_of(vcpu: int) -> str:
    """The HMP command that gives one vCPU's registers (its `CPU#n` block alone)."""
    return f"info registers {vcpu}"


@dataclass(frozen=True)
class CaptureConfig:
    """What to capture each tick."""

    stack_bytes: int = DEFAULT_STACK_BYTES
    #: vCPU indexes to sample; empty means all.
    cpus: Collection[int] = ()
    #: Unwind with the VM paused even where guest RAM is read on this host (`take`).
    unwind_paused: bool = False


#: What `Capturer.take` holds for `finish`: samples done, or copies still to examine.
Taken = Sequence[CapturedSample | RawSample]


class Capturer:
    """Takes the raw samples of one tick (the caller decides whether the VM is paused)."""

    def __init__(
        self,
        session: QmpSession,
        memory: MemoryBackend,
        analyzer: Analyzer,
        config: CaptureConfig,
        modules: KernelModules | None = None,
        maps: ProcessMaps | None = None,
    ) -> None:
        """`modules`: a Linux guest's module list, read again when a sample needs it;
        `maps`: its processes' file mappings (then no user binary is identified by
        hashing its code: the maps name every file)."""
        self._modules = modules
        self.maps = maps
        #: Per address space (CR3), the file mappings its last sample ran with.
        self._last_maps: dict[int, tuple[FileMapping, ...]] = {}
        self._session = session
        self._memory = memory
        self._analyzer = analyzer
        self._config = config
        self._identifier = AddressSpaceIdentifier(memory, {} if maps else analyzer.users)
        if isinstance(analyzer.adapter, LinuxAdapter):
            analyzer.adapter.new_connection()  # a capturer a connection: maybe a new boot
        #: Per vCPU, the addresses its recent samples had to fetch (see _complete).
        self._needed: dict[int, list[int]] = {}
        #: Per halted vCPU, its last sample and the analyzer's generation then (_unchanged).
        self._halted: dict[int, tuple[int, CapturedSample]] = {}
        #: How many samples were a halted vCPU's last one again (_unchanged).
        self.unchanged_halted = 0
        self._parsed = ParsedRegisters()

    @property
    def analyzer(self) -> Analyzer:
        """What examines the samples (the nonblocking sampler asks it whether one tore)."""
        return self._analyzer

    async def capture(
        self, first: str | None = None, then: str | None = None
    ) -> list[CapturedSample]:
        """The selected vCPUs as they are now, unwound.

        `first`: a QMP command to run just before (`stop`), in the same round trip as the
        register request. `then`: the QMP command the caller sends next (`cont` for a
        paused VM); where memory is read without QEMU, QEMU reads that command while we
        do (QmpSession.prime), and the VM is paused for less.

        Raises TargetGone, CommandFailed or RegisterParseError; a vCPU whose stack
        cannot be read yields a sample whose RawSample has `error` set instead.
        """
        now = time.time()
        registers = await self._registers(first, then)
        samples = [self._unchanged(regs, now) or await self._one(regs, now) for regs in registers]
        return await self.finish(samples)

    async def take(
        self, first: str | None = None, then: str | None = None, only: Collection[int] = ()
    ) -> Taken:
        """The part of `capture` that needs the VM paused, for a caller that resumes it
        before `finish` does the rest; `only`: these vCPUs of those selected (a
        nonblocking retake of the torn ones, read anew), else all of them (a halted
        vCPU unchanged since its last sample is that sample again: `_unchanged`).

        Where guest RAM is read on this host (unless `unwind_paused`), that is a copy of
        the memory the unwind will read, as perf copies a stack: the stack from RSP up
        (`stack_bytes`), what the OS adapter reads to name the task, the task's kernel
        stack and the user stack its saved user registers point to. `finish` unwinds
        the copy; an unwind that goes past it (a stack deeper than `stack_bytes`) ends
        there. Otherwise the whole capture is done now."""
        copying = isinstance(self._memory, DirectMemory) and not self._config.unwind_paused
        each = self._copied if copying else self._one
        now = time.time()
        registers = await self._registers(first, then, only)
        if only:  # a retake: what tore is read anew
            return [await each(regs, now) for regs in registers if regs.vcpu in only]
        return [self._unchanged(regs, now) or await each(regs, now) for regs in registers]

    async def finish(self, taken: Taken) -> list[CapturedSample]:
        """The samples of a tick `take` began: copies examined (the VM may run again)."""
        samples = [
            item
            if isinstance(item, CapturedSample)
            else await self._examined(item, self._examined_windows, paused=False)
            for item in taken
        ]
        if self._modules is not None:
            await self._modules.check(samples)
        for sample in samples:
            self._remember_halted(sample)
        return samples

    def _unchanged(self, regs: RegisterSet, now: float) -> CapturedSample | None:
        """The vCPU's last sample again, taken at `now`, if it was halted then and is
        halted now with every register the same: it has not run since, or it ran and
        came back to the very same halt, with the same stack and task. The idle vCPUs
        of a lightly loaded VM, most of its samples, are then not read and unwound
        again each tick (a vCPU not halted always is: its memory moves under it)."""
        if not regs.halted:
            return None
        last = self._halted.get(regs.vcpu)
        if last is None or last[0] != self._analyzer.generation:
            return None
        sample = last[1]
        if sample.raw.registers != regs:
            return None
        self.unchanged_halted += 1
        return replace(sample, raw=replace(sample.raw, time=now))

    def _remember_halted(self, sample: CapturedSample) -> None:
        vcpu = sample.raw.vcpu
        if not sample.raw.registers.halted:
            self._halted.pop(vcpu, None)
            return
        if len(self._halted) >= MAX_KEPT_BLOCKS:  # vCPU numbers come from QEMU's text
            self._halted.clear()
        self._halted[vcpu] = (self._analyzer.generation, sample)

    async def _registers(
        self, first: str | None, then: str | None, only: Collection[int] = ()
    ) -> list[RegisterSet]:
        """The selected vCPUs' registers, `first` run just before; memory reads set up.
        `only` one vCPU (a retake's): its registers alone, half the text for QEMU to
        write and for us to parse."""
        command = registers_of(next(iter(only))) if len(only) == 1 else REGISTERS
        registers = self._parsed.parse(await self._session.hmp(command, first=first))
        if then is not None and not self._memory.through_monitor:
            self._session.prime(then)
        self._memory.set_registers(registers)
        registers = self._with_user_roots(registers)
        cpus = self._config.cpus
        return [await self._halt_read(regs) for regs in registers if not cpus or regs.vcpu in cpus]

    def _with_user_roots(self, registers: list[RegisterSet]) -> list[RegisterSet]:
        """AArch64 vCPUs read directly get their TPIDR_EL1 (read once: target/roots.py)
        and their user half's page-table root (TTBR0_EL1, as `cr3`) from the OS adapter,
        which reads it in the kernel's half; the others are as they were. A vCPU whose
        root is not found has no lower half to read."""
        memory = self._memory
        if not isinstance(memory, DirectMemory) or all(r.isa != "aarch64" for r in registers):
            return registers
        adapter, tpidr = self._analyzer.adapter, memory.aarch64_tpidr
        rooted = []
        for regs in registers:
            root = None
            if regs.isa == "aarch64":
                if 0 <= regs.vcpu < len(tpidr):
                    regs = replace(regs, tpidr=tpidr[regs.vcpu])
                with contextlib.suppress(MemoryFault):
                    root = adapter.user_root(regs, memory.reader(regs.vcpu))
            rooted.append(replace(regs, cr3=root) if root else regs)
        memory.set_registers(rooted)
        return rooted

    async def _halt_read(self, regs: RegisterSet) -> RegisterSet:
        """`regs`, halted where an AArch64 vCPU waits for an interrupt (aarch64.waits_after:
        the instruction before its pc, from the kernel's file where it has one, else
        from guest memory); x86's dump says so itself."""
        if regs.isa != "aarch64" or regs.halted:
            return regs
        before = self._analyzer.kernel_code(regs.pc - 4, 4)
        if before is None:
            before = await self._memory.read_window(regs.vcpu, regs.pc - 4, 4)
        return replace(regs, halted=True) if aarch64.waits_after(before) else regs

    def prime(self) -> None:
        """Have QEMU read the next capture's register request already (QmpSession.prime):
        it then starts with the request's last bytes. Harmless: the request reads."""
        self._session.hmp_prime(REGISTERS)

    async def _one(self, regs: RegisterSet, now: float) -> CapturedSample:
        if regs.segmented:
            error = f"vCPU in {regs.bits}-bit segmented code: stack not read"
            return self._analyzer.examine(RawSample(now, regs, error=error)).sample
        user_module = await self._identifier.identify(regs)
        window = await self._stack_window(regs)
        if window is None:
            # The task may still be read: Linux's entry code borrows RSP as a scratch
            # register while it switches page tables (PTI).
            error = f"stack unreadable at sp={regs.sp:#x}"
            raw = RawSample(now, regs, user_module=user_module, error=error)
        else:
            raw = RawSample(now, regs, (window,), user_module, file_maps=self._maps_guess(regs))
        return await self._examined(raw, self._complete)

    async def _examined(
        self,
        raw: RawSample,
        complete: Callable[[RawSample], Awaitable[CapturedSample]],
        paused: bool = True,
    ) -> CapturedSample:
        """`raw` examined by `complete`, with its process's file mappings
        (_with_process_maps; `paused`: the VM has not run since `raw` was taken). A
        sample whose stack could not be read has them too: its pc names its one frame
        (a user stack's next page not touched yet, as a new process's ld.so's often is)."""
        return await self._with_process_maps(await complete(raw), complete, paused)

    def _maps_guess(self, regs: RegisterSet) -> tuple[FileMapping, ...] | None:
        """The file mappings this address space's last sample ran with."""
        return self._last_maps.get(regs.cr3 & ~0xFFF) if self.maps else None

    async def _copied(self, regs: RegisterSet, now: float) -> CapturedSample | RawSample:
        """`take`'s copy of one vCPU's memory (see there), read while the VM is paused."""
        if regs.segmented:
            return await self._one(regs, now)
        assert isinstance(self._memory, DirectMemory)
        user_module = await self._identifier.identify(regs)
        window = await self._stack_window(regs)
        fetch = window_fetch(self._memory.reader(regs.vcpu).read_prefix)
        copy = FetchingMemory([window] if window else [], fetch, MAX_LIVE_FETCHES)
        copied = self._copy_task_memory(regs, window, copy)
        await self._walk_new_maps(regs, copy)
        # An AArch64 vCPU's caller may be in LR and x29 with nothing on its stack (a
        # leaf at an empty stack's top: call_on_irq_stack's callee on the IRQ stack).
        unwinds = window is not None or regs.isa == "aarch64"
        error = None if unwinds else f"stack unreadable at sp={regs.sp:#x}"
        raw = RawSample(now, regs, tuple(copy.windows), user_module, error, self._maps_guess(regs))
        # Stacks the OS adapter cannot name: unwind now, from what was read so far.
        return raw if copied else await self._examined(raw, self._complete)

    def _copy_task_memory(
        self, regs: RegisterSet, window: MemoryWindow | None, copy: FetchingMemory
    ) -> bool:
        """Read into `copy` what the examination of `regs` will read beyond RSP's stack
        (`window`); False for a kernel sample whose stacks the OS adapter does not
        describe (where a kernel keeps the user's RSP is its own business)."""
        adapter = self._analyzer.adapter
        with contextlib.suppress(MemoryFault):
            adapter.process(regs, copy)
        if regs.user_mode:
            return True  # a user stack: RSP's window is all of it
        try:
            stack = adapter.kernel_stack(regs, copy)
        except MemoryFault:
            return False
        if stack is None:
            return False
        user_rsps = set()
        # x86-64's task-state segment and frame layouts below
        long_mode = regs.isa == "x86_64" and regs.bits == 64
        if not stack[0] <= regs.sp < stack[0] + stack[1]:
            with contextlib.suppress(MemoryFault):
                copy.read(*stack)  # an interrupt stack's unwind goes on there
            with contextlib.suppress(MemoryFault):
                if long_mode:  # maybe still on the entry stack
                    user_rsps.add(_user_rsp_at_rsp0(regs, copy))
        if long_mode and window is not None and len(window.data) < self._config.stack_bytes:
            user_rsps.add(_user_rsp_at_top(window))  # RSP's stack ended: its top came first
        with contextlib.suppress(MemoryFault):
            user = adapter.user_registers(regs, copy)
            user_rsps.add(user[RSP] if user is not None else None)
        for user_rsp in user_rsps:
            if user_rsp is not None and user_rsp < KERNEL_HALF:
                with contextlib.suppress(MemoryFault):
                    copy.read(user_rsp, self._config.stack_bytes)
        return True

    async def _walk_new_maps(self, regs: RegisterSet, memory: FetchingMemory) -> None:
        """While the VM is paused, walk the maps of a process whose user pc (the vCPU's,
        or its saved pt_regs') none of its known maps hold: a process just forked or
        exec'd, or mapping its libraries, may have exec'd or exited by the time the VM
        runs again. Other walks (a caller's frame in a library mapped since, a new
        address space's eager ones) wait for the unwinding, after the VM resumed."""
        maps, adapter = self.maps, self._analyzer.adapter
        if maps is None or not isinstance(adapter, LinuxAdapter):
            return
        with contextlib.suppress(MemoryFault):
            process = adapter.process(regs, memory)
            task = adapter.task_address(regs, memory)
            if process is None or process.pid is None or task is None:
                return
            user = None if regs.user_mode else adapter.user_registers(regs, memory)
            pc = regs.pc if regs.user_mode else user[RIP] if user is not None else None
            if pc is not None and maps.would_walk(regs, (pc,), process.pid):
                await maps.maps_for(regs, task, (pc,), process.pid, eager=False)

    async def _examined_windows(self, raw: RawSample) -> CapturedSample:
        return self._analyzer.examine(raw).sample

    async def _with_process_maps(
        self,
        sample: CapturedSample,
        complete: Callable[[RawSample], Awaitable[CapturedSample]],
        paused: bool,
    ) -> CapturedSample:
        """`sample` with its process's file mappings: examined with those its address
        space had last (the same, nearly always), again (`complete`) if the maps read now
        differ or files with no host copy were just read from the guest. Not `paused`:
        the VM ran since (ProcessMaps.maps_for's `later`)."""
        raw, process = sample.raw, sample.process
        if self.maps is None or process is None or process.pid is None:
            return sample  # no Linux maps, or a kernel thread or idle task: no user part
        try:
            task = self._adapter_task(raw)
        except MemoryFault:
            return sample
        if task is None:
            return sample
        user_pcs = [f.address for f in sample.stack.frames if f.address < KERNEL_HALF]
        pid = process.pid
        found = await self.maps.maps_for(raw.registers, task, user_pcs, pid, later=not paused)
        if found is None:
            return sample
        if await self.maps.read_guest_copies(raw.registers, found, self._analyzer.files):
            self._analyzer.forget_address_spaces()  # built before the guest copies came
        elif found == raw.file_maps:
            return sample
        if found:  # () is a task mid context switch: no guess for the next sample
            self._last_maps[raw.address_space] = found
        return await complete(replace(raw, file_maps=found))

    def _adapter_task(self, raw: RawSample) -> int | None:
        adapter = self._analyzer.adapter
        if not isinstance(adapter, LinuxAdapter):
            return None
        return adapter.task_address(raw.registers, WindowMemory(raw.windows))

    async def _stack_window(self, regs: RegisterSet) -> MemoryWindow | None:
        """The stack from just below RSP up; None when nothing there can be read. An
        x86-64 stack that ends at RSP (nothing pushed yet: Linux's system-call entry
        right after it loads the task's stack top) is the bytes below it: the stack is
        empty, not unreadable, and its caller may be elsewhere (the user registers)."""
        base = regs.sp - BELOW_RSP
        size = self._config.stack_bytes + BELOW_RSP
        data = await self._memory.read_window(regs.vcpu, base, size)
        if len(data) <= BELOW_RSP:  # the page below RSP may be unmapped: start at RSP
            above = await self._memory.read_window(regs.vcpu, regs.sp, self._config.stack_bytes)
            if above or len(data) < BELOW_RSP or regs.isa != "x86_64":
                base, data = regs.sp, above
        return MemoryWindow(base, data) if data else None

    async def _complete(self, raw: RawSample) -> CapturedSample:
        """Examine `raw`, fetching the windows it still misses (a bounded number). An
        address that cannot be read is not asked for again, and does not keep the others
        (the unwind's end past a stack's top, the process) from being read."""
        if isinstance(self._memory, DirectMemory):
            return self._examined_live(raw, self._memory)
        return await self._examined_in_rounds(raw)

    def _examined_live(self, raw: RawSample, memory: DirectMemory) -> CapturedSample:
        """One examination that reads each window it misses as it goes."""
        fetch = window_fetch(memory.reader(raw.vcpu).read_prefix)
        fetching = FetchingMemory(raw.windows, fetch, MAX_LIVE_FETCHES)
        sample = self._analyzer.examine(raw, fetching).sample
        return replace(sample, raw=replace(raw, windows=tuple(fetching.windows)))

    async def _examined_in_rounds(self, raw: RawSample) -> CapturedSample:
        """Examinations in rounds, each after reading the windows the last one missed.

        The addresses this vCPU's last sample needed are read first: most are the same
        from tick to tick (a Linux CPU's per-CPU area, its task), and each one found
        missing costs an examination more while the VM is paused."""
        raw = await self._prefetched(raw)
        examined = self._analyzer.examine(raw)
        unreadable: set[int] = set()
        fetched: list[int] = []
        while len(fetched) + len(unreadable) < MAX_EXTRA_WINDOWS:
            wanted = [address for address in examined.missing if address not in unreadable]
            if not wanted:
                break
            window = await self._window_at(raw.vcpu, wanted[0])
            if window is None:
                unreadable.add(wanted[0])
                continue
            fetched.append(wanted[0])
            raw = replace(raw, windows=(*raw.windows, window))
            examined = self._analyzer.examine(raw)
        self._remember(raw.vcpu, fetched)
        return examined.sample

    async def _prefetched(self, raw: RawSample) -> RawSample:
        windows = list(raw.windows)
        for address in self._needed.get(raw.vcpu, ()):
            if not any(w.base <= address < w.end for w in windows):
                window = await self._window_at(raw.vcpu, address)
                if window is not None:
                    windows.append(window)
        return replace(raw, windows=tuple(windows))

    def _remember(self, vcpu: int, fetched: list[int]) -> None:
        """Keep the addresses fetched now, then those remembered before, up to the cap."""
        before = [a for a in self._needed.get(vcpu, ()) if a not in fetched]
        self._needed[vcpu] = (fetched + before)[:MAX_PREFETCHED]

    async def _window_at(self, vcpu: int, address: int) -> MemoryWindow | None:
        """A window holding `address`: from a little below it to the end of the next page."""
        size = 2 * PAGE_SIZE - address % PAGE_SIZE
        for base in (max(address - BELOW_RSP, 0), address):
            data = await self._memory.read_window(vcpu, base, size + address - base)
            if base + len(data) > address:
                return MemoryWindow(base, data)
        return None


def _user_rsp_at_top(window: MemoryWindow) -> int | None:
    """The user RSP an entry from ring 3 left at the top of the kernel stack `window`
    ends at: the CPU pushes SS, RSP, RFLAGS, CS and RIP there (the end of Linux's
    pt_regs). The OS's own record of the stack top may already name the next task's
    stack while a context switch is under way; the stack RSP is on says what it holds."""
    if window.end % PAGE_SIZE or len(window.data) < _INTERRUPT_FRAME.size:
        return None
    return _user_rsp_of_frame(window.data[-_INTERRUPT_FRAME.size :])


def _user_rsp_at_rsp0(regs: RegisterSet, memory: FetchingMemory) -> int | None:
    """The user RSP of the frame an interrupt from ring 3 pushed where the CPU found its
    stack: the task-state segment's RSP0, aligned to 16 bytes. Linux points RSP0 at a
    small per-CPU entry stack, saves the frame on the task's stack from there, and only
    then does the task's record of user registers hold this entry's and not the last
    one's. Raises MemoryFault."""
    if not regs.tr_base:
        return None
    rsp0 = memory.read_u64(regs.tr_base + _TSS_RSP0) & ~0xF
    return _user_rsp_of_frame(memory.read(rsp0 - _INTERRUPT_FRAME.size, _INTERRUPT_FRAME.size))


def _user_rsp_of_frame(frame: bytes) -> int | None:
    """The RSP of a hardware interrupt frame (RIP, CS, RFLAGS, RSP, SS) taken in ring 3."""
    rip, cs, _, rsp, _ = _INTERRUPT_FRAME.unpack(frame)
    return rsp if cs & 3 == 3 and rip < KERNEL_HALF else None


def window_fetch(read_prefix: Callable[[int, int], bytes]) -> WindowFetch:
    """Windows read with `read_prefix` (the readable bytes from an address, at most a
    size): for a read of [address, address + size), from a little below it to the end
    of the page of its last byte, or from the address when the page below is unreadable.
    Reads cost no round trip here, so windows are small and more of them are fetched."""

    def fetch(address: int, size: int) -> MemoryWindow | None:
        end = ((address + max(size, 1) - 1) // PAGE_SIZE + 1) * PAGE_SIZE
        for base in (max(address - BELOW_RSP, 0), address):
            data = read_prefix(base, end - base)
            if base + len(data) > address:
                return MemoryWindow(base, data)
        return None

    return fetch
