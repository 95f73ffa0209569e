"""No --kernel: the Linux example guest's kernel read from its own memory, against
oracles nobody here wrote.

Each Debian kernel the tests boot (`fetch.sh --list`: 6.1, 6.12 and 5.10), KASLR on, 2
vCPUs, its RAM in a file (so the test can read it, and corrupt it, as a hostile guest
could); 6.12 on QEMU's `max` CPU, so with 5-level page tables (LA57: what `-cpu host` gives
a guest on a server that has it; its kernel's direct map, slab and stacks lie below
4-level's kernel half), the others on qemu64 and 4-level tables:
- what qmpprof decodes from the guest (guest/linux/from_memory.py over the RAM file) is
  the debug vmlinux's, as binutils reads it: every code symbol at nm's address plus the
  slide the guest itself reports (/proc/kallsyms, printed by init); the ORC rows and
  the BTF layouts the same as from the vmlinux's own sections;
- `qmpprof --qmp-socket S --duration N` with no kernel file says where the kernel came
  from and names kernel frames and processes;
- with no file of the guest's on this host either, its programs' frames are named from
  the symbol tables their files keep in the guest's page cache, as nm names them, their
  stacks unwind (static programs too) as their source calls, and a capture's `report`
  names every frame as the recording did;
- a VMCOREINFO or a kallsyms table corrupted in guest memory: one line, the recording
  goes on without kernel symbols, no frame named, no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import mmap
import random
import re
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.errors import BadGuestKernel
from qmpprof.guest.dwarf_types import read_layout
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.guest.linux.from_memory import NO_BTF, GuestKernel, read_guest_kernel
from qmpprof.model import RegisterSet
from qmpprof.symbols.elf_file import open_elf
from qmpprof.target.paging import PagingMode, PagingState
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from qmpprof.unwind.orc import read_orc
from qmpprof.unwind.rules import RSP, CfaRule
from tests.elf_tools import nm_functions, nm_names_at
from tests.integration.conftest import run_cached
from tests.linux_vm import (
    BUILD,
    LinuxGuest,
    kernel_abis,
    kernel_slide,
    nm_symbols,
    running_linux,
    serial_says,
)

pytestmark = pytest.mark.integration

PAGE = 4096


class GuestRam:
    """The guest's RAM file, mapped writable: QEMU shares it (memory-backend-file,
    share=on), so a write here is the guest's memory changing under it. Below 3 GiB
    (these guests have 256 MiB) a file offset is the physical address."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("r+b")
        self.map = mmap.mmap(self._file.fileno(), 0)

    def read(self, address: int, size: int) -> bytes:
        return self.map[address : address + size]

    def close(self) -> None:
        self.map.close()
        self._file.close()

    @contextlib.contextmanager
    def overwritten(self, address: int, data: bytes) -> Iterator[None]:
        """`data` at `address` while the block runs; the old bytes back afterwards."""
        assert len(data) <= PAGE - address % PAGE, "one page at a time"
        old = self.map[address : address + len(data)]
        self.map[address : address + len(data)] = data
        try:
            yield
        finally:
            self.map[address : address + len(data)] = old


def five_level_abi() -> str:
    """The kernel booted with 5-level page tables: the newest (backports' 6.12)."""
    return kernel_abis()[1]


@pytest.fixture(scope="module", params=kernel_abis())
def linux(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LinuxGuest, GuestRam]]:
    workdir = tmp_path_factory.mktemp("linux-memory")
    ram_file = workdir / "ram"
    cpu = ("--cpu", "max") if request.param == five_level_abi() else ()
    with running_linux(
        workdir, "--memory-backend", str(ram_file), *cpu, abi=request.param
    ) as guest:
        ram = GuestRam(ram_file)
        try:
            yield guest, ram
        finally:
            ram.close()


def from_memory(ram: GuestRam) -> tuple[int, GuestKernel]:
    page, info = vmcoreinfo.find(ram.read, [(0, len(ram.map))])
    return page, read_guest_kernel(info, ram.read)


