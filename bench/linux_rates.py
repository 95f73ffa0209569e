"""How fast qmpprof samples the Linux example guest unthrottled, against its floor and drgn.

Boots examples/linux once (Debian's kernel, 2 vCPUs, TCG, KASLR on; --abi picks the
kernel, `examples/linux/fetch.sh --list`; --smp the vCPUs) with its RAM in a shared file
(boot.sh --memory-backend), and runs each method below as fast as it goes for --seconds, the
methods taking turns in --rounds rounds (this machine's load changes by the second:
compare only figures of one run). qmpprof connects as `qmpprof record` does with no
kernel file (`--memory direct --mem-path RAM`): the kernel read from guest memory.
  floor_hz      a bare-socket loop of stop, info registers -a, cont (bench.common.floor_tick):
                no memory, no unwind; ticks per second
  stop_hz       qmpprof's stop-mode tick back to back: paused_capture (stop with the
                register request, the copies, cont, the unwind of the copies while QEMU
                answers it) and analyzer.symbolize of every sample; ticks per second. As
                sample_loop does when no time is left before a tick, nothing is primed
  *_pause_ms    the VM's pause per tick by QEMU's own clock (its STOP and RESUME
                events' timestamps), median over every tick of every round
  floor_nonblocking_vcpu_samples_per_s  a bare-socket loop of info registers -a on the
                running VM: vCPU samples (a tick gives one per vCPU) per second
  nonblocking_vcpu_samples_per_s  qmpprof --nonblocking back to back: running_capture
                and analyzer.symbolize of every sample; vCPU samples per second
  drgn_hz       the same loop as the floor, with drgn (`pip install drgn`, the optional
                `bench` dependencies) unwinding every vCPU while the VM is paused: stop,
                info registers -a (parsed by qmpprof's parser), for each vCPU a
                `struct pt_regs` of its registers given to Program.stack_trace (drgn's
                ORC unwinder for the kernel) and every frame's name, cont. drgn reads
                guest physical memory from the RAM file (Program.add_memory_segment
                over an mmap, physical=True), walks the kernel's page tables itself
                (Program.set_linux_kernel_custom with the guest's VMCOREINFO, which
                qmpprof's vmcoreinfo.find locates in guest RAM) and takes its types,
                symbols and ORC from the debug vmlinux (its KASLR slide from
                VMCOREINFO). drgn unwinds only the kernel: a vCPU in user mode gives one
                frame. The column is skipped, with one line saying so, without drgn
  *_cpu_ms      this process's CPU time per tick (process_time over the timed loop):
                on a loaded host the rates follow QEMU's scheduling, this only our work
  drgn_kernel_share  the share of drgn's vCPU samples whose RIP was in the kernel
  same_frames, same_names  on ticks with the VM paused through qmpprof's session
                (until --check samples whose RIP is in the kernel were seen), each vCPU
                captured and symbolized by qmpprof and unwound by drgn from the same
                registers and memory: of those kernel samples (`compared`), how many
                have the same kernel frames in both (their addresses: return addresses,
                and RIP), and how many of those also the same names (qmpprof: kallsyms
                read from guest memory; drgn: the ELF symbol that holds each non-inline
                frame, which may be another name for the same address, as
                entry_SYSCALL_64 for entry_SYSCALL_64_after_hwframe); the first
                difference of each kind is printed
The ratios: stop_hz / floor_hz (issue 27's target >= 0.95), stop_hz / drgn_hz (>= 1.5),
qmpprof's pause / drgn's (<= 1), nonblocking vCPU samples per second (>= 1000); with
each round's stop/floor and stop/drgn ratio, least to greatest. Set-up is left out of
every rate: qmpprof connects afresh each round (as `record` does; WARM_TICKS untimed
ticks follow), drgn loads its debug info once, then runs one untimed second of its
loop (its first unwinds parse the vmlinux's ORC). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import mmap
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REGISTERS, floor_tick, median
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.model import CapturedSample, RecordStats, RegisterSet, is_kernel_address
from qmpprof.record.sampler import paused_capture, running_capture
from qmpprof.target.direct import open_direct
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.guest_vm import BareQmp, scratch_ram_file
from tests.linux_vm import running_linux

if TYPE_CHECKING:
    import drgn

#: Whether drgn is installed (the optional `bench` dependencies).
HAVE_DRGN = importlib.util.find_spec("drgn") is not None
#: Issue 27's targets.
TARGETS = {"stop_over_floor": 0.95, "stop_over_drgn": 1.5, "pause_over_drgn": 1.0}
NONBLOCKING_TARGET = 1000
#: `struct pt_regs`'s members and the registers `info registers` names them by.
PT_REGS = (
    ("r15", "r15"), ("r14", "r14"), ("r13", "r13"), ("r12", "r12"), ("bp", "rbp"),
    ("bx", "rbx"), ("r11", "r11"), ("r10", "r10"), ("r9", "r9"), ("r8", "r8"),
    ("ax", "rax"), ("cx", "rcx"), ("dx", "rdx"), ("si", "rsi"), ("di", "rdi"),
    ("ip", "rip"), ("flags", "rflags"), ("sp", "rsp"),
)  # fmt: skip
#: A kernel frame: its address and its function's name (None: no symbol holds it).
KernelFrame = tuple[int, str | None]
#: Untimed drgn ticks before the rounds: its first unwinds parse the vmlinux's ORC.
DRGN_WARM_S = 1.0
#: Untimed qmpprof ticks after connecting: its first samples fill its caches.
WARM_TICKS = 20
#: Ticks tried at most for --check kernel samples, and the VM's run between two.
CHECK_TICKS = 300
CHECK_GAP_S = 0.01


class Run(NamedTuple):
    """One method over one round: ticks, vCPU samples, seconds, pauses (s) by QEMU's
    clock, how many samples had their RIP in the kernel, this process's CPU seconds."""

    ticks: int
    samples: int
    seconds: float
    pauses: list[float]
    kernel: int = 0
    cpu: float = 0.0


