"""The command line: parse, dispatch, and turn errors into one line and an exit code.

This is the only module that prints errors and chooses exit codes; the flags themselves
are arguments.py's. The commands are one list (`COMMANDS`); each imports its module
only when it runs, so `qmpprof report` does not load the QMP client that `record`
needs. Start-up matters (`qmpprof dump` is run once per stack, bench/startup.py): only
the command given gets its arguments (and the imports their choices need), and rich is
imported by the commands that draw.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from qmpprof import __version__, arguments
from qmpprof.console import plain_stdout, terminal
from qmpprof.defaults import DEFAULT_RATE_HZ, DEFAULT_STACK_BYTES
from qmpprof.errors import QmpprofError
from qmpprof.visible import visible

if TYPE_CHECKING:
    from qmpprof.commands.common import TargetOptions
    from qmpprof.commands.host import HostOptions
    from qmpprof.output.writers import Format

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: The cyclic garbage collector's first threshold while a one-shot command runs: its
#: imports and loading make some 100,000 objects that live to the end, and collecting
#: them every 700 (Python's default) was a tenth of a `qmpprof dump`. Still bounded.
ONE_SHOT_GC_THRESHOLD = 200_000


def main(argv: Sequence[str] | None = None, exiting: bool = False) -> int:
    """Run qmpprof; returns the exit status (0 ok, 1 error, 2 bad usage). `exiting`: the
    process ends when this returns (`python -m qmpprof`)."""
    thresholds = gc.get_threshold()
    command = None
    try:
        arguments = _with_default_command(list(sys.argv[1:] if argv is None else argv))
        command = _COMMANDS_BY_NAME.get(arguments[0]) if arguments else None
        if command is not None and command.one_shot and thresholds[0]:  # 0: never collects
            gc.set_threshold(max(thresholds[0], ONE_SHOT_GC_THRESHOLD), *thresholds[1:])
        args = build_parser(arguments[0] if arguments else None).parse_args(arguments)
        return _run(_COMMANDS_BY_NAME[args.command], args)
    finally:
        if exiting and command is not None and command.one_shot:
            # The interpreter's exit collects once more, through every object there is
            # (a tenth of a second after a `dump`): what is left is not garbage of ours.
            gc.freeze()
        gc.set_threshold(*thresholds)


def _run(command: Command, args: argparse.Namespace) -> int:
    try:
        command.run(args)
    except QmpprofError as error:
        _say(f"qmpprof: error: {visible(' '.join(str(error).split()))}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        _say("qmpprof: interrupted")
        return EXIT_INTERRUPTED
    return 0


def _with_default_command(argv: list[str]) -> list[str]:
    """`record` is the default: `qmpprof --qmp-socket S` means `qmpprof record --qmp-socket S`;
    `--one-shot` anywhere means `dump`."""
    if "--one-shot" in argv:  # the original QMP profiler's spelling of `dump`
        return ["dump", *(a for a in argv if a not in ("--one-shot", "record", "dump"))]
    if argv and (argv[0] in _COMMANDS_BY_NAME or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["record", *argv]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given `only`, a command's name, the parser of a
    command line that starts with it: the other commands are left out (their arguments'
    choices import modules `only` may not need, and each parser costs a millisecond)."""
    parser = _OneLineParser(
        prog="qmpprof",
        description="Sample where a QEMU guest spends its CPU time, from outside, over QMP.",
    )
    parser.add_argument("--version", action="version", version=f"qmpprof {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        if only not in _COMMANDS_BY_NAME or command.name == only:
            command.add_arguments(subparsers.add_parser(command.name, help=command.help))
    return parser


def _target_options(args: argparse.Namespace) -> TargetOptions:
    from qmpprof.commands.common import TargetOptions
    from qmpprof.unwind.unwinder import Strategy

    qmp_socket = getattr(args, "qmp_socket", "")
    domain, uri = getattr(args, "libvirt", None), getattr(args, "libvirt_uri", None)
    if domain is not None:
        from qmpprof.errors import UsageError
        from qmpprof.target.libvirt import proxy_socket

        if qmp_socket != "./qmp-socket":
            raise UsageError("--libvirt and --qmp-socket: give one (--libvirt makes its own)")
        qmp_socket = proxy_socket(domain, uri)
    elif uri is not None and not getattr(args, "domains", None):
        from qmpprof.errors import UsageError

        raise UsageError("--libvirt-uri is for --libvirt DOMAIN")
    return TargetOptions(
        qmp_socket=qmp_socket,
        kernel=args.kernel,
        user_dirs=tuple(args.user_dir),
        user_files=tuple(args.user),
        sysroot=args.sysroot,
        module_dirs=tuple(args.module_dir),
        debuginfod=tuple(getattr(args, "debuginfod", ())),
        memory=getattr(args, "memory", "auto"),
        mem_path=getattr(args, "mem_path", None),
        stack_bytes=getattr(args, "stack_bytes", DEFAULT_STACK_BYTES),
        max_depth=args.max_depth,
        unwind=Strategy(args.unwind),
        cpus=getattr(args, "cpus", ()),
        unwind_paused=getattr(args, "unwind_paused", False),
        libvirt=domain,
        libvirt_uri=uri,
        qemu_pid=getattr(args, "pid", None),
        connect_timeout=getattr(args, "connect_timeout", None),
    )


def _run_record(args: argparse.Namespace) -> None:
    from qmpprof.commands.record import RecordOptions, run_record
    from qmpprof.profile import Grouping

    options = RecordOptions(
        target=_target_options(args),
        outputs=_outputs(args),
        duration_s=args.duration,
        period_s=_period(args),
        include_idle=args.idle,
        scope=args.scope,
        grouping=Grouping(args.group_by),
        capture_memory=args.capture_memory,
        nonblocking=args.nonblocking,
        force_stop=args.stop,
        verbose=args.verbose,
        host=_host_options(args),
    )
    _run_async(run_record(options, *terminal()))


def _host_options(args: argparse.Namespace) -> HostOptions | None:
    from qmpprof.commands.host import HostOptions

    return HostOptions(args.host_rate) if args.host else None


def _run_report(args: argparse.Namespace) -> None:
    from qmpprof.commands.report import ReportOptions, run_report
    from qmpprof.profile import Grouping

    options = ReportOptions(
        capture=args.capture,
        target=_target_options(args),
        outputs=_outputs(args),
        include_idle=args.idle,
        scope=args.scope,
        grouping=Grouping(args.group_by),
        reunwind=args.reunwind,
    )
    run_report(options, *terminal())


def _outputs(args: argparse.Namespace) -> tuple[tuple[Path, Format], ...]:
    from qmpprof.output.writers import infer_format

    paths = args.output or [Path("profile.folded")]
    return tuple((path, infer_format(path, args.format)) for path in paths)


def _period(args: argparse.Namespace) -> float:
    return args.interval / 1000 if args.interval is not None else 1 / (args.rate or DEFAULT_RATE_HZ)


def _run_top(args: argparse.Namespace) -> None:
    from qmpprof.commands.top import TopOptions, run_top

    options = TopOptions(
        target=_target_options(args),
        period_s=_period(args),
        refresh_s=args.refresh,
        process=args.process,
        include_idle=args.idle,
        nonblocking=args.nonblocking,
        force_stop=args.stop,
    )
    _run_async(run_top(options, terminal()[0]))


def _run_dump(args: argparse.Namespace) -> None:
    from qmpprof.commands.dump import DumpOptions, run_dump

    options = DumpOptions(_target_options(args), as_json=args.json, lines=args.lines)
    _run_async(run_dump(options, plain_stdout()))  # what rich would print, without rich


def _run_resume(args: argparse.Namespace) -> None:
    from qmpprof.commands.resume import run_resume

    _run_async(run_resume(args.qmp_socket, terminal()[0]))


def _run_serve(args: argparse.Namespace) -> None:
    from qmpprof.commands.serve import ServeOptions, run_serve

    options = ServeOptions(
        vms=tuple(args.vm),
        domains=tuple(args.domains),
        target=_target_options(args),
        listen=args.listen,
        period_s=_period(args),
        max_seconds=args.max_seconds,
        include_idle=args.idle,
        nonblocking=args.nonblocking,
        force_stop=args.stop,
    )
    _run_async(run_serve(options, terminal()[1]))


def _run_async(command: Coroutine[Any, Any, None]) -> None:
    """Run a command that talks to QEMU (asyncio is imported by those only)."""
    import asyncio

    asyncio.run(command)


@dataclass(frozen=True)
class Command:
    """One `qmpprof COMMAND`: its arguments, and how it runs (importing its module then,
    and making the consoles it prints to)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    #: Runs once and exits (ONE_SHOT_GC_THRESHOLD; and main's `exiting`).
    one_shot: bool = False


#: Every command, in the order `--help` lists them; `record` is the default.
COMMANDS = (
    Command(
        "record",
        "sample for a while and write a profile (default)",
        arguments.record_arguments,
        _run_record,
    ),
    Command(
        "dump",
        "print the current stack of every vCPU once",
        arguments.dump_arguments,
        _run_dump,
        one_shot=True,
    ),
    Command(
        "report",
        "write any output format from a .qmpcap capture",
        arguments.report_arguments,
        _run_report,
    ),
    Command(
        "top",
        "a live view of the hottest functions and processes",
        arguments.top_arguments,
        _run_top,
    ),
    Command(
        "resume",
        "resume a VM that a qmpprof which was killed left paused",
        arguments.resume_arguments,
        _run_resume,
    ),
    Command(
        "serve",
        "serve each VM's profile over HTTP (GET /debug/pprof/profile?seconds=N, as Go does)",
        arguments.serve_arguments,
        _run_serve,
    ),
)
_COMMANDS_BY_NAME = {command.name: command for command in COMMANDS}


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line, like every other error, instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        _say(f"qmpprof: error: {visible(' '.join(message.split()))} (see {self.prog} --help)")
        sys.exit(EXIT_USAGE)


def _say(line: str) -> None:
    """One line on stderr; a terminal that is gone (SIGHUP) must not turn it into a crash."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
