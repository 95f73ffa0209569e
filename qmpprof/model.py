"""The data that flows through qmpprof: small frozen types that import nothing internal.

A `RawSample` is what one tick captured from one vCPU; everything downstream
(unwinding, symbolization, aggregation, output) is computed from it. `RecordStats` is
what the sampling loop counted, read by the progress line, the summary and `top`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Mode(Enum):
    """What a vCPU was doing when it was sampled."""

    KERNEL = "kernel"
    USER = "user"
    IDLE = "idle"


class FrameKind(Enum):
    """How a frame's address was obtained, which decides how to symbolize it."""

    #: Members are singletons: hashed by identity in C (Enum's own hash is Python code,
    #: and every frame of every sample is hashed when it is symbolized).
    __hash__ = object.__hash__

    #: The exact address of the next instruction to run (the sampled RIP).
    INSTRUCTION = "instruction"
    #: A return address: the call that made this frame is the instruction before it.
    RETURN = "return"


class Recovery(Enum):
    """How the unwinder found a frame."""

    #: Members are singletons: hashed by identity in C (Enum's own hash is Python code,
    #: and every frame of every sample is hashed when it is symbolized).
    __hash__ = object.__hash__

    #: The leaf: straight from the vCPU's registers.
    REGISTERS = "registers"
    #: From the caller's DWARF call-frame information.
    CFI = "cfi"
    #: From the frame-pointer chain (no CFI covered the frame below it).
    FRAME_POINTER = "fp"
    #: The user code a vCPU at the kernel's system-call entry or exit came from (RCX).
    SYSTEM_CALL = "syscall"
    #: The user registers the OS saved when the task entered the kernel (Linux's
    #: pt_regs), where the kernel's own unwind could not get there.
    SAVED_USER_REGISTERS = "saved-user-registers"


class StopReason(Enum):
    """Why an unwind ended. Every unwind ends with exactly one."""

    END_OF_STACK = "end-of-stack"
    FAULT = "fault"
    NO_PROGRESS = "did-not-advance"
    NO_UNWIND_INFO = "no-unwind-info"
    BAD_CFI = "unsupported-cfi"
    BAD_FRAME = "bad-frame-pointer"
    #: A caller's pc where no code can be (the first page): the frame was misread.
    BAD_PC = "bad-pc"
    MAX_DEPTH = "max-depth"
    NO_STACK = "no-stack"


@dataclass(frozen=True)
class FrameAddress:
    """One frame of an unwound stack, as an address in the guest."""

    address: int
    kind: FrameKind
    how: Recovery = Recovery.REGISTERS

    @property
    def lookup_address(self) -> int:
        """The address to symbolize: for a return address, inside the call instruction."""
        return self.address - 1 if self.kind is FrameKind.RETURN else self.address


#: EFER's long-mode-active bit.
EFER_LMA = 1 << 10