def event_pauses(events: Iterable[tuple[str, float]]) -> list[float]:
    """Each STOP-to-RESUME span of QEMU's run-state events, in order."""
    pauses, stopped = [], None
    for name, stamp in events:
        if name == "STOP":
            stopped = stamp
        elif name == "RESUME" and stopped is not None:
            pauses.append(stamp - stopped)
            stopped = None
    return pauses


def vcpu_count(socket: str) -> int:
    qmp = BareQmp(socket)
    try:
        cpus = qmp.call("query-cpus-fast")
        return len(cpus) if isinstance(cpus, list) else 1
    finally:
        qmp.close()


def bare_run(socket: str, seconds: float, tick: Callable[[BareQmp], int]) -> Run:
    """`tick` over a bare socket, back to back for `seconds`; it returns how many of its
    vCPU samples were in the kernel (0 where it does not look)."""
    qmp = BareQmp(socket)
    try:
        ticks = kernel = 0
        cpu = time.process_time()
        started = time.perf_counter()
        end = started + seconds
        while time.perf_counter() < end:
            kernel += tick(qmp)
            ticks += 1
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        return Run(ticks, 0, elapsed, event_pauses(qmp.run_events), kernel, cpu)
    finally:
        qmp.close()


def floor_run(socket: str, seconds: float, mode: str, vcpus: int) -> Run:
    """The floor of `mode` (bench.common.floor_tick): no memory, no unwind."""

    def tick(qmp: BareQmp) -> int:
        floor_tick(qmp, mode)
        return 0

    run = bare_run(socket, seconds, tick)
    return run._replace(samples=run.ticks * vcpus)


