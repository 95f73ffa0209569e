"""The Linux example guest's dynamically linked PIE workload, dynwork (issue 16's test
bench): it runs with its PIE base and its libraries (Debian's ld.so and libc, our
libqmpwork.so.1) where ASLR put them, the host's sysroot holds the very bytes the guest
mapped there, and GDB, given those files at those addresses (linux_user_gdb), unwinds
its user stacks through libc: compare_keys <- qsort's code <- dyn_sort <- dyn_loop <-
main <- __libc_start_call_main (glibc 2.34 on; bullseye's 2.31, which a 5.10 guest runs:
__libc_start_main).

The guest runs dynwork alone (boot.sh --workloads dynwork) on 2 vCPUs, KASLR off (GDB
has the vmlinux; ASLR in user space stays on). The pauses are drawn from a fixed seed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tests.guest_vm import qmp_call
from tests.integration.conftest import run_cached
from tests.integration.gdb_mi import (
    Frames,
    GdbFrame,
    GdbMi,
    agree,
    same_function,
    text_aliases,
    without_hidden_inline_leaf,
)
from tests.integration.linux_user_gdb import (
    PAGE,
    Mapping,
    files_to_load,
    guest_bytes,
    load_bias,
    loaded_user_frames,
    process_maps,
    started_pids,
    user_symbols,
)
from tests.linux_vm import LinuxGuest, guest_sysroot, kernel_abis, mapped_path, running_linux
from tests.seeds import seeded

VCPUS = 2
PROGRAM = "/bin/dynwork"
LIBRARIES = (
    "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libqmpwork.so.1",
)
#: Where libc's start code calls main: glibc 2.34 on, and before.
START_CALLERS = ("__libc_start_call_main", "__libc_start_main")
#: Pauses at most, looking for dynwork in user code (one vCPU runs it, the other idles).
MAX_PAUSES = 40
#: dynwork's samples to see before stopping early, once one went through qsort.
ENOUGH_SAMPLES = 12


@dataclass
class Run:
    """What the pauses found: GDB's stacks of dynwork and what its memory held."""

    guest: LinuxGuest
    maps: list[Mapping]
    pauses: int = 0
    stacks: list[list[GdbFrame]] = field(default_factory=list)
    first_pages: dict[str, bytes] = field(default_factory=dict)  # guest path -> bytes
    #: qmpprof's frames of the same vCPU at each of those pauses (dump --sysroot).
    ours: list[Frames] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{self.guest.abi}: {len(self.stacks)} dynwork stacks in {self.pauses} pauses"]
        for stack in self.stacks:
            lines.append("  " + " <- ".join(f.function or hex(f.address) for f in stack))
        return "\n".join(lines)


def executable(maps: list[Mapping], path: str, sysroot: Path | None = None) -> Mapping:
    path = mapped_path(sysroot, path) if sysroot is not None else path
    found = [m for m in maps if m.path == path and "x" in m.permissions]
    assert len(found) == 1, f"{path}: {found}"
    return found[0]


def user_code_thread(gdb: GdbMi, maps: list[Mapping]) -> int | None:
    """The vCPU (counted from 1) in user mode at a pc of one of dynwork's files."""
    files = [m for m in maps if m.executable_file]
    for thread in range(1, VCPUS + 1):
        cs, pc = (gdb.evaluate(register, thread) for register in ("$cs", "(long)$pc"))
        if cs is None or pc is None or int(cs, 0) & 3 != 3:
            continue
        if any(int(pc, 0) & (1 << 64) - 1 in m for m in files):
            return thread
    return None


def through_qsort(stack: list[GdbFrame], maps: list[Mapping], sysroot: Path) -> bool:
    """compare_keys, then only libc frames (qsort's merge sort) up to dyn_sort, then
    dyn_loop, main and libc's start code, every frame named."""
    names = [f.function for f in stack]
    if None in names or "compare_keys" not in names or "dyn_sort" not in names:
        return False
    libc = executable(maps, "/lib/x86_64-linux-gnu/libc.so.6", sysroot)
    callback, caller = names.index("compare_keys"), names.index("dyn_sort")
    in_libc = stack[callback + 1 : caller]
    return (
        bool(in_libc)
        and all(f.address in libc for f in in_libc)
        and "qsort" in str(in_libc[-1].function)  # __qsort_r: qsort jumps to it
        and names[caller : caller + 3] == ["dyn_sort", "dyn_loop", "main"]
        and len(names) > caller + 3
        and names[caller + 3] in START_CALLERS
    )


