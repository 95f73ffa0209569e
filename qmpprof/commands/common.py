"""What the commands share before any QEMU is involved: the target options and the
guest's binaries loaded into an Analyzer (no asyncio here: `report` runs offline)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.defaults import DEFAULT_MAX_DEPTH, DEFAULT_STACK_BYTES
from qmpprof.errors import BadElf
from qmpprof.guest.adapter import GenericAdapter, OsAdapter
from qmpprof.guest.kernel_types import ElfTypes
from qmpprof.model import FileMapping
from qmpprof.modules import load_module, load_user_modules
from qmpprof.symbols.debuginfod import Debuginfod
from qmpprof.unwind.unwinder import Strategy
from qmpprof.user_files import UserFiles
from qmpprof.visible import visible


@dataclass(frozen=True)
class TargetOptions:
    """How to reach the guest, which binaries it runs and what to read from it."""

    qmp_socket: str
    kernel: Path | None
    user_dirs: tuple[Path, ...] = ()
    user_files: tuple[Path, ...] = ()
    #: The guest's root file tree on this host (--sysroot).
    sysroot: Path | None = None
    #: Where a Linux guest's kernel modules' .ko files are (DIR/NAME.ko).
    module_dirs: tuple[Path, ...] = ()
    memory: str = "auto"
    mem_path: str | None = None
    stack_bytes: int = DEFAULT_STACK_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    unwind: Strategy = Strategy.AUTO
    cpus: tuple[int, ...] = field(default=())
    #: Unwind while the VM is paused even where its RAM is read on this host.
    unwind_paused: bool = False
    #: debuginfod servers (--debuginfod), else DEBUGINFOD_URLS's.
    debuginfod: tuple[str, ...] = ()
    #: A libvirt domain to reach through virt-qemu-qmp-proxy (--libvirt; qmp_socket is
    #: then where that proxy listens), and libvirt's connection URI (--libvirt-uri).
    libvirt: str | None = None
    libvirt_uri: str | None = None
    #: QEMU's process id when the socket's peer is not QEMU (--pid), checked.
    qemu_pid: int | None = None
    #: How long to wait for the monitor's greeting (--connect-timeout); None: 5 s for a
    #: QMP socket, 30 s through libvirt.
    connect_timeout: float | None = None


def build_analyzer(options: TargetOptions) -> Analyzer:
    """Load the guest's binaries (raises BadElf) and make the analyzer that uses them."""
    kernel = load_module(options.kernel) if options.kernel is not None else None
    users = load_user_modules(list(options.user_dirs), list(options.user_files))
    for directory in (*options.module_dirs, *([options.sysroot] if options.sysroot else [])):
        if not directory.is_dir():
            raise BadElf(str(directory), "not a directory")
    servers = debuginfod_client(options)
    files = UserFiles(options.sysroot, options.user_dirs, options.user_files, servers)
    adapter = _adapter(options.kernel)
    types = ElfTypes(options.kernel) if options.kernel is not None else None
    return Analyzer(
        kernel, users, adapter, options.unwind, options.max_depth, files=files, kernel_types=types
    )


def debuginfod_client(options: TargetOptions) -> Debuginfod | None:
    """The debuginfod servers to ask (--debuginfod, else DEBUGINFOD_URLS), telling on
    stderr what they lack and how far a large download is; None without any."""
    return Debuginfod.from_environment(
        options.debuginfod, progress=DownloadProgress(say_on_stderr), notice=say_on_stderr
    )


class DownloadProgress:
    """One line on stderr per tenth of a large download (a vmlinux's debug file is
    600 MB): `debuginfod: 120 of 640 MB`."""

    LARGE = 16 << 20

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._shown = -1

    def __call__(self, done: int, total: int | None) -> None:
        if total is None or total < self.LARGE:
            return
        tenth = done * 10 // total
        if tenth != self._shown:
            self._shown = tenth
            self._say(f"debuginfod: {done >> 20} of {total >> 20} MB")


def cfi_problems(analyzer: Analyzer, compile_all: bool) -> list[str]:
    """One line per module with functions whose CFI could not be compiled; `compile_all`
    checks every function (seconds for a large binary), else only those samples reached."""
    lines = []
    for module in analyzer.modules:
        if uncompiled := module.cfi.uncompiled(compile_all):
            lines.append(f"{module.symbols.name}: {uncompiled.summary()}")
    return lines


def module_files(analyzer: Analyzer) -> dict[str, tuple[Path, int]]:
    """The ELF file and load bias of each module, by the name frames carry (the file
    name)."""
    return {m.symbols.name: (m.path, analyzer.biases.get(m.name, 0)) for m in analyzer.modules}


def mapped_sources(analyzer: Analyzer) -> Callable[[FileMapping], tuple[Path, int] | None]:
    """For a file a process map placed: the host file with its DWARF (the separate debug
    file if any) and its bias in that process, or None without a usable host copy."""

    def where(mapping: FileMapping) -> tuple[Path, int] | None:
        module = analyzer.files.module_for(mapping)
        bias = module.bias_in(mapping) if module is not None else None
        if module is None or bias is None:
            return None
        return module.debug_path or module.path, bias

    return where


def _adapter(kernel: Path | None) -> OsAdapter:
    """The OS adapter the kernel ELF calls for; the generic one when none applies."""
    if kernel is None:
        return GenericAdapter()
    from qmpprof.guest.registry import choose_adapter  # every adapter: only for an ELF

    return choose_adapter(kernel)


def file_problems(analyzer: Analyzer) -> list[str]:
    """One line per guest file whose host copy was found but not used (another build),
    or could not be read."""
    files = analyzer.files
    lines = [
        f"{visible(path)}: not used: {visible(m.describe())}"
        for path, m in sorted(files.mismatches.items())
    ]
    lines += [
        f"{visible(str(path))}: unreadable: {visible(why)}"
        for path, why in files.unreadable.items()
    ]
    return lines


def say_on_stderr(line: str) -> None:
    print(f"qmpprof: {line}", file=sys.stderr, flush=True)
