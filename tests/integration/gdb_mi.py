"""A small GDB/MI driver: GDB attached to QEMU's gdbstub is our oracle for stacks."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

_FRAME = re.compile(r'frame=\{level="(\d+)",addr="(0x[0-9a-f]+)"(?:,func="([^"]*)")?')
_REGISTER_NAME = re.compile(r'"([^"]*)"')
_REGISTER_VALUE = re.compile(r'\{number="(\d+)",value="((?:[^"\\]|\\.)*)"\}')
#: One line of GDB's `x/Ni`: "[=>] 0x… <symbol[+offset]>:<tab>mnemonic[ or tab]operands".
_INSTRUCTION = re.compile(r"^(?:=>)?\s*(0x[0-9a-f]+) <[^>\n]*>:\t(\S+)[ \t]*(.*)$", re.MULTILINE)
#: An instruction as GDB disassembles it: (address, mnemonic, operands).
Instruction = tuple[int, str, str]
#: GDB calls an interrupt frame this instead of naming its function.
SIGNAL_FRAME = "<signal handler called>"
#: Where GDB keeps the indexes of the debug files it read (outside the work tree).
INDEX_CACHE = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof")) / "gdb"
#: (address, function) per frame, leaf first, as qmpprof's JSON gives them.
Frames = list[tuple[int, str | None]]


@dataclass(frozen=True)
class GdbFrame:
    level: int
    address: int
    function: str | None


def without_hidden_inline_leaf(ours: Frames, gdb: list[GdbFrame]) -> Frames:
    """qmpprof lists a call inlined at the leaf when the vCPU stopped at its first
    instruction, as GDB did at most pauses on the example guest (rdtsc in
    timer_account_leaf) but hid at one (the i386 fp guest, one vCPU, in CI); GDB on
    Linux hid some (rcu_read_unlock at aa_file_perm's pc, where the instruction before
    belongs to the caller: GDB's block_starting_point_at; libc's pad_func at a pc of
    __vfprintf_internal). Which of GDB's rules applies is not settled: a leaf inlined
    frame GDB leaves out is not counted against qmpprof, every other frame is. The
    inlined call may bear its caller's own name (6.12: copy_page_to_iter inlined at
    copy_page_to_iter's pc): the frames GDB lists at the leaf (`gdb`, leaf first) must
    be the last ones qmpprof lists there."""
    if not gdb:
        return ours
    leaf = gdb[0].address
    # The leaf's frames only: an interrupt handler may stop at the pc it interrupted
    # (read_hpet in a timer interrupt that came at read_hpet's pc), listed again deeper.
    at_leaf = [name for address, name in takewhile(lambda f: f[0] == leaf, ours)]
    gdb_at_leaf = [f.function for f in takewhile(lambda f: f.address == leaf, gdb)]
    hidden = len(at_leaf) - len(gdb_at_leaf)
    if hidden <= 0 or _unclone(at_leaf[hidden:]) != _unclone(gdb_at_leaf):
        return ours
    return ours[hidden:]


def _unclone(names: list[str | None]) -> list[str | None]:
    """Names with GCC's clone suffixes dropped (`el0_svc_common.constprop.0` is the
    symbol of GDB's `el0_svc_common`)."""
    return [GCC_CLONE.sub("", name) if name else name for name in names]


def instructions_in(text: str) -> list[Instruction]:
    """The instructions in the text of GDB's `x/Ni` (as `gdb -batch` prints it)."""
    return [
        (int(address, 16), op, args.strip()) for address, op, args in _INSTRUCTION.findall(text)
    ]


def agree(gdb: list[GdbFrame], ours: Frames) -> bool:
    """Same addresses frame for frame, and the same function wherever GDB names one
    (GDB calls an interrupt frame '<signal handler called>' instead of its function)."""
    if [f.address for f in gdb] != [address for address, _ in ours]:
        return False
    return all(
        f.function == name
        for f, (_, name) in zip(gdb, ours, strict=True)
        if f.function not in (SIGNAL_FRAME, None)
    )