@dataclass(frozen=True)
class RegisterSet:
    """The registers of one vCPU, as `info registers` reported them."""

    vcpu: int
    #: General registers by lower-case 64-bit name (rax ... r15, rip, rflags); in
    #: 32- and 16-bit modes the E/16-bit values are stored under the 64-bit names.
    general: Mapping[str, int]
    cs: int
    cpl: int
    halted: bool
    #: 16, 32 or 64: the width of the code the vCPU was executing.
    bits: int
    cr0: int = 0
    cr3: int = 0
    cr4: int = 0
    efer: int = 0
    #: The GS segment's base (in the kernel, Linux's per-CPU area of this CPU) and the
    #: GDT's base (0 when the dump did not give them: an older capture).
    gs_base: int = 0
    gdt_base: int = 0
    #: The task-state segment's base: its RSP0 is the stack an interrupt from ring 3
    #: is pushed on (0 when the dump did not give it).
    tr_base: int = 0
    #: The FS segment's base (in an i386 Linux kernel, this CPU's per-CPU offset; 0 when
    #: the dump did not give it: an older capture).
    fs_base: int = 0
    #: The code segment's base: real mode's code runs at CS * 16 + IP, and firmware may
    #: give a 32-bit segment a base; flat code has 0 here (long mode ignores it).
    cs_base: int = 0
    #: The instruction set (qmpprof/isa): "x86_64" for every x86 mode (`bits` says
    #: which), "aarch64". An AArch64 vCPU's `general` names x0..x30, sp, pc and pstate,
    #: and its `cpl` is its exception level.
    isa: str = "x86_64"
    #: AArch64's TPIDR_EL1 (Linux: the CPU's per-CPU offset), which the dump lacks: read
    #: once per connection (target/roots.py); 0 when not known.
    tpidr: int = 0

    @property
    def segmented(self) -> bool:
        """Code addressed through a segment base (real mode, 16-bit code, a 32-bit
        segment with a base outside long mode): its stack is not unwound."""
        based = self.cs_base != 0 and not self.efer & EFER_LMA
        return self.bits == 16 or (self.bits == 32 and based)

    @property
    def pc(self) -> int:
        """The linear address of the next instruction: RIP, plus the code segment's
        base for segmented code (real-mode firmware runs at CS * 16 + IP)."""
        if self.isa != "x86_64":
            return self.general["pc"]
        rip = self.general["rip"]
        return (self.cs_base + rip) & 0xFFFF_FFFF if self.segmented else rip

    @property
    def user_mode(self) -> bool:
        """Running user code: x86 at a CPL above 0, AArch64 at EL0 (`cpl`)."""
        return self.cpl == 0 if self.isa == "aarch64" else self.cpl != 0

    @property
    def sp(self) -> int:
        """The stack pointer in use."""
        return self.general["rsp" if self.isa == "x86_64" else "sp"]

    @property
    def rip(self) -> int:
        return self.general["rip"]

    @property
    def rsp(self) -> int:
        return self.general["rsp"]

    @property
    def rbp(self) -> int:
        return self.general["rbp"]


#: x86-64 canonical addresses at or above this are the kernel's half: the top bit is
#: set in every kernel address and clear in every user one, with 4-level paging (the kernel
#: from 0xffff800000000000) and 5-level (from 0xff00000000000000: its direct map, vmalloc
#: area and so its slab objects and stacks lie below 4-level's split).
KERNEL_HALF = 1 << 63


def is_kernel_address(address: int) -> bool:
    return address >= KERNEL_HALF


@dataclass(frozen=True)
class MemoryWindow:
    """Bytes of guest virtual memory starting at `base` (in one vCPU's address space)."""

    base: int
    data: bytes

    @property
    def end(self) -> int:
        return self.base + len(self.data)


@dataclass(frozen=True)
class Process:
    """A guest process as the OS adapter names it. pid None: no process (kernel only: a
    CPU's idle context, a kernel thread). `tid` is the thread that ran, when the OS
    tells threads apart (a Linux task's pid; its process id is the tgid)."""

    pid: int | None
    name: str
    tid: int | None = None
    #: The thread's own name where it is not the process's (a host thread: `CPU 0/TCG`).
    thread_name: str | None = None

    def label(self) -> str:
        return self.name if self.pid is None else f"{self.name} ({self.pid})"

    def thread_label(self) -> str | None:
        """The thread, for profiles grouped by thread; None where there is no process or
        the OS tells no threads apart."""
        if self.pid is None or self.tid is None or self.tid < 0:
            return None
        if self.thread_name is not None:
            return f"{self.thread_name} ({self.tid})"
        return f"thread {self.tid}"


#: What runs on a CPU that the OS adapter says has no current process.
KERNEL_ONLY = Process(None, "[kernel]")
#: A CPU's idle context when the OS has one of its own (Linux's idle task, pid 0,
#: `swapper/N`): no process, as KERNEL_ONLY, but named for what it is.
IDLE_CONTEXT = Process(None, "[idle]")


@dataclass(frozen=True)
class FileMapping:
    """One executable file mapping of a guest process, as its kernel's memory map says:
    guest addresses [start, end) hold the file's bytes from `offset` on. `path` is the
    guest's name for the file (absolute, as /proc/PID/maps prints it; guest text, never
    trusted); `build_id` is the GNU build-id the guest's copy of the ELF carries, read
    from guest memory (None: no note, or not readable)."""

    start: int
    end: int
    offset: int
    path: str
    build_id: bytes | None = None

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end


