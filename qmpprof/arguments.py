"""The command line's flags: each command's arguments, the types that check their
values, and the limits on numbers (docs/reference.md lists them all). cli.py builds
the parser from these and turns what it parses into each command's options."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from qmpprof.defaults import DEFAULT_MAX_DEPTH, DEFAULT_RATE_HZ, DEFAULT_STACK_BYTES

# Limits on numbers from the command line: each one keeps a typo from pausing the VM for
# minutes, allocating without bound or spinning (see docs/reference.md).
#: A tick takes at least one QMP round trip (the best measured rates are about 400 Hz
#: paused and 1,500 Hz nonblocking); above 10 kHz every tick would be missed.
MAX_RATE_HZ = 10_000.0
#: One sample every 100 s: slower than that is not a profile.
MIN_RATE_HZ = 0.01
#: A week; recording keeps every sample in memory.
MAX_DURATION_S = 7 * 24 * 3600.0
#: The stack read is done with the VM paused, each tick, for each vCPU: 1 MiB is 64 Linux
#: kernel stacks and takes seconds through HMP; more only holds the VM longer.
MAX_STACK_BYTES = 1 << 20
#: Real call chains are far shorter; deeper is runaway recursion or a corrupt stack.
MAX_DEPTH = 4096
MAX_CPU_INDEX = 4095
MIN_REFRESH_S, MAX_REFRESH_S = 0.1, 3600.0
#: perf's own default rate; above it the stack copies (8 KiB a sample) flood the disk.
MAX_HOST_RATE_HZ = 4000.0
#: Each perf sample keeps an 8 KiB stack copy: 250 Hz is 2 MB/s per busy thread.
DEFAULT_HOST_RATE_HZ = 250.0


def record_arguments(parser: argparse.ArgumentParser) -> None:
    _add_target_arguments(parser)
    _add_binary_arguments(parser)
    _add_output_arguments(parser)
    _add_record_arguments(parser)


def dump_arguments(parser: argparse.ArgumentParser) -> None:
    _add_target_arguments(parser)
    _add_binary_arguments(parser)
    _add_dump_arguments(parser)


def report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("capture", type=Path, metavar="CAPTURE", help="a .qmpcap file")
    _add_binary_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument(
        "--reunwind",
        action="store_true",
        help="unwind again from the captured memory (needs --capture-memory)",
    )


def top_arguments(parser: argparse.ArgumentParser) -> None:
    _add_target_arguments(parser)
    _add_binary_arguments(parser)
    _add_top_arguments(parser)


def resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--qmp-socket", default="./qmp-socket", metavar="PATH", help="QEMU's QMP unix socket"
    )


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--qmp-socket",
        default="./qmp-socket",
        metavar="PATH",
        help="QEMU's QMP unix socket (-qmp unix:PATH,server=on,wait=off)",
    )
    add(
        "--libvirt",
        metavar="DOMAIN",
        help="a libvirt domain (name, id or UUID) instead of --qmp-socket: reached through "
        "libvirt's Python binding, or at the QMP socket its XML gives QEMU",
    )
    _add_libvirt_uri(parser)
    add(
        "--connect-timeout",
        type=_in_range(float, 0.1, 3600.0, "seconds"),
        metavar="S",
        help="seconds to wait for the monitor's greeting (default 5 for a QMP socket, "
        "30 through libvirt: a round trip through libvirtd)",
    )
    add(
        "--pid",
        type=_int_in_range(1, 1 << 22, "pid"),
        metavar="PID",
        help="QEMU's process id, when the socket's peer is a proxy, not QEMU (checked)",
    )
    add(
        "--memory",
        choices=("auto", "direct", "memsave", "hmp"),
        default="auto",
        help="how to read guest memory (default auto: direct, else memsave, else hmp)",
    )
    add(
        "--mem-path",
        metavar="FILE",
        help="the file QEMU backs guest RAM with (-object memory-backend-file,mem-path=FILE,"
        "share=on): direct reads map it instead of reading /proc/PID/mem",
    )
    add(
        "--stack-bytes",
        type=_int_in_range(1, MAX_STACK_BYTES, "bytes"),
        default=DEFAULT_STACK_BYTES,
        metavar="N",
        help="bytes of stack to read above RSP per vCPU "
        f"(default {DEFAULT_STACK_BYTES}, at most {MAX_STACK_BYTES})",
    )
    add(
        "--cpus",
        type=_cpu_list,
        default=(),
        metavar="LIST",
        help="only these vCPUs, e.g. 0,2 (default all)",
    )


def _add_binary_arguments(parser: argparse.ArgumentParser) -> None:
    from qmpprof.unwind.unwinder import Strategy

    add = parser.add_argument
    add("--kernel", type=Path, metavar="ELF", help="the guest kernel's ELF file with symbols")
    add(
        "--module-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a Linux guest's kernel modules (DIR/NAME.ko or NAME.ko.xz): their symbols; "
        "without one a module's code shows as [NAME]+offset; repeatable",
    )
    add(
        "--sysroot",
        type=Path,
        metavar="DIR",
        help="the guest's files on this host, at their guest paths (DIR/lib/.../libc.so.6; "
        "debug files in DIR/usr/lib/debug/.build-id): a Linux guest's programs and shared "
        "libraries, each used only if its build-id is the guest's copy's",
    )
    add(
        "--debuginfod",
        action="append",
        default=[],
        metavar="URL",
        help="a debuginfod server: the kernel's and each guest file's debug file fetched by "
        "build-id (default: DEBUGINFOD_URLS; cached where GDB and perf keep theirs); repeatable",
    )
    add(
        "--user-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="user binaries with symbols, named after their process (DIR/NAME.elf); repeatable",
    )
    add(
        "--user",
        type=Path,
        action="append",
        default=[],
        metavar="ELF",
        help="one user binary with symbols; repeatable",
    )
    add(
        "--unwind",
        choices=[s.value for s in Strategy],
        default="auto",
        help="auto: a Linux kernel's ORC tables, DWARF CFI elsewhere, frame pointers where "
        "neither covers a frame (default); cfi: DWARF CFI only; fp: frame pointers only",
    )
    add(
        "--max-depth",
        type=_int_in_range(1, MAX_DEPTH, "frames"),
        default=DEFAULT_MAX_DEPTH,
        metavar="N",
        help=f"most frames per stack (default {DEFAULT_MAX_DEPTH}, at most {MAX_DEPTH})",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    from qmpprof.output.writers import Format
    from qmpprof.profile import Grouping, Scope

    add = parser.add_argument
    add(
        "-o",
        "--output",
        type=Path,
        action="append",
        metavar="FILE",
        help="output file (default profile.folded); its extension picks the format; "
        "repeat for several formats from one recording",
    )
    add(
        "--format",
        choices=[f.value for f in Format],
        help="folded, speedscope, svg, pprof or qmpcap (default: from the -o extension)",
    )
    add("--idle", action="store_true", help="include idle (halted) samples in stacks")
    add(
        "--group-by",
        choices=[g.value for g in Grouping],
        default=Grouping.THREAD.value,
        help="the levels above the stacks: process then thread (default, as perf and samply), "
        "process then vCPU, process only, or program only (comm: a program's processes merged)",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--kernel-only",
        action="store_const",
        dest="scope",
        const=Scope.KERNEL,
        help="only samples taken in the kernel, kernel frames only",
    )
    scope.add_argument(
        "--user-only",
        action="store_const",
        dest="scope",
        const=Scope.USER,
        help="only user frames (a sample in a syscall counts at its call site)",
    )
    parser.set_defaults(scope=Scope.ALL)


def _add_record_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--duration",
        type=_in_range(float, 0.001, MAX_DURATION_S, "seconds"),
        default=10.0,
        metavar="S",
        help="seconds to record (default 10); Ctrl-C stops early",
    )
    _add_rate_arguments(parser)
    _add_nonblocking_argument(parser)
    add(
        "--capture-memory",
        action="store_true",
        help="with a .qmpcap output, also keep the memory read for each sample",
    )
    add(
        "--host",
        action="store_true",
        help="also record the QEMU process with Linux perf: one profile of QEMU's threads, "
        "the guest's stacks in place of the guest code its vCPU threads ran",
    )
    add(
        "--host-rate",
        type=_in_range(float, 1.0, MAX_HOST_RATE_HZ, "Hz"),
        default=DEFAULT_HOST_RATE_HZ,
        metavar="HZ",
        help=f"perf's samples per second of each QEMU thread's CPU time with --host "
        f"(default {DEFAULT_HOST_RATE_HZ:g}; each keeps an 8 KiB stack copy on disk)",
    )
    add("--verbose", action="store_true", help="say more about the setup")


def _add_rate_arguments(parser: argparse.ArgumentParser) -> None:
    timing = parser.add_mutually_exclusive_group()
    timing.add_argument(
        "--rate",
        type=_in_range(
            float, MIN_RATE_HZ, MAX_RATE_HZ, "Hz", "a tick takes at least one QMP round trip"
        ),
        metavar="HZ",
        help=f"samples per second (default {DEFAULT_RATE_HZ:g}, jittered; "
        f"{MIN_RATE_HZ:g} to {MAX_RATE_HZ:g})",
    )
    timing.add_argument(
        "--interval",
        type=_in_range(
            float,
            1000 / MAX_RATE_HZ,
            1000 / MIN_RATE_HZ,
            "ms",
            "a tick takes at least one QMP round trip",
        ),
        metavar="MS",
        help="milliseconds between samples (instead of --rate; "
        f"{1000 / MAX_RATE_HZ:g} to {1000 / MIN_RATE_HZ:g})",
    )


def _add_nonblocking_argument(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--nonblocking",
        action="store_true",
        help="never pause the VM: read registers and memory while it runs (stacks may tear)",
    )
    mode.add_argument(
        "--stop",
        action="store_true",
        help="pause the VM for each sample even through libvirt, where each command is a "
        "round trip through libvirtd and the default is nonblocking when stop mode would "
        "hold the VM paused over 1%% of the time",
    )
    parser.add_argument(
        "--unwind-paused",
        action="store_true",
        help="unwind while the VM is paused, reading memory as the unwind asks, instead of "
        "unwinding a copy of each stack (--stack-bytes) once it runs again: exact at any "
        "depth, a longer pause (guest RAM read on this host only)",
    )


def _add_top_arguments(parser: argparse.ArgumentParser) -> None:
    _add_rate_arguments(parser)
    _add_nonblocking_argument(parser)
    parser.add_argument("--process", metavar="NAME", help="only samples of processes called NAME")
    parser.add_argument("--idle", action="store_true", help="show idle samples from the start")
    parser.add_argument(
        "--refresh",
        type=_in_range(float, MIN_REFRESH_S, MAX_REFRESH_S, "seconds"),
        default=1.0,
        metavar="S",
        help="seconds between redraws (default 1)",
    )


def _add_dump_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--lines",
        action="store_true",
        help="file:line of each frame from DWARF line tables (inlined calls are always listed)",
    )


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    from qmpprof.serve.addresses import (
        DEFAULT_MAX_SECONDS,
        DEFAULT_PORT,
        MAX_SECONDS_LIMIT,
        listen_address,
        vm_spec,
    )

    add = parser.add_argument
    add(
        "--vm",
        type=vm_spec,
        action="append",
        default=[],
        metavar="NAME=SOCKET",
        help="a VM to serve: its name (in URLs and the `vm` label) and its QMP socket; "
        "repeatable (at least one --vm or --libvirt)",
    )
    add(
        "--libvirt",
        dest="domains",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="a libvirt domain to serve, under its name, reached as `record --libvirt` "
        "reaches it; repeatable",
    )
    _add_libvirt_uri(parser)
    add(
        "--listen",
        type=listen_address,
        default=("127.0.0.1", DEFAULT_PORT),
        metavar="HOST:PORT",
        help=f"where to listen (default 127.0.0.1:{DEFAULT_PORT}; port 0 picks a free one)",
    )
    add(
        "--max-seconds",
        type=_int_in_range(1, MAX_SECONDS_LIMIT, "seconds"),
        default=DEFAULT_MAX_SECONDS,
        metavar="S",
        help=f"the longest profile a request may ask for (default {DEFAULT_MAX_SECONDS}; "
        "a request gets 30 s without ?seconds=N)",
    )
    add("--idle", action="store_true", help="include idle (halted) samples in profiles")
    _add_binary_arguments(parser)
    _add_rate_arguments(parser)
    _add_nonblocking_argument(parser)


def _in_range(
    kind: Callable[[str], float], low: float, high: float, unit: str, why: str = ""
) -> Callable[[str], float]:
    """An argparse type: a number of `kind` within [low, high], refused with the range."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high):
            reason = f" ({why})" if why else ""
            raise argparse.ArgumentTypeError(
                f"must be a number from {_plain(low)} to {_plain(high)} {unit}{reason}, "
                f"not {text!r}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


def _plain(number: float) -> str:
    return str(int(number)) if number == int(number) else f"{number:g}"


def _int_in_range(low: int, high: int, unit: str, why: str = "") -> Callable[[str], int]:
    parse = _in_range(int, low, high, unit, why)
    return lambda text: int(parse(text))


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        cpus = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        cpus = {-1}
    if not cpus or min(cpus) < 0 or max(cpus) > MAX_CPU_INDEX:
        raise argparse.ArgumentTypeError(f"expected vCPU numbers like 0,2, not {text!r}")
    return tuple(sorted(cpus))


def _add_libvirt_uri(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--libvirt-uri",
        metavar="URI",
        help="libvirt's connection URI for --libvirt, as virsh -c (default: libvirt's)",
    )