class GdbMi:
    """GDB in MI mode, attached to a gdbstub; every read has a timeout."""

    def __init__(
        self,
        elf: Path,
        gdb_socket: str,
        timeout: float = 30.0,
        offset: int = 0,
        architecture: str | None = None,
    ) -> None:
        """`offset`: where `elf` runs less where it is linked (a kernel's KASLR slide).
        `architecture`: another than the host's (gdb-multiarch, `set architecture`)."""
        self.timeout = timeout
        self._process = subprocess.Popen(
            ["gdb-multiarch" if architecture else "gdb", "--interpreter=mi3", "-nx", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.command("-gdb-set mi-async on")
        self.command("-gdb-set confirm off")
        # GDB indexes a 600 MB vmlinux's DWARF on its first lookup (28 s of CPU here, in
        # each of make test's GDB sessions on a Linux guest); its index cache keeps the
        # index, by build-id, for the next session and the next run (1 s then).
        self.command(f"-gdb-set index-cache directory {INDEX_CACHE}")
        self.command("-gdb-set index-cache enabled on")
        if architecture:
            self.command(f"-gdb-set architecture {architecture}")
        if offset:
            self.command(f"-file-exec-file {elf}")
            self.console(f"symbol-file -o {offset:#x} {elf}")
        else:
            self.command(f"-file-exec-and-symbols {elf}")
        self.command(f"-target-select remote {gdb_socket}", done="^connected")

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))

    def command(self, text: str, done: str = "^done") -> list[str]:
        """Send one MI command and return the output up to its result record."""
        assert self._process.stdin is not None
        self._process.stdin.write(text + "\n")
        self._process.stdin.flush()
        return self.wait_for(done, "^error")

    def wait_for(self, *prefixes: str) -> list[str]:
        seen = []
        while True:
            line = self._lines.get(timeout=self.timeout)
            seen.append(line)
            if line.startswith("^error"):
                raise RuntimeError(f"GDB error: {line}")
            if line.startswith(prefixes):
                return seen

    def resume(self) -> None:
        self.command("-exec-continue", done="^running")

    def interrupt(self) -> None:
        self.command("-exec-interrupt")
        self.wait_for("*stopped")

    def frames(self, thread: int = 1) -> list[GdbFrame]:
        """The stack of one thread (a vCPU, counted from 1), leaf first."""
        output = self.command(f"-stack-list-frames --thread {thread}")
        return [
            GdbFrame(int(level), int(address, 16), function or None)
            for line in output
            for level, address, function in _FRAME.findall(line)
        ]

    def console(self, command: str) -> list[str]:
        """A CLI command through MI (quotes in `command` must be escaped by the caller)."""
        return self.command(f'-interpreter-exec console "{command}"')

    def instructions(self, start: str, count: int) -> list[Instruction]:
        """GDB's disassembly of `count` instructions from `start` (a symbol, an address):
        the console stream's lines (`~"…\\t…\\n"`), their escapes undone."""
        lines = self.console(f"x/{count}i {start}")
        text = "".join(
            line[2:-1].encode().decode("unicode_escape") for line in lines if line.startswith('~"')
        )
        return instructions_in(text)

    def evaluate(self, expression: str, thread: int) -> str | None:
        """The value of `expression` in `thread`, as GDB prints it; None on error."""
        try:
            output = self.command(f"-data-evaluate-expression --thread {thread} {expression}")
        except RuntimeError:
            return None
        done = next(line for line in output if line.startswith("^done"))
        return done.split('value="', 1)[1].rsplit('"', 1)[0]

    def tail_call_levels(self, thread: int) -> set[int]:
        """The levels of `thread`'s backtrace that GDB made up from DWARF call-site
        information for a function that jumped to its callee (a tail call): no return
        address on the stack says it was there."""
        return self._levels_of_type(thread, "TAILCALL_FRAME")

    def inline_levels(self, thread: int) -> set[int]:
        """The levels of `thread`'s backtrace that are calls inlined into the frame above
        them (the same pc: one function's code on the stack)."""
        return self._levels_of_type(thread, "INLINE_FRAME")

    def _levels_of_type(self, thread: int, kind: str) -> set[int]:
        self.command(f"-thread-select {thread}")
        frames = "accumulate(range(1000), lambda f, _: f and f.older(), initial=gdb.newest_frame())"
        output = self.console(
            f"python from itertools import accumulate; print('levels', [i for i, f in "
            f"enumerate({frames}) if f and f.type() == gdb.{kind}])"
        )
        text = "".join(line[2:-1] for line in output if line.startswith("~"))
        found = re.search(r"levels \[([0-9, ]*)\]", text)
        return {int(n) for n in found.group(1).split(",") if n.strip()} if found else set()

    def registers(self, thread: int) -> dict[str, str]:
        """Every register of `thread` that has a name, as GDB prints it in hex."""
        names = _REGISTER_NAME.findall(
            next(line for line in self.command("-data-list-register-names") if "^done" in line)
        )
        output = self.command(f"-data-list-register-values --thread {thread} x")
        done = next(line for line in output if line.startswith("^done"))
        return {
            names[int(number)]: value
            for number, value in _REGISTER_VALUE.findall(done)
            if int(number) < len(names) and names[int(number)]
        }

    def read_memory(self, address: int, size: int) -> bytes:
        """`size` bytes of guest memory at `address`, as the current thread's vCPU sees it."""
        output = self.command(f"-data-read-memory-bytes {address:#x} {size}")
        done = next(line for line in output if line.startswith("^done"))
        found = re.search(r'contents="([0-9a-f]*)"', done)
        data = bytes.fromhex(found.group(1)) if found else b""
        assert len(data) == size, f"GDB read {len(data)} of {size} bytes at {address:#x}"
        return data

    def set_register(self, thread: int, name: str, value: int) -> None:
        self.command(f"-data-evaluate-expression --thread {thread} ${name}={value:#x}")

    def write_register(self, thread: int, name: str, value: int) -> None:
        """set_register for a register GDB gives fields (x86's cr3: `$cr3 = N` is an
        invalid cast): written by its number, as a whole."""
        names = _REGISTER_NAME.findall(
            next(line for line in self.command("-data-list-register-names") if "^done" in line)
        )
        number = names.index(name)
        self.command(f"-data-write-register-values --thread {thread} x {number} {value:#x}")

    @contextmanager
    def symbols_from(self, elf: Path) -> Iterator[None]:
        """`elf`'s symbols (at its link addresses) loaded for the duration of the block."""
        elf = elf.resolve()  # GDB removes a file by the path it resolved when adding it
        self.console(f"add-symbol-file {elf}")
        try:
            yield
        finally:
            self.console(f"remove-symbol-file {elf}")

    def add_module(self, elf: Path, sections: dict[str, int]) -> None:
        """A kernel module's symbols and CFI, each of its sections where the guest put it
        (what /sys/module/NAME/sections says); the sections `elf` lacks are skipped."""
        names = set(re.findall(r"\] (\S+)", self._section_headers(elf)))
        placed = " ".join(
            f"-s {name} {at:#x}" for name, at in sections.items() if name in names - {".text"}
        )
        self.console(f"add-symbol-file {elf} {sections['.text']:#x} {placed}")

    @staticmethod
    def _section_headers(elf: Path) -> str:
        done = subprocess.run(["readelf", "-SW", str(elf)], capture_output=True, text=True)
        return done.stdout

    def detach(self) -> None:
        """Let the VM run without GDB: while GDB is attached to a running VM, qmpprof's
        `stop` reaches GDB as a stop, and GDB's answer pauses the VM again (README)."""
        self.command("-target-detach")

    def close(self) -> None:
        """Quit GDB; detaching lets the VM run again."""
        try:
            self.command("-target-detach")
            self.command("-gdb-exit", done="^exit")
        except (RuntimeError, queue.Empty, BrokenPipeError):
            pass
        finally:
            self._process.kill()
            self._process.wait(timeout=10)