@dataclass(frozen=True)
class MappedFile:
    """Where a guest address lies in a file a process map names: the file's name, the
    offset in the file there (what pprof and perf's `file+offset` mean: the same with or
    without the file's headers at hand), and the map's entry."""

    name: str
    file_offset: int
    mapping: FileMapping


@dataclass(frozen=True)
class RawSample:
    """What one tick captured from one vCPU: its registers and every window of its memory
    read to unwind it and name its process. `error` says why a part is missing.

    `user_module` names the user ELF identified in this address space (by the hash of
    its .text read from guest memory), if any. `file_maps` are the executable file
    mappings of its process, as its kernel's memory map said (None: not read).
    """

    time: float
    registers: RegisterSet
    windows: tuple[MemoryWindow, ...] = ()
    user_module: str | None = None
    error: str | None = None
    file_maps: tuple[FileMapping, ...] | None = None

    @property
    def vcpu(self) -> int:
        return self.registers.vcpu

    @property
    def address_space(self) -> int:
        """The page-table root (CR3 without its flag bits)."""
        return self.registers.cr3 & ~0xFFF


@dataclass(frozen=True)
class UnwoundStack:
    """The frames an unwinder found, leaf first, and why it stopped."""

    frames: tuple[FrameAddress, ...]
    stop: StopReason
    fault_address: int | None = None


@dataclass(frozen=True)
class CapturedSample:
    """One vCPU at one tick as the capture step leaves it: what was read (`raw`), and what
    was computed from it while reading (its stack and process). Analysis only names the
    frames; a capture file keeps all three, so `report` need not unwind again."""

    raw: RawSample
    stack: UnwoundStack
    process: Process | None
    #: Read from a capture: the name recording gave each of the stack's frames (None:
    #: unnamed), from symbols `report` may not have (the guest's memory); else empty.
    names: tuple[FrameName | None, ...] = ()


@dataclass(frozen=True)
class FrameName:
    """What a frame was named when it was recorded: its function, the offset in it, and
    the module it is in."""

    function: str
    offset: int
    module: str | None


class NoUserSymbols(Enum):
    """Why a user-mode leaf has no name."""

    NO_BINARIES = "no user binaries given (--user-dir / --user)"
    NO_MATCH = "no given binary matches address space"
    OUTSIDE = "pc outside the symbols of"
    NO_FILE = "pc in no file the process maps (anonymous memory: JIT code)"
    NO_HOST_FILE = "no usable host copy (--sysroot, --user-dir, --user) of"


@dataclass(frozen=True)
class Unsymbolized:
    """Why a user-mode sample's leaf has no name, and what it concerns (an address
    space, a binary). Counted per distinct value in the summary."""

    why: NoUserSymbols
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.why.value} {self.detail}" if self.detail else self.why.value


@dataclass(frozen=True)
class Frame:
    """A symbolized frame. `function` is None when no symbol covers the address; then
    `offset` is its offset in `module`, the file mapped there (if any)."""

    address: FrameAddress
    function: str | None
    offset: int
    module: str | None
    #: The process map's entry for the file holding it (None outside such files).
    mapping: FileMapping | None = None
    #: Whether it is the kernel's code, as the address space it was symbolized in says
    #: (a 32-bit kernel's half is not x86-64's); None: by the address alone.
    kernel: bool | None = None

    @property
    def is_kernel(self) -> bool:
        return self.kernel if self.kernel is not None else is_kernel_address(self.address.address)

    def label(self) -> str:
        """The name used in profiles: the function; else the file and the offset in it
        (`libc.so.6+0x2f1a0`); else the raw address."""
        if self.function is None and self.module is not None:
            return f"{self.module}+{self.offset:#x}"
        if self.function is None:
            return f"{self.address.address:#x}"
        return self.function