def test_the_guest_pages_as_its_cpu_lets_it(linux: tuple[LinuxGuest, GuestRam]) -> None:
    """The boot this module relies on: 6.12 on `max` turned on 5-level paging (CR4.LA57)
    on every vCPU, and qemu64 (no LA57) left the others on 4-level."""
    guest, _ = linux
    expected = PagingMode.LONG5 if guest.abi == five_level_abi() else PagingMode.LONG4
    assert [PagingState.from_registers(r).mode for r in asyncio.run(registers(guest))] == [
        expected,
        expected,
    ]


async def registers(guest: LinuxGuest) -> list[RegisterSet]:
    session = await QmpSession.connect(guest.qmp)
    try:
        return parse_all(await session.hmp("info registers -a"))
    finally:
        await session.close()


def test_the_kernel_s_symbols_are_the_vmlinux_s_where_the_guest_says(
    linux: tuple[LinuxGuest, GuestRam],
) -> None:
    guest, ram = linux
    _, kernel = from_memory(ram)
    slide = kernel_slide(guest)  # from the guest's own /proc/kallsyms
    assert kernel.info.kernel_offset == slide
    assert kernel.info.release == guest.abi
    nm = nm_symbols(guest.kernel)
    symbols = list(kernel.module.symbols)
    misnamed = [(s.name, hex(s.address)) for s in symbols if s.address not in nm.get(s.name, ())]
    assert len(symbols) > 40_000
    assert not misnamed, f"{len(misnamed)} of {len(symbols)}: {misnamed[:20]}"
    readelf = subprocess.run(
        ["readelf", "-n", str(guest.kernel)], capture_output=True, text=True, check=True
    )
    assert kernel.info.build_id is not None
    assert f"Build ID: {kernel.info.build_id.hex()}" in readelf.stdout


def test_orc_and_btf_from_memory_are_the_vmlinux_s(linux: tuple[LinuxGuest, GuestRam]) -> None:
    guest, ram = linux
    _, kernel = from_memory(ram)
    ours = kernel.module.orc
    with open_elf(guest.kernel) as elf:
        theirs = read_orc(elf, kernel.module.extent[1])
    assert ours is not None and theirs is not None and len(ours) == len(theirs)
    rng = random.Random(0)
    start, end = kernel.module.extent
    for address in (rng.randrange(start, end) for _ in range(2000)):
        assert ours.row_for(address) == theirs.row_for(address), hex(address)
    structs = {"task_struct", "mm_struct", "vm_area_struct", "file", "module"}
    file_layout = read_layout(guest.kernel, set(), structs)
    assert kernel.types.layout(set(), structs).structs == file_layout.structs


def test_orc_is_mended_where_each_entry_stub_s_call_to_error_entry_returns(
    linux: tuple[LinuxGuest, GuestRam],
) -> None:
    """From 5.19 the entry stubs call error_entry and then move to the stack it returns
    (`mov %rax, %rsp`), every register pushed at RSP; the table says an interrupt frame
    8 bytes up (unwind/orc.py). At each such return address objdump finds in the
    vmlinux, the row from memory is the one after the `mov`; the call itself keeps the
    vmlinux's row (the interrupt frame 8 bytes up), which error_entry's mended rows
    return through while it is still pushing (unwind/orc_mends.py); where the vmlinux's
    own table is kept (5.10's stubs, which error_entry returns to on the task's stack)
    nothing changed."""
    guest, ram = linux
    _, kernel = from_memory(ram)
    mended = kernel.module.orc
    with open_elf(guest.kernel) as elf:
        table = read_orc(elf, kernel.module.extent[1])
    assert mended is not None and table is not None
    returns = error_entry_returns(guest.kernel)
    assert len(returns) > 40  # every interrupt and exception stub
    for address, moves in returns:
        if moves:
            after = mended.row_for(address + 3)
            assert after is not None and after.signal_frame and after.cfa == CfaRule(RSP, 0)
            assert mended.row_for(address) == after
            assert mended.row_for(address - 1) == table.row_for(address - 1) != after
        else:
            assert mended.row_for(address - 1) == table.row_for(address - 1)
    stubs_move = {moves for _, moves in returns}
    assert stubs_move == ({False} if guest.abi.startswith("5.10") else {True})