async def qmpprof_run(options: TargetOptions, seconds: float, mode: str) -> Run:
    """qmpprof's ticks of `mode` (stop or nonblocking) back to back for `seconds`, over a
    connection opened as `qmpprof record` opens it (its analyzer new, as record's),
    after WARM_TICKS untimed ones."""
    analyzer = build_analyzer(options)
    async with connected(options, analyzer) as (session, _, capturer):

        async def tick(stats: RecordStats) -> list[CapturedSample] | None:
            if mode == "stop":
                captured = await paused_capture(session, capturer, stats)
            else:
                captured = await running_capture(session, capturer, stats)
            for one in captured or []:
                analyzer.symbolize(one)
            return captured

        for _ in range(WARM_TICKS):
            await tick(RecordStats())
        ticks = samples = kernel = 0
        pauses: list[float] = []
        cpu = time.process_time()
        started = time.perf_counter()
        end = started + seconds
        while time.perf_counter() < end:
            stats = RecordStats()
            captured = await tick(stats)
            if captured is None:
                continue
            ticks += 1
            samples += len(captured)
            kernel += sum(is_kernel_address(one.raw.registers.rip) for one in captured)
            if stats.paused_s:
                pauses.append(stats.paused_s)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        return Run(ticks, samples, elapsed, pauses, kernel, cpu)


class DrgnKernel:
    """drgn over the guest's kernel: physical memory from the RAM file, page tables
    walked by drgn from VMCOREINFO's swapper_pg_dir, debug info from the vmlinux."""

    def __init__(
        self, ram: str, segments: list[tuple[int, int, int]], info: bytes, vmlinux: Path
    ) -> None:
        """`segments`: guest physical [start, end) at a file offset of `ram`; `info`:
        the guest's VMCOREINFO text."""
        import drgn

        self._drgn = drgn
        self._file = open(ram, "rb")  # noqa: SIM115 (closed by close())
        self._map = mmap.mmap(self._file.fileno(), 0, prot=mmap.PROT_READ)
        self.prog = drgn.Program(drgn.Platform(drgn.Architecture.X86_64), vmcoreinfo=info)
        for start, end, offset in segments:
            self.prog.add_memory_segment(start, end - start, self._reader(offset), physical=True)
        self.prog.set_linux_kernel_custom(info, True)
        self.prog.load_debug_info([vmlinux], main=True)
        self._regs_type = self.prog.type("struct pt_regs")

    def _reader(self, base: int) -> Callable[[int, int, int, bool], bytes]:
        view = self._map

        def read(address: int, count: int, offset: int, physical: bool) -> bytes:
            return view[base + offset : base + offset + count]

        return read

    def trace(self, regs: RegisterSet) -> drgn.StackTrace:
        general = regs.general
        value: dict[str, int] = {member: general[name] for member, name in PT_REGS}
        value["cs"] = regs.cs
        return self.prog.stack_trace(self._drgn.Object(self.prog, self._regs_type, value))

    def names(self, regs: RegisterSet) -> list[str]:
        """What a drgn user gets: every frame's name (inlined calls included)."""
        return [frame.name for frame in self.trace(regs)]

    def kernel_frames(self, regs: RegisterSet) -> list[KernelFrame]:
        """Each non-inline kernel frame: its address (the return address, or RIP) and
        the ELF symbol that holds it (drgn's choice among symbols at that address)."""
        frames: list[KernelFrame] = []
        for frame in self.trace(regs):
            if frame.is_inline or not is_kernel_address(frame.pc):
                continue
            try:
                frames.append((frame.pc, frame.symbol().name))
            except LookupError:
                frames.append((frame.pc, None))
        return frames

    def close(self) -> None:
        self._map.close()
        self._file.close()


async def guest_layout(socket: str, ram: str) -> tuple[list[tuple[int, int, int]], bytes]:
    """Guest RAM's physical segments in the RAM file and its VMCOREINFO text, through
    qmpprof's direct memory (setting drgn up; not timed)."""
    session = await QmpSession.connect(socket)
    try:
        memory = await open_direct(session, ram)
        try:
            physical = memory.physical
            segments = [(s.start, s.end, s.source_offset) for s in physical.segments]
            ranges = [(start, end) for start, end, _ in segments]
            page, _ = vmcoreinfo.find(physical.read_physical, ranges)
            text = vmcoreinfo.page_text(physical.read_physical(page, vmcoreinfo.PAGE_SIZE))
            assert text is not None
            return segments, text
        finally:
            await memory.close()
    finally:
        await session.close()