@dataclass(frozen=True)
class Sample:
    """One vCPU at one tick, unwound and symbolized: the unit a profile counts.

    `process` is None when no OS adapter could tell; `unsymbolized` says why a user
    leaf has no name (None when it has one, or the sample is not in user mode).
    """

    time: float
    vcpu: int
    mode: Mode
    frames: tuple[Frame, ...]
    stop: StopReason
    address_space: int = 0
    process: Process | None = None
    fault_address: int | None = None
    unsymbolized: Unsymbolized | None = None
    #: A return address on this stack does not follow a call: torn or garbage.
    torn: bool = False
    #: 16, 32 or 64: the width of the code the vCPU ran (RegisterSet.bits).
    bits: int = 64

    def label(self) -> str:
        """The root frame of this sample's stack: its process, else its address space."""
        if self.process is not None:
            return self.process.label()
        return f"cr3:{self.address_space:#x}"

    def program(self) -> str:
        """Its process's name (comm) without the pid: every process of one program alike
        (perf's `--sort comm`); where no process is known, `label`."""
        return self.process.name if self.process is not None else self.label()


@dataclass(frozen=True)
class KernelModule:
    """A module loaded into a guest's kernel, as its module list says: its name and
    where its code is, [base, base + size)."""

    name: str
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclass(frozen=True)
class Recording:
    """What a profile was recorded from and how: titles, periods and file headers."""

    started: float
    duration_s: float
    period_s: float
    qmp_socket: str = ""
    kernel: str | None = None
    command_line: str = ""
    #: How far from its link address the kernel ran (a KASLR slide): `report` uses it.
    kernel_bias: int = 0
    #: The guest kernel's loaded modules when recording started: `report` maps them.
    kernel_modules: tuple[KernelModule, ...] = ()
    #: The release of a kernel read from the guest's memory (no `kernel` file).
    kernel_release: str | None = None

    def kernel_title(self) -> str:
        """The kernel, as a profile's title names it: its file, else its release."""
        if self.kernel:
            return self.kernel.rsplit("/", 1)[-1]
        if self.kernel_release:
            return f"{self.kernel_release} (from guest memory)"
        return "no kernel symbols"


class EndReason(Enum):
    """Why a recording ended before its duration (a stop asked for by its caller, or
    a duration run out, leaves `RecordStats.ended_by` None)."""

    QEMU_EXITED = "qemu-exited"
    #: qmpprof paused the VM and could not resume it.
    RESUME_FAILED = "resume-failed"
    #: The monitor stopped answering; the VM was resumed on a new connection.
    MONITOR_STUCK = "monitor-stuck"
    #: Ticks in a row outlived their time budget.
    TICKS_OVERRAN = "ticks-overran"
    #: Ticks in a row failed.
    TICKS_FAILED = "ticks-failed"
    #: A signal (Ctrl-C, SIGTERM, a hang-up) stopped it.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Ending:
    """A recording's EndReason with what the reason alone does not say; str() is the
    line the user reads."""

    reason: EndReason
    #: The error's message, or the signal's name.
    detail: str = ""
    #: How many ticks in a row, for TICKS_OVERRAN and TICKS_FAILED.
    count: int = 0

    def __str__(self) -> str:
        if self.reason is EndReason.QEMU_EXITED:
            return "QEMU exited"
        if self.reason is EndReason.TICKS_OVERRAN:
            return f"{self.count} ticks in a row outlived their budget"
        if self.reason is EndReason.TICKS_FAILED:
            return f"{self.count} failed samples in a row ({self.detail})"
        if self.reason is EndReason.INTERRUPTED:
            return f"interrupted ({self.detail})"
        return self.detail  # the error's own message says what happened


@dataclass
class RecordStats:
    """What happened during a recording, for the progress line and the summary."""

    requested: int = 0
    ticks: int = 0
    samples: int = 0
    late: int = 0
    missed: int = 0
    failed: int = 0
    skipped_paused: int = 0
    #: Ticks abandoned, the VM resumed, because they outlived their time budget.
    abandoned: int = 0
    #: Nonblocking: vCPU samples that tore while read (a return address after no call, or
    #: a task switched under it: record/sampler.py) and were taken again (each counted
    #: once, however many retakes it took).
    retaken: int = 0
    #: Nonblocking: the register reads those retakes cost (`info registers -a` each).
    retakes: int = 0
    #: Nonblocking: samples published torn all the same, still torn after every retake.
    still_torn: int = 0
    paused_s: float = 0.0
    elapsed_s: float = 0.0
    ended_by: Ending | None = None
    last_error: str | None = None

    @property
    def rate_hz(self) -> float:
        return self.ticks / self.elapsed_s if self.elapsed_s > 0 else 0.0
