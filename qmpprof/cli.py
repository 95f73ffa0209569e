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
from qmpprof.errors import QmpprofError
from qmpprof.profile import Scope
from qmpprof.unwind.unwinder import Strategy

COMMANDS = ("record", "dump")
EXIT_ERROR = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run qmpprof; returns the exit status (0 ok, 1 error, 2 bad usage)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_with_default_command(arguments))
    err = Console(stderr=True, highlight=False)
    try:
        if args.command == "dump" or args.one_shot:
            asyncio.run(run_dump(_dump_options(args), Console(highlight=False)))
        else:
            asyncio.run(run_record(_record_options(args), Console(highlight=False), err))
    except QmpprofError as error:
        print(f"qmpprof: error: {_one_line(str(error))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("qmpprof: interrupted", file=sys.stderr)
        return 130
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _with_default_command(argv: list[str]) -> list[str]:
    """`record` is the default: `qmpprof --qmp-socket S` means `qmpprof record --qmp-socket S`."""
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
    _add_target_arguments(record)
    _add_record_arguments(record)
    dump = commands.add_parser("dump", help="print the current stack of every vCPU once")
    _add_target_arguments(dump)
    _add_dump_arguments(dump)
    return parser


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--qmp-socket",
        default="./qmp-socket",
        metavar="PATH",
        help="QEMU's QMP unix socket (-qmp unix:PATH,server=on,wait=off)",
    )
    parser.add_argument(
        "--kernel", type=Path, metavar="ELF", help="the guest kernel's ELF file with symbols"
    )
    parser.add_argument(
        "--memory",
        choices=("auto", "hmp", "memsave"),
        default="auto",
        help="how to read guest memory (default: memsave if QEMU is local)",
    )
    parser.add_argument(
        "--stack-bytes",
        type=_positive_int,
        default=16 * 1024,
        metavar="N",
        help="bytes of stack to read above RSP per vCPU (default 16384)",
    )
    parser.add_argument(
        "--max-depth",
        type=_positive_int,
        default=128,
        metavar="N",
        help="most frames per stack (default 128)",
    )
    parser.add_argument(
        "--unwind",
        choices=[s.value for s in Strategy],
        default="auto",
        help="auto: DWARF CFI, frame pointers where no CFI covers a frame (default); "
        "cfi: CFI only; fp: frame pointers only",
    )
    parser.add_argument(
        "--user-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="user binaries with symbols, named after their process (DIR/NAME.elf); repeatable",
    )
    parser.add_argument(
        "--user",
        type=Path,
        action="append",
        default=[],
        metavar="ELF",
        help="one user binary with symbols; repeatable",
    )
    parser.add_argument(
        "--cpus",
        type=_cpu_list,
        default=(),
        metavar="LIST",
        help="only these vCPUs, e.g. 0,2 (default all)",
    )
    parser.add_argument("--one-shot", action="store_true", help="same as the dump command")


def _add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="seconds to record (default 10); Ctrl-C stops early",
    )
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
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("profile.folded"),
        metavar="FILE",
        help="where to write folded stacks (default profile.folded)",
    )
    parser.add_argument(
        "--idle", action="store_true", help="include idle (halted) samples in stacks"
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
        help="only user frames (a sample in a syscall counts at its user call site)",
    )
    parser.set_defaults(scope=Scope.ALL)
    parser.add_argument("--verbose", action="store_true", help="say more about the setup")
    parser.set_defaults(json=False, show_addresses=False)


def _add_dump_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--show-addresses", action="store_true", help="print frame addresses")


def _target_options(args: argparse.Namespace) -> TargetOptions:
    return TargetOptions(
        qmp_socket=args.qmp_socket,
        kernel=args.kernel,
        memory=args.memory,
        stack_bytes=args.stack_bytes,
        max_depth=args.max_depth,
        unwind=Strategy(args.unwind),
        user_dirs=tuple(args.user_dir),
        user_files=tuple(args.user),
        cpus=args.cpus,
    )


def _record_options(args: argparse.Namespace) -> RecordOptions:
    period = args.interval / 1000 if args.interval is not None else 1 / (args.rate or 99.0)
    return RecordOptions(
        target=_target_options(args),
        output=args.output,
        duration_s=args.duration,
        period_s=period,
        include_idle=args.idle,
        scope=args.scope,
        verbose=args.verbose,
    )


def _dump_options(args: argparse.Namespace) -> DumpOptions:
    return DumpOptions(_target_options(args), as_json=args.json, show_addresses=args.show_addresses)


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