def drgn_run(socket: str, seconds: float, kernel: DrgnKernel) -> Run:
    """stop, info registers -a, drgn's unwind and names of every vCPU, cont."""
    samples = 0

    def tick(qmp: BareQmp) -> int:
        nonlocal samples
        qmp.call("stop")
        try:
            in_kernel = 0
            for regs in parse_all(str(qmp.call("human-monitor-command", REGISTERS))):
                kernel.names(regs)
                in_kernel += is_kernel_address(regs.rip)
                samples += 1
            return in_kernel
        finally:
            qmp.call("cont")

    run = bare_run(socket, seconds, tick)
    return run._replace(samples=samples)


class Agreement(NamedTuple):
    """Kernel samples compared, how many had the same frames (addresses) in qmpprof and
    drgn, how many also the same names, and the first of each difference."""

    ticks: int
    compared: int
    same_frames: int
    same_names: int
    frame_difference: tuple[list[KernelFrame], list[KernelFrame]] | None
    #: Where the frames agree: each name qmpprof gives and the other drgn gives there.
    other_names: dict[str | None, str | None]


async def agreement(options: TargetOptions, kernel: DrgnKernel, wanted: int) -> Agreement:
    """Ticks with the VM paused through qmpprof's session, each vCPU captured and named
    by qmpprof and unwound by drgn from the same registers and memory, until `wanted`
    samples in the kernel were compared (CHECK_TICKS at most)."""
    analyzer = build_analyzer(options)
    compared = same_frames = same_names = ticks = 0
    frame_difference = None
    other_names: dict[str | None, str | None] = {}
    async with connected(options, analyzer) as (session, _, capturer):
        while compared < wanted and ticks < CHECK_TICKS:
            ticks += 1
            await session.execute("stop")
            try:
                captured = await capturer.capture()
                pairs = [
                    (analyzer.symbolize(one), kernel.kernel_frames(one.raw.registers))
                    for one in captured
                    if is_kernel_address(one.raw.registers.rip)
                ]
            finally:
                await session.execute("cont")
            for sample, theirs in pairs:
                ours = [(f.address.address, f.function) for f in sample.frames if f.is_kernel]
                compared += 1
                if [pc for pc, _ in ours] != [pc for pc, _ in theirs]:
                    frame_difference = frame_difference or (ours, theirs)
                else:
                    same_frames += 1
                    same_names += ours == theirs
                    pairs_named = zip(ours, theirs, strict=True)
                    other_names |= {a: b for (_, a), (_, b) in pairs_named if a != b}
            await asyncio.sleep(CHECK_GAP_S)
    return Agreement(ticks, compared, same_frames, same_names, frame_difference, other_names)


def describe_frames(frames: list[KernelFrame]) -> str:
    return " < ".join(f"{name or '?'} {pc:#x}" for pc, name in frames)


METHODS = ("floor", "stop", "drgn", "floor_nonblocking", "nonblocking")


class Measured(NamedTuple):
    runs: dict[str, list[Run]]
    abi: str
    vcpus: int
    drgn_load_s: float | None
    agreement: Agreement | None


def measure(args: argparse.Namespace) -> Measured:
    """Every method for --seconds in each of --rounds rounds, taking turns."""
    runs: dict[str, list[Run]] = {name: [] for name in METHODS}
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory,
        scratch_ram_file() as ram,
        running_linux(Path(directory), *guest_args(args, ram), abi=args.abi) as guest,
    ):
        options = TargetOptions(guest.qmp, None, memory="direct", mem_path=ram)
        vcpus = vcpu_count(guest.qmp)
        print(f"kernel {guest.abi}, {vcpus} vCPUs, TCG, RAM file", flush=True)
        kernel, load_s = None, None
        if HAVE_DRGN:
            started = time.perf_counter()
            segments, info = asyncio.run(guest_layout(guest.qmp, ram))
            kernel = DrgnKernel(ram, segments, info, guest.kernel)
            load_s = time.perf_counter() - started
            drgn_run(guest.qmp, DRGN_WARM_S, kernel)
        try:
            for number in range(args.rounds):
                runs["floor"].append(floor_run(guest.qmp, args.seconds, "stop", vcpus))
                runs["stop"].append(asyncio.run(qmpprof_run(options, args.seconds, "stop")))
                if kernel is not None:
                    runs["drgn"].append(drgn_run(guest.qmp, args.seconds, kernel))
                floor = floor_run(guest.qmp, args.seconds, "nonblocking", vcpus)
                runs["floor_nonblocking"].append(floor)
                nonblocking = asyncio.run(qmpprof_run(options, args.seconds, "nonblocking"))
                runs["nonblocking"].append(nonblocking)
                print(f"  round {number + 1}: {round_line(runs)}", flush=True)
            checked = None
            if kernel is not None:
                checked = asyncio.run(agreement(options, kernel, args.check))
        finally:
            if kernel is not None:
                kernel.close()
        return Measured(runs, guest.abi, vcpus, load_s, checked)


