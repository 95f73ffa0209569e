"""GDB as the oracle for a dynamically linked Linux process: the files of its memory map
(the PIE, ld.so, libc, our library), taken from a sysroot and loaded into GDB where the
guest's /proc/PID/maps says the process has them, and GDB's backtrace of a vCPU running
it in user mode.

The maps come from the guest's init ("qmpprof-linux: maps PID LINE" on the serial port,
examples/linux/init.c), read once the program is loaded, before it runs main's code.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.constants import P_FLAGS
from elftools.elf.elffile import ELFFile

from tests.integration.gdb_mi import GdbFrame, GdbMi

PAGE = 4096
_MAPS = re.compile(
    r"qmpprof-linux: maps (\d+) ([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) \S+ \d+[ \t]*([^\r\n]*)"
)
_STARTED = re.compile(r"qmpprof-linux: started (\S+) pid (\d+)")


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    permissions: str  # "r-xp"
    offset: int  # in the file
    path: str  # "" for an anonymous mapping, "[stack]" and the like for the kernel's

    @property
    def executable_file(self) -> bool:
        return "x" in self.permissions and self.path.startswith("/")

    def __contains__(self, address: int) -> bool:
        return self.start <= address < self.end


def started_pids(serial: str) -> dict[str, int]:
    """Each workload's pid, as init said it ("qmpprof-linux: started NAME pid N")."""
    return {name: int(pid) for name, pid in _STARTED.findall(serial)}


def process_maps(serial: str, pid: int) -> list[Mapping]:
    """The maps init said for `pid`, in its order (by address)."""
    return [
        Mapping(int(start, 16), int(end, 16), permissions, int(offset, 16), path.strip())
        for number, start, end, permissions, offset, path in _MAPS.findall(serial)
        if int(number) == pid
    ]


def load_bias(elf: Path, mapping: Mapping) -> int:
    """What to add to `elf`'s link addresses to get the addresses `mapping` puts them at
    (GDB's add-symbol-file -o): the mapping maps file offset `mapping.offset` of the
    PT_LOAD segment that holds it (an executable mapping: the PF_X one), and that
    segment's page is at its link address rounded down to a page. 0 for a non-PIE
    program at its link address; the random base for a PIE or a library."""
    executable = "x" in mapping.permissions
    with elf.open("rb") as file:
        for segment in ELFFile(file).iter_segments("PT_LOAD"):
            page_offset = segment["p_offset"] - segment["p_offset"] % PAGE
            if not page_offset <= mapping.offset < segment["p_offset"] + segment["p_filesz"]:
                continue
            if bool(segment["p_flags"] & P_FLAGS.PF_X) != executable:
                continue
            page_address = segment["p_vaddr"] - segment["p_vaddr"] % PAGE
            return mapping.start - (page_address + mapping.offset - page_offset)
    raise AssertionError(f"no PT_LOAD of {elf} holds offset {mapping.offset:#x}")


@dataclass(frozen=True)
class LoadedFile:
    guest_path: str
    host_path: Path  # sysroot / guest_path
    bias: int


def files_to_load(maps: list[Mapping], sysroot: Path) -> list[LoadedFile]:
    """Each file the process maps executable that the sysroot has, with its bias (the
    same for every executable mapping of one file, or the maps are not one load)."""
    loaded: dict[str, LoadedFile] = {}
    for mapping in filter(lambda m: m.executable_file, maps):
        host = sysroot / mapping.path.lstrip("/")
        if not host.is_file():
            continue
        file = LoadedFile(mapping.path, host, load_bias(host, mapping))
        assert loaded.setdefault(mapping.path, file) == file, f"{mapping.path}: two biases"
    return list(loaded.values())


@contextmanager
def user_symbols(gdb: GdbMi, maps: list[Mapping], sysroot: Path) -> Iterator[list[LoadedFile]]:
    """The process's files from `sysroot` loaded into GDB at the addresses `maps` gives
    them (add-symbol-file FILE -o BIAS), for the duration of the block. GDB's sysroot is
    set to `sysroot` and its debug-file-directory to `sysroot`/usr/lib/debug, where it
    finds libc's separate debug file by build-id (libc6-dbg's .build-id/xx/yyyy.debug)."""
    gdb.console(f"set sysroot {sysroot}")
    gdb.console(f"set debug-file-directory {sysroot / 'usr/lib/debug'}")
    files = files_to_load(maps, sysroot)
    added = []
    try:
        for file in files:
            gdb.console(f"add-symbol-file {file.host_path} -o {file.bias:#x}")
            added.append(file)
        yield files
    finally:
        for file in added:  # by the path GDB resolved when adding it
            gdb.console(f"remove-symbol-file {file.host_path.resolve()}")


def guest_bytes(gdb: GdbMi, thread: int, address: int, count: int) -> bytes:
    """`count` bytes of guest memory at `address`, as vCPU `thread` sees it (its page
    tables: a user address is the process's that the vCPU runs)."""
    output = gdb.command(f"-data-read-memory-bytes --thread {thread} {address:#x} {count}")
    done = next(line for line in output if line.startswith("^done"))
    contents = re.search(r'contents="([0-9a-f]*)"', done)
    assert contents is not None, done
    return bytes.fromhex(contents.group(1))


def loaded_user_frames(gdb: GdbMi, thread: int) -> list[GdbFrame]:
    """GDB's backtrace of vCPU `thread` (counted from 1), leaf first, with the user
    symbols already loaded (user_symbols), past main, without the frames GDB makes up
    from DWARF call-site information for tail calls (qsort jumps to __qsort_r: no return
    address on the stack says qsort was there, no unwinder can list it)."""
    gdb.console("set backtrace past-main on")
    made_up = gdb.tail_call_levels(thread)
    return [f for f in gdb.frames(thread) if f.level not in made_up]


def gdb_user_frames(gdb: GdbMi, thread: int, maps: list[Mapping], sysroot: Path) -> list[GdbFrame]:
    """GDB's user-space backtrace of vCPU `thread` (counted from 1), leaf first, as
    (level, pc, function) frames: the oracle for qmpprof's user stacks of a dynamically
    linked process.

    Call it with GDB attached to the gdbstub, the VM stopped, and that vCPU running the
    process whose /proc/PID/maps is `maps` (process_maps), in user mode ($cs & 3 == 3).
    Every file the process maps executable is taken from `sysroot` (sysroot/<guest
    path>: the PIE, ld.so, libc.so.6, libqmpwork.so.1; mappings of files the sysroot
    lacks, and the vDSO, stay without symbols) and loaded at its mapping's bias (see
    load_bias); libc's function names and CFI come with its separate debug file from
    `sysroot`/usr/lib/debug/.build-id. The symbols are unloaded again before it returns
    (many pauses in a row: hold user_symbols around them and call loaded_user_frames).
    GDB goes on past main (__libc_start_call_main, __libc_start_main_impl, _start);
    frames GDB makes up for tail calls are left out; inlined calls are listed as GDB
    lists them (one frame per inlined call, at the pc of the frame holding it)."""
    with user_symbols(gdb, maps, sysroot):
        return loaded_user_frames(gdb, thread)
