"""The command line: parse, dispatch, and turn errors into one line and an exit code.

This is the only module that prints errors and chooses exit codes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from qmpprof import __version__
from qmpprof.commands.common import TargetOptions
from qmpprof.commands.dump import DumpOptions, run_dump
from qmpprof.commands.record import RecordOptions, run_record
from qmpprof.commands.report import ReportOptions, run_report
from qmpprof.commands.resume import run_resume
from qmpprof.commands.top import TopOptions, run_top
from qmpprof.errors import QmpprofError
from qmpprof.output.writers import Format, infer_format
from qmpprof.profile import Scope
from qmpprof.unwind.unwinder import Strategy

COMMANDS = ("record", "dump", "report", "top", "resume")
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run qmpprof; returns the exit status (0 ok, 1 error, 2 bad usage)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_with_default_command(arguments))
    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    try:
        if args.command == "dump":
            asyncio.run(run_dump(_dump_options(args), out))
        elif args.command == "report":
            run_report(_report_options(args), out)
        elif args.command == "top":
            asyncio.run(run_top(_top_options(args), out))
        elif args.command == "resume":
            asyncio.run(run_resume(args.qmp_socket, out))
        else:
            asyncio.run(run_record(_record_options(args), out, err))
    except QmpprofError as error:
        print(f"qmpprof: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("qmpprof: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _with_default_command(argv: list[str]) -> list[str]:
    """`record` is the default: `qmpprof --qmp-socket S` means `qmpprof record --qmp-socket S`;
    `--one-shot` anywhere means `dump`."""
    if "--one-shot" in argv:  # the original QMP profiler's spelling of `dump`
        return ["dump", *(a for a in argv if a not in ("--one-shot", "record", "dump"))]
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["record", *argv]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qmpprof",
        description="Sample where a QEMU guest spends its CPU time, from outside, over QMP.",
    )
    parser.add_argument("--version", action="version", version=f"qmpprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    record = commands.add_parser("record", help="sample for a while and write a profile (default)")
    dump = commands.add_parser("dump", help="print the current stack of every vCPU once")
    report = commands.add_parser("report", help="write any output format from a .qmpcap capture")
    report.add_argument("capture", type=Path, metavar="CAPTURE", help="a .qmpcap file")
    top = commands.add_parser("top", help="a live view of the hottest functions and processes")
    resume = commands.add_parser(
        "resume", help="resume a VM that a qmpprof which was killed left paused"
    )
    resume.add_argument(
        "--qmp-socket", default="./qmp-socket", metavar="PATH", help="QEMU's QMP unix socket"
    )
    for command in (record, dump, top):
        _add_target_arguments(command)
    for command in (record, dump, report, top):
        _add_binary_arguments(command)
    for command in (record, report):
        _add_output_arguments(command)
    _add_record_arguments(record)
    _add_dump_arguments(dump)
    _add_top_arguments(top)
    report.add_argument(
        "--reunwind",
        action="store_true",
        help="unwind again from the captured memory (needs --capture-memory)",
    )
    return parser


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--qmp-socket",
        default="./qmp-socket",
        metavar="PATH",
        help="QEMU's QMP unix socket (-qmp unix:PATH,server=on,wait=off)",
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
        type=_positive_int,
        default=16 * 1024,
        metavar="N",
        help="bytes of stack to read above RSP per vCPU (default 16384)",
    )
    add(
        "--cpus",
        type=_cpu_list,
        default=(),
        metavar="LIST",
        help="only these vCPUs, e.g. 0,2 (default all)",
    )


def _add_binary_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kernel", type=Path, metavar="ELF", help="the guest kernel's ELF file with symbols")
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
        help="auto: DWARF CFI, frame pointers where no CFI covers a frame (default); "
        "cfi: CFI only; fp: frame pointers only",
    )
    add(
        "--max-depth",
        type=_positive_int,
        default=128,
        metavar="N",
        help="most frames per stack (default 128)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
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
        type=_positive_float,
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
    add("--verbose", action="store_true", help="say more about the setup")


def _add_rate_arguments(parser: argparse.ArgumentParser) -> None:
    timing = parser.add_mutually_exclusive_group()
    timing.add_argument(
        "--rate",
        type=_positive_float,
        metavar="HZ",
        help="samples per second (default 99, jittered)",
    )
    timing.add_argument(
        "--interval",
        type=_positive_float,
        metavar="MS",
        help="milliseconds between samples (instead of --rate)",
    )


def _add_nonblocking_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="never pause the VM: read registers and memory while it runs (stacks may tear)",
    )


def _add_top_arguments(parser: argparse.ArgumentParser) -> None:
    _add_rate_arguments(parser)
    _add_nonblocking_argument(parser)
    parser.add_argument("--process", metavar="NAME", help="only samples of processes called NAME")
    parser.add_argument("--idle", action="store_true", help="show idle samples from the start")
    parser.add_argument(
        "--refresh",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="seconds between redraws (default 1)",
    )


def _add_dump_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--show-addresses",
        action="store_true",
        help="print frame addresses (always on; kept for the original profiler's users)",
    )
    parser.add_argument(
        "--lines",
        action="store_true",
        help="file:line of each frame from DWARF line tables, and inlined calls",
    )


def _target_options(args: argparse.Namespace) -> TargetOptions:
    return TargetOptions(
        qmp_socket=getattr(args, "qmp_socket", ""),
        kernel=args.kernel,
        user_dirs=tuple(args.user_dir),
        user_files=tuple(args.user),
        memory=getattr(args, "memory", "auto"),
        mem_path=getattr(args, "mem_path", None),
        stack_bytes=getattr(args, "stack_bytes", 16 * 1024),
        max_depth=args.max_depth,
        unwind=Strategy(args.unwind),
        cpus=getattr(args, "cpus", ()),
    )


def _record_options(args: argparse.Namespace) -> RecordOptions:
    period = _period(args)
    return RecordOptions(
        target=_target_options(args),
        outputs=_outputs(args),
        duration_s=args.duration,
        period_s=period,
        include_idle=args.idle,
        scope=args.scope,
        capture_memory=args.capture_memory,
        nonblocking=args.nonblocking,
        verbose=args.verbose,
    )


def _report_options(args: argparse.Namespace) -> ReportOptions:
    return ReportOptions(
        capture=args.capture,
        target=_target_options(args),
        outputs=_outputs(args),
        include_idle=args.idle,
        scope=args.scope,
        reunwind=args.reunwind,
    )


def _outputs(args: argparse.Namespace) -> tuple[tuple[Path, Format], ...]:
    paths = args.output or [Path("profile.folded")]
    return tuple((path, infer_format(path, args.format)) for path in paths)


def _period(args: argparse.Namespace) -> float:
    return args.interval / 1000 if args.interval is not None else 1 / (args.rate or 99.0)


def _top_options(args: argparse.Namespace) -> TopOptions:
    return TopOptions(
        target=_target_options(args),
        period_s=_period(args),
        refresh_s=args.refresh,
        process=args.process,
        include_idle=args.idle,
        nonblocking=args.nonblocking,
    )


def _dump_options(args: argparse.Namespace) -> DumpOptions:
    return DumpOptions(_target_options(args), as_json=args.json, lines=args.lines)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected vCPU numbers like 0,2: {text}") from err