def guest_args(args: argparse.Namespace, ram: str) -> list[str]:
    """boot.sh's arguments: the RAM file, and --smp when asked for."""
    return ["--memory-backend", ram, *(["--smp", str(args.smp)] if args.smp else [])]


def rate(runs: list[Run], what: str = "ticks") -> float | None:
    """Ticks (or vCPU samples) per second over every round."""
    seconds = sum(run.seconds for run in runs)
    count = sum(run.ticks if what == "ticks" else run.samples for run in runs)
    return count / seconds if seconds else None


def pause_ms(runs: list[Run]) -> float | None:
    pauses = [pause for run in runs for pause in run.pauses]
    return median(pauses) * 1000 if pauses else None


def cpu_ms(runs: list[Run]) -> float | None:
    """This process's CPU per tick, over every round."""
    ticks = sum(run.ticks for run in runs)
    return sum(run.cpu for run in runs) / ticks * 1000 if ticks else None


def ratio(over: float | None, under: float | None) -> float | None:
    return round(over / under, 2) if over is not None and under else None


def round_line(runs: dict[str, list[Run]]) -> str:
    """The last round's rates, as they come."""
    cells = [
        f"{name} {rate(values[-1:], 'samples' if 'nonblocking' in name else 'ticks'):.0f}"
        for name, values in runs.items()
        if values
    ]
    return ", ".join(cells) + " (Hz; nonblocking: vCPU samples/s)"