def error_entry_returns(vmlinux: Path) -> list[tuple[int, bool]]:
    """Each return address of a `call <error_entry>` objdump finds in the vmlinux's
    entry text, and whether a `mov %rax,%rsp` is there."""
    nm = nm_symbols(vmlinux)
    (start,), (stop,) = nm["__entry_text_start"], nm["__entry_text_end"]
    listed = subprocess.run(
        ["objdump", "-d", f"--start-address={start:#x}", f"--stop-address={stop:#x}", str(vmlinux)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    instructions = re.findall(r"^ *([0-9a-f]+):\t[^\t]*\t(.*)$", listed, re.MULTILINE)
    return [
        (int(after, 16), re.fullmatch(r"mov +%rax,%rsp", text.strip()) is not None)
        for (_, call), (after, text) in itertools.pairwise(instructions)
        if re.fullmatch(r"call +[0-9a-f]+ <error_entry>", call.strip())
    ]


def test_a_user_s_command_names_the_kernel_from_memory(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path
) -> None:
    guest, _ = linux
    folded = tmp_path / "out.folded"
    done = run_cached("--qmp-socket", guest.qmp, "--duration", "3", "-o", str(folded))
    assert done.returncode == 0, done.stderr
    assert f"kernel: {guest.abi} (build-id " in done.stdout + done.stderr
    assert "from guest memory" in done.stderr
    stacks = folded.read_text()
    assert "entry_SYSCALL_64" in stacks and "do_syscall_64" in stacks  # sysloop's calls
    assert "sysloop (" in stacks and "crunch (" in stacks  # processes, from BTF's task_struct
    assert "Traceback" not in done.stderr


def test_programs_not_stripped_are_named_from_the_guest_alone(
    linux: tuple[LinuxGuest, GuestRam],
) -> None:
    """No kernel, no sysroot: the workloads (static, not stripped, whole in the
    initramfs's page cache) have every user frame named, each as nm names the address
    in the program's file."""
    guest, _ = linux
    programs = {
        path.name: nm_functions(path)
        for path in BUILD.iterdir()
        if path.name in ("crunch", "crunchnofp", "sysloop", "pinned")
    }
    named = 0
    for _ in range(4):
        done = run_cached("dump", "--json", "--qmp-socket", guest.qmp)
        assert done.returncode == 0, done.stderr
        for vcpu in json.loads(done.stdout)["vcpus"]:
            for number, frame in enumerate(vcpu["frames"]):
                functions = programs.get(frame["module"])
                if functions is None or frame["inlined"]:
                    continue
                address = int(frame["address"], 16)
                truth = nm_names_at(functions, address)
                if number:  # a return address: the call before it may end its function
                    truth |= nm_names_at(functions, address - 1)
                assert frame["function"] in truth if truth else frame["function"] is None, frame
                named += frame["function"] is not None
    assert named, "no frame of the workloads was seen"


#: crunch.c's calls: main -> crunch_loop -> mix, none inlined (noinline), mix a leaf that
#: sets up no frame even where frame pointers are kept (so they alone skip crunch_loop).
CRUNCH_CALLS = ("mix", "crunch_loop", "main")
#: Where glibc starts a thread: the program's entry, or a clone's child (2.36: __clone3).
THREAD_STARTS = {"_start", "__clone3", "__clone", "clone"}


def test_static_programs_unwind_to_where_each_thread_began_from_the_guest_alone(
    linux: tuple[LinuxGuest, GuestRam],
) -> None:
    """No kernel, no sysroot: the workloads are linked -static, so they have no
    .eh_frame_hdr (no PT_GNU_EH_FRAME); their .eh_frame is found through the section
    headers in the guest's page cache. Each user-mode sample of one unwinds to where its
    thread began, ended by the CFI's own end of stack, and crunch's and crunchnofp's
    stacks are the calls their source makes."""
    guest, _ = linux
    seen = 0
    for _ in range(4):
        done = run_cached("dump", "--json", "--qmp-socket", guest.qmp)
        assert done.returncode == 0, done.stderr
        for vcpu in json.loads(done.stdout)["vcpus"]:
            process = (vcpu.get("process") or {}).get("name")
            if vcpu["mode"] != "user" or process not in ("crunch", "crunchnofp", "pinned"):
                continue
            names = [frame["function"] for frame in vcpu["frames"]]
            assert vcpu["stop"] == "end-of-stack" and names[-1] in THREAD_STARTS, vcpu
            if process != "pinned":
                calls = names[: names.index("main") + 1]
                assert tuple(calls) == CRUNCH_CALLS[-len(calls) :], names
            seen += 1
    assert seen, "no user-mode sample of the workloads was seen"


def test_a_capture_reports_the_names_read_from_the_guest(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path
) -> None:
    """`report` has no guest memory: the names the recording read from it come from the
    capture, so its stacks are the recording's own, named alike."""
    guest, _ = linux
    capture, live, replayed = tmp_path / "run.qmpcap", tmp_path / "live", tmp_path / "again"
    done = run_cached(
        "--qmp-socket", guest.qmp, "--duration", "2", "-o", str(capture), "-o", f"{live}.folded"
    )
    assert done.returncode == 0, done.stderr
    done = run_cached("report", str(capture), "-o", f"{replayed}.folded")
    assert done.returncode == 0, done.stderr
    stacks = Path(f"{live}.folded").read_text()
    assert ";main;" in stacks and "0xffffffff" not in stacks  # named from the guest alone
    assert sorted(Path(f"{replayed}.folded").read_text().splitlines()) == sorted(
        stacks.splitlines()
    )


def run_without_kernel(guest: LinuxGuest, tmp_path: Path) -> tuple[str, str]:
    """One short recording without a kernel file: (its stderr, its folded stacks)."""
    folded = tmp_path / "out.folded"
    done = run_cached("--qmp-socket", guest.qmp, "--duration", "1", "-o", str(folded))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr, folded.read_text()


def assert_no_kernel_named(stderr: str, stacks: str) -> None:
    notices = [line for line in stderr.splitlines() if "no --kernel" in line]
    assert len(notices) == 1, stderr
    assert "--kernel VMLINUX" in notices[0]
    assert "do_syscall_64" not in stacks  # nothing named from a table that did not check


def test_a_corrupted_vmcoreinfo_gives_one_line_and_no_kernel_names(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path
) -> None:
    guest, ram = linux
    pages = [page for page in range(0, len(ram.map), PAGE) if _holds_vmcoreinfo(ram, page)]
    assert pages
    with contextlib.ExitStack() as stack:
        for page in pages:  # both copies: the bare text and the ELF note
            # The slide's line made another key (same length: nothing else moves).
            lying = ram.read(page, PAGE).replace(b"KERNELOFFSET=", b"KERNELOFFSET:")
            stack.enter_context(ram.overwritten(page, lying))
        with pytest.raises(BadGuestKernel):  # no other copy anywhere
            print(vmcoreinfo.find(ram.read, [(0, len(ram.map))]))
        stderr, stacks = run_without_kernel(guest, tmp_path)
    assert_no_kernel_named(stderr, stacks)


def _holds_vmcoreinfo(ram: GuestRam, page: int) -> bool:
    head = ram.map[page : page + 24]
    return head.startswith(b"OSRELEASE=") or head[12:24] == b"VMCOREINFO\0\0"


@pytest.mark.parametrize("table", ["kallsyms_num_syms", "kallsyms_token_table"])
def test_a_corrupted_kallsyms_table_gives_one_line_and_no_kernel_names(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path, table: str
) -> None:
    guest, ram = linux
    _, kernel = from_memory(ram)
    named = kernel.info.symbol(table)  # from 6.0; before, the vmlinux says where it is
    (linked,) = nm_symbols(guest.kernel)[table] if named is None else [named]
    where = kernel.info.physical(named or linked + kernel.info.kernel_offset)
    garbage = struct.pack("<I", 0xFFFF_FFFF) if table == "kallsyms_num_syms" else bytes(256)
    with ram.overwritten(where, garbage):
        stderr, stacks = run_without_kernel(guest, tmp_path)
    assert_no_kernel_named(stderr, stacks)
    assert "kallsyms" in stderr


def test_a_kernel_without_btf_says_what_names_its_processes(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path
) -> None:
    """The image's BTF made unreadable (its magic zeroed, as a kernel built without
    CONFIG_DEBUG_INFO_BTF has none): kernel frames are still named, processes are not,
    and the kernel's line says what names them."""
    guest, ram = linux
    _, kernel = from_memory(ram)
    (linked,) = nm_symbols(guest.kernel)["__start_BTF"]
    where = kernel.info.physical(linked + kernel.info.kernel_offset)
    assert ram.read(where, 2) == b"\x9f\xeb"
    with ram.overwritten(where, b"\0\0"):
        stderr, stacks = run_without_kernel(guest, tmp_path)
    assert "from guest memory" in stderr and NO_BTF in stderr, stderr
    assert "do_syscall_64" in stacks  # kallsyms and ORC still name the kernel's frames
    assert "sysloop (" not in stacks


def test_the_vmlinux_given_still_wins(linux: tuple[LinuxGuest, GuestRam], tmp_path: Path) -> None:
    guest, _ = linux
    folded = tmp_path / "out.folded"
    done = run_cached(
        "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), "--duration", "1",
        "-o", str(folded),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "from guest memory" not in done.stderr
    assert "do_syscall_64" in folded.read_text()


def test_a_module_s_symbols_from_memory_are_its_proc_kallsyms(
    linux: tuple[LinuxGuest, GuestRam],
) -> None:
    """crc8.ko, loaded by init, with no .ko file given: its function symbols as the
    guest's own /proc/kallsyms lists them (init prints them on the serial line)."""
    guest, _ = linux
    options = TargetOptions(guest.qmp, None)
    analyzer = build_analyzer(options)

    async def connect() -> None:
        async with connected(options, analyzer, notice=lambda _: None):
            pass

    asyncio.run(connect())
    (crc8,) = [m for m in analyzer.kernel_modules if m.name == "crc8"]
    module = analyzer.kernel_module_files["crc8"]
    ours = {symbol.name: crc8.base + symbol.address for symbol in module.symbols}
    theirs = {words[2]: int(words[0], 16) for words in serial_says(guest, "ksym")}
    functions = {name for name, kind in ((w[2], w[1]) for w in serial_says(guest, "ksym"))
                 if kind in "tT"}  # fmt: skip
    assert functions and {name: ours.get(name) for name in functions} == {
        name: theirs[name] for name in functions
    }
    assert module.orc is not None and len(module.orc) > 0


def test_a_vmlinux_of_another_build_is_refused_by_build_id(
    linux: tuple[LinuxGuest, GuestRam], tmp_path: Path
) -> None:
    """The guest's own vmlinux with one byte of its GNU build-id changed (another build
    of the same source, as far as anyone can tell): its symbols, banner and slide all fit,
    and it is refused, in one line, by the build-id VMCOREINFO names."""
    guest, _ = linux
    readelf = subprocess.run(
        ["readelf", "-n", str(guest.kernel)], capture_output=True, text=True, check=True
    )
    build_id = bytes.fromhex(readelf.stdout.split("Build ID: ", 1)[1].split()[0])
    other = tmp_path / "vmlinux"
    data = bytearray(guest.kernel.read_bytes())
    at = data.find(b"GNU\0" + build_id)
    assert at > 0
    data[at + 4] ^= 0xFF
    other.write_bytes(data)
    done = run_cached("dump", "--qmp-socket", guest.qmp, "--kernel", str(other))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not match the guest: its build-id is" in lines[0]
    assert build_id.hex() in lines[0] and guest.abi in lines[0]