def text_aliases(*elfs: Path) -> dict[str, str]:
    """Each code symbol of `elfs` (files of one address space: a library and its debug
    file) -> one name for all the symbols at its address, dynamic ones included: GDB
    names glibc's `clone3` (weak) where qmpprof names `__clone3` (global), the same
    function; a stripped libc's .dynsym names 0xa2d70 `memcpy` (GLIBC_2.2.5, in no other
    table) where its debug file names `__memcpy_sse2_unaligned`."""
    by_address = defaultdict(list)
    for elf in elfs:
        for table in ([], ["-D"]):
            nm = subprocess.run(
                ["nm", *table, str(elf)], capture_output=True, text=True, check=True
            )
            for parts in (line.split() for line in nm.stdout.splitlines()):
                if len(parts) == 3 and parts[1] in "TtWw":
                    by_address[parts[0]].append(parts[2].split("@", 1)[0])
    return {name: min(names) for names in by_address.values() for name in names}


# GCC's clones and split-off parts (`fsnotify_perm.part.0`, `foo.constprop.0.isra.0`,
# `foo.cold`) keep their own symbol, which qmpprof and perf print; GDB prints the
# function's DWARF name (`fsnotify_perm`) when the frame has inline or scope info. Both
# name the same source function.
GCC_CLONE = re.compile(r"(?:\.(?:part|isra|constprop|cold|lto_priv|localalias)(?:\.\d+)?)+$")


def same_function(name: str | None, aliases: dict[str, str]) -> str | None:
    """`name` as both sides of a comparison spell it: one name per address (`aliases`,
    from text_aliases), GCC's clone suffixes and symbol versions (`@@GLIBC_2.34`: nm
    lists them, the dynamic symbol table names the symbol without) dropped."""
    if not name or name.endswith("@plt"):  # a PLT stub's name: no alias, no version
        return name
    return GCC_CLONE.sub("", aliases.get(name, name)).split("@", 1)[0]