def per_round(over: list[Run], under: list[Run]) -> list[float] | None:
    """Each round's ratio of the two methods' tick rates, least and greatest."""
    ratios = [
        a.ticks / a.seconds / (b.ticks / b.seconds) for a, b in zip(over, under, strict=False)
    ]
    return [round(min(ratios), 2), round(max(ratios), 2)] if ratios else None


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per method per round")
    parser.add_argument("--abi", help="the Debian kernel to boot (boot.sh's default if none)")
    parser.add_argument("--check", type=int, default=40, help="kernel samples drgn checks")
    parser.add_argument(
        "--smp",
        type=int,
        help="the guest's vCPUs (boot.sh's default, 2, if none); with 1, "
        "a host core is left to QEMU's monitor and qmpprof",
    )
    args = parser.parse_args()
    if not HAVE_DRGN:
        print("drgn is not installed (pip install -e '.[bench]'): its column is skipped")
    runs, abi, vcpus, load_s, checked = measure(args)
    hz = {name: rate(runs[name]) for name in ("floor", "stop", "drgn")}
    per_s = {name: rate(runs[name], "samples") for name in ("floor_nonblocking", "nonblocking")}
    pauses = {name: pause_ms(runs[name]) for name in ("floor", "stop", "drgn")}
    figures = {
        "stop_over_floor": ratio(hz["stop"], hz["floor"]),
        "stop_over_drgn": ratio(hz["stop"], hz["drgn"]),
        "pause_over_drgn": ratio(pauses["stop"], pauses["drgn"]),
        "pause_over_floor": ratio(pauses["stop"], pauses["floor"]),
        "nonblocking_over_floor": ratio(per_s["nonblocking"], per_s["floor_nonblocking"]),
    }
    ranges = {
        "stop_over_floor_range": per_round(runs["stop"], runs["floor"]),
        "stop_over_drgn_range": per_round(runs["stop"], runs["drgn"]),
    }
    print(
        f"stop mode, unthrottled: floor {hz['floor']:.0f} Hz (pause {pauses['floor']:.3f} ms),"
        f" qmpprof {hz['stop']:.0f} Hz (pause {pauses['stop']:.3f} ms): stop_hz / floor_hz "
        f"{figures['stop_over_floor']:.2f} (target >= {TARGETS['stop_over_floor']}; per round "
        f"{describe_range(ranges['stop_over_floor_range'])}), pause "
        f"{figures['pause_over_floor']:.2f}x the floor's"
    )
    print(
        f"nonblocking, unthrottled: floor {per_s['floor_nonblocking']:.0f}, qmpprof "
        f"{per_s['nonblocking']:.0f} vCPU samples/s ({figures['nonblocking_over_floor']:.2f}x "
        f"the floor; target >= {NONBLOCKING_TARGET})"
    )
    cpu = {name: cpu_ms(runs[name]) for name in METHODS}
    print(
        "this process's CPU per tick: "
        + ", ".join(f"{name} {value:.3f} ms" for name, value in cpu.items() if value is not None)
    )
    drgn_figures: dict[str, object] = {}
    if hz["drgn"] is not None and pauses["drgn"] is not None:
        drgn_samples = sum(run.samples for run in runs["drgn"])
        share = sum(run.kernel for run in runs["drgn"]) / max(drgn_samples, 1)
        spread = describe_range(ranges["stop_over_drgn_range"])
        print(
            f"drgn {version()} (debug info loaded in {load_s:.1f} s): {hz['drgn']:.0f} Hz, "
            f"pause {pauses['drgn']:.3f} ms ({share:.0%} of its vCPU samples in the kernel); "
            f"stop_hz / drgn_hz {figures['stop_over_drgn']:.2f} (target >= "
            f"{TARGETS['stop_over_drgn']}; per round {spread}), qmpprof's pause / drgn's "
            f"{figures['pause_over_drgn']:.2f} (target <= {TARGETS['pause_over_drgn']})"
        )
        drgn_figures = {"drgn_version": version(), "drgn_load_s": rounded(load_s, 1)}
        drgn_figures["drgn_kernel_share"] = round(share, 3)
    if checked is not None:
        print(
            f"{checked.compared} kernel samples ({checked.ticks} ticks), each unwound by "
            f"qmpprof and by drgn in the same pause: the same frames (addresses) on "
            f"{checked.same_frames}, the same function names too on {checked.same_names}"
        )
        if checked.frame_difference is not None:
            ours, theirs = checked.frame_difference
            print("  the first difference in frames:")
            print(f"    qmpprof {describe_frames(ours)}\n    drgn    {describe_frames(theirs)}")
        if checked.other_names:
            named = ", ".join(
                f"{a} (drgn: {b})" for a, b in sorted(checked.other_names.items(), key=str)
            )
            print(f"  the same addresses named otherwise by drgn: {named}")
        drgn_figures |= {"compared": checked.compared, "same_frames": checked.same_frames}
        drgn_figures["same_names"] = checked.same_names
    summary: dict[str, object] = {"abi": abi, "vcpus": vcpus, "rounds": args.rounds}
    summary |= {"seconds": args.seconds}
    summary |= {f"{name}_hz": rounded(value, 1) for name, value in hz.items()}
    summary |= {f"{name}_vcpu_samples_per_s": rounded(v, 1) for name, v in per_s.items()}
    summary |= {f"{name}_pause_ms": rounded(value, 3) for name, value in pauses.items()}
    summary |= {f"{name}_cpu_ms": rounded(value, 3) for name, value in cpu.items()}
    print(json.dumps(summary | figures | ranges | drgn_figures))


def describe_range(bounds: list[float] | None) -> str:
    return f"{bounds[0]:.2f}-{bounds[1]:.2f}" if bounds else "n/a"


def version() -> str:
    from importlib.metadata import version as installed

    return installed("drgn")


if __name__ == "__main__":
    main()