def qmpprof_frames(guest: LinuxGuest, sysroot: Path) -> dict[int, Frames]:
    """`qmpprof dump --json --sysroot` of the paused guest: each vCPU's (pc, function)
    frames, inlined calls included; the VM stays paused."""
    done = run_cached(
        "dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel),
        "--sysroot", str(sysroot),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    status = qmp_call(guest.qmp, "query-status")
    assert isinstance(status, dict) and status["status"] == "paused", "qmpprof resumed it"
    return {
        int(vcpu["vcpu"]): [(int(f["address"], 16), f["function"]) for f in vcpu["frames"]]
        for vcpu in json.loads(done.stdout)["vcpus"]
    }


def pause(gdb: GdbMi, rng_name: str) -> Iterator[None]:
    rng = seeded(rng_name)
    for _ in range(MAX_PAUSES):
        gdb.resume()
        time.sleep(rng.uniform(0.001, 0.05))  # chooses where to pause; not a synchronisation
        gdb.interrupt()
        yield


def observe(guest: LinuxGuest, gdb: GdbMi, sysroot: Path) -> Run:
    serial = Path(guest.serial).read_text(errors="replace")
    run = Run(guest, process_maps(serial, started_pids(serial)["dynwork"]))
    with user_symbols(gdb, run.maps, sysroot) as files:
        for _ in pause(gdb, f"linux dynamic {guest.abi}"):
            run.pauses += 1
            thread = user_code_thread(gdb, run.maps)
            if thread is None:
                continue
            run.stacks.append(loaded_user_frames(gdb, thread))
            run.ours.append(qmpprof_frames(guest, sysroot)[thread - 1])
            if not run.first_pages:
                for file in files:
                    first = next(m for m in run.maps if m.path == file.guest_path and m.offset == 0)
                    run.first_pages[file.guest_path] = guest_bytes(gdb, thread, first.start, PAGE)
            seen = any(through_qsort(stack, run.maps, sysroot) for stack in run.stacks)
            if seen and len(run.stacks) >= ENOUGH_SAMPLES:
                break
    print(run.table())
    return run


@pytest.fixture(scope="module", params=kernel_abis())
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    workdir = tmp_path_factory.mktemp("linux-dynamic")
    gdb_socket = str(workdir / "gdb.sock")
    boot = ("--nokaslr", "--smp", str(VCPUS), "--gdb", gdb_socket, "--workloads", "dynwork")
    with running_linux(workdir, *boot, abi=request.param) as guest:
        gdb = GdbMi(guest.kernel, gdb_socket)
        try:
            return observe(guest, gdb, guest_sysroot(guest))
        finally:
            gdb.close()


def test_dynwork_is_a_pie_at_a_random_base_with_its_libraries_mapped(run: Run) -> None:
    """The PIE's base is not its link address 0, and every library has an executable
    mapping, all at page-aligned biases in the kernel's mmap area."""
    sysroot = guest_sysroot(run.guest)
    program = executable(run.maps, PROGRAM)
    base = load_bias(sysroot / PROGRAM.lstrip("/"), program)
    assert base != 0 and base % PAGE == 0, hex(base)
    for library in LIBRARIES:
        bias = load_bias(sysroot / library.lstrip("/"), executable(run.maps, library, sysroot))
        assert bias % PAGE == 0 and bias > base, (library, hex(bias))
    libraries = {mapped_path(sysroot, library) for library in LIBRARIES}
    assert {f.guest_path for f in files_to_load(run.maps, sysroot)} == {PROGRAM, *libraries}


def test_the_sysroot_holds_the_bytes_the_guest_mapped(run: Run) -> None:
    """Each file's first page, read from guest memory where the maps put it (its ELF
    header, program headers and build-id note), is the sysroot file's first page: the
    maps are true and the sysroot's libc is the guest's."""
    assert run.first_pages, run.table()
    for guest_path, page in run.first_pages.items():
        expected = (guest_sysroot(run.guest) / guest_path.lstrip("/")).read_bytes()[:PAGE]
        assert page[: len(expected)] == expected, guest_path


def test_gdb_unwinds_dynwork_through_libc(run: Run) -> None:
    """At least one stack goes user -> libc -> user with every frame named, the oracle
    issue 16's comparisons need; every stack ends in libc's start code."""
    assert run.stacks, run.table()
    sysroot = guest_sysroot(run.guest)
    assert any(through_qsort(stack, run.maps, sysroot) for stack in run.stacks), run.table()
    for stack in run.stacks:
        assert set(START_CALLERS) & {f.function for f in stack}, run.table()


def sysroot_aliases(sysroot: Path, maps: list[Mapping]) -> dict[str, str]:
    """One name per address over every file loaded and every separate debug file (a
    stripped libc's symbols are in its debug file only)."""
    aliases: dict[str, str] = {}
    debug_files = sorted((sysroot / "usr/lib/debug/.build-id").glob("*/*.debug"))
    for path in [*(f.host_path for f in files_to_load(maps, sysroot)), *debug_files]:
        aliases.update(text_aliases(path))
    return aliases


def disagreements(run: Run) -> list[str]:
    aliases = sysroot_aliases(guest_sysroot(run.guest), run.maps)
    found = []
    for gdb, ours in zip(run.stacks, run.ours, strict=True):
        theirs = [replace(f, function=same_function(f.function, aliases)) for f in gdb]
        mine = [(address, same_function(name, aliases)) for address, name in ours]
        mine = without_hidden_inline_leaf(mine, theirs)
        if not agree(theirs, mine):
            found.append(f"gdb:     {[(hex(f.address), f.function) for f in theirs]}\n"
                         f"qmpprof: {[(hex(a), n) for a, n in mine]}")  # fmt: skip
    return found


def test_qmpprof_agrees_with_gdb_on_dynworks_user_stacks(run: Run) -> None:
    """Issue 16's acceptance: with --sysroot, qmpprof's user stacks of a PIE in libc and
    a shared library are GDB's frame for frame, libc frames and their inlined calls
    included (names compared up to aliases at one address and GCC's clone suffixes)."""
    assert run.stacks, run.table()
    wrong = disagreements(run)
    assert not wrong, "\n".join([run.table(), f"{len(wrong)} of {len(run.stacks)}:", *wrong])
