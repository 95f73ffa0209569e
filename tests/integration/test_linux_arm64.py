"""qmpprof against Debian's arm64 Linux (examples/linux/aarch64: the 6.1 cloud kernel, KASLR
on, 2 vCPUs, the x86 guest's workloads cross-built) **with no files at all**, GDB the oracle.

With GDB holding the guest stopped at seeded random points, `qmpprof dump --json` (no
--kernel, no --user, no debuginfod) must give each vCPU:
- the class GDB's stub gives it: idle where its thread list says halted, else kernel at
  EL1 and user at EL0 (CPSR's M[3:2]);
- the task: its thread id is CONTEXTIDR_EL1 (Debian's kernels keep the running task's
  pid there, CONFIG_PID_IN_CONTEXTIDR; 0, the idle task), its name the program init
  said it started with that pid;
- the frames GDB lists (gdb-multiarch given the -dbg vmlinux at the slide the guest's
  /proc/kallsyms says, and a static program's own ELF), frame for frame: the same
  addresses and, where GDB names one, the same function (GCC's clone suffixes aside;
  the vmlinux's inlined calls, which kallsyms cannot know, collapsed into their
  caller). dynwork's PIE and libraries are given to GDB where its /proc/PID/maps (init
  prints them) put them, libc with libc6-dbg's debug file: a frame in one of libc's own
  functions, which its stripped file cannot name, is judged by its address. Judging
  stops after the first frame of the exception entry code (GDB has no CFI there and
  guesses on) and at the first frame GDB cannot name: frames beyond where GDB stops
  count as agreeing.

Three boots: `-cpu max,pauth=off` with four busy programs on the 2 vCPUs, the same with
one program and a sleeper (idle vCPUs), and `-cpu max`, where the kernel and the
workloads sign their return addresses: QEMU 7.2 does not tell GDB about pointer
authentication, so GDB stops at the first signed one, and its frames are judged up to
there (that frame's address with the signature taken off; qmpprof strips them all).
QMPPROF_ARM64_LINUX_PAUSES pauses (`make linux-arm64-oracle` runs 100 on every kernel).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import run_cached
from tests.integration.gdb_mi import (
    GdbFrame,
    GdbMi,
    same_function,
    text_aliases,
    without_hidden_inline_leaf,
)
from tests.integration.linux_user_gdb import loaded_user_frames, process_maps, user_symbols
from tests.integration.test_gdb_agreement_aarch64 import up_to_first_signed
from tests.linux_vm import LinuxGuest, started_pids
from tests.linux_vm_aarch64 import BUILD, aarch64_kernel_slide, running_linux_aarch64
from tests.seeds import seeded

pytestmark = pytest.mark.integration

PAUSES = int(os.environ.get("QMPPROF_ARM64_LINUX_PAUSES", "12"))
ABI = os.environ.get("QMPPROF_ARM64_LINUX_ABI", "6.1.0-50-cloud-arm64")
WORKLOADS = "crunch,sysloop,pinned,dynwork"
#: The programs GDB is given: static ones at their link addresses, the dynamically
#: linked PIE with its libraries at the biases its maps give.
STATIC = ("crunch", "sysloop", "pinned")
DYNAMIC = "dynwork"
HALTED = re.compile(r"CPU#(\d+) \[halted ?\]")
#: Entry code: GDB has no CFI for it, judging ends after its first frame.
ENTRY = re.compile(r"^(vectors|el[01][th]_64_\w+|ret_to_\w+|call_on_irq_stack)$")
#: qmpprof's label of a CPU's idle task (pid 0).
IDLE = "[idle]"
#: The share of samples of each class identical to GDB's (the issue's bar: 98 %).
MIN_AGREEING = 0.98


@dataclass
class Tally:
    judged: Counter[str]
    agreeing: Counter[str]
    failures: list[str]

    def add(self, kind: str, problem: str | None) -> None:
        self.judged[kind] += 1
        if problem is None:
            self.agreeing[kind] += 1
        else:
            self.failures.append(f"{kind}: {problem}")


#: Each configuration: the CPU (whether return addresses are signed) and the workloads
#: (4 busy programs on 2 vCPUs, or 1 and a sleeper: idle vCPUs).
CONFIGURATIONS = {
    "busy": ("max,pauth=off", WORKLOADS),
    "idle": ("max,pauth=off", "sysloop,sleeper"),
    "signed": ("max", WORKLOADS),
}


@pytest.fixture(scope="module", params=sorted(CONFIGURATIONS))
def arm64_guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LinuxGuest, GdbMi]]:
    workdir = tmp_path_factory.mktemp("linux-arm64")
    gdb_socket = str(workdir / "gdb.sock")
    cpu, workloads = CONFIGURATIONS[request.param]
    boot = ("--gdb", gdb_socket, "--cpu", cpu, "--workloads", workloads)
    with running_linux_aarch64(workdir, *boot, abi=ABI) as guest:
        dump(guest)  # the roots, read from the free gdbstub, remembered for GDB's time
        gdb = GdbMi(
            guest.kernel,
            gdb_socket,
            timeout=300,
            offset=aarch64_kernel_slide(guest),
            architecture="aarch64",
        )
        try:
            yield guest, gdb
        finally:
            gdb.close()


def dump(guest: LinuxGuest, *extra: str) -> list[dict[str, Any]]:
    """`qmpprof dump --json` with no file of any kind (or `extra`'s)."""
    done = run_cached(
        "dump", "--json", "--qmp-socket", guest.qmp, *extra, env={"DEBUGINFOD_URLS": ""},
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert extra or "from guest memory" in done.stderr, done.stderr
    vcpus: list[dict[str, Any]] = json.loads(done.stdout)["vcpus"]
    return vcpus


def physical(frames: list[GdbFrame], inlined: set[int]) -> list[GdbFrame]:
    """GDB's frames without the calls inlined into the frame above them (levels
    `inlined`): kallsyms and a stripped file name the function whose code it is."""
    return [frame for frame in frames if frame.level not in inlined]


def gdb_stack(gdb: GdbMi, thread: int, program: str | None, guest: LinuxGuest) -> list[GdbFrame]:
    """GDB's frames through the first it reached by a signed return address, if any (its
    signature taken off: GDB cannot, and names no function there). A user vCPU's
    program's files are GDB's: a static program at its link addresses, dynwork's PIE and
    libraries (libc with libc6-dbg's debug file) where its /proc/PID/maps put them."""
    if program in STATIC:
        with gdb.symbols_from(BUILD / str(program)):
            frames = physical(gdb.frames(thread), gdb.inline_levels(thread))
    elif program == DYNAMIC:
        serial = Path(guest.serial).read_text(errors="replace")
        maps = process_maps(serial, started_pids(serial)[DYNAMIC])
        with user_symbols(gdb, maps, guest.sysroot):
            inlined = gdb.inline_levels(thread)
            frames = physical(loaded_user_frames(gdb, thread), inlined)
    else:
        frames = physical(gdb.frames(thread), gdb.inline_levels(thread))
    return up_to_first_signed(frames)[0]


def libc_aliases(sysroot: Path) -> dict[str, str]:
    """libc's names for one function (`snprintf`, `__GI___snprintf`): its own dynamic
    symbols and its debug file's (libc6-dbg, by build-id)."""
    libc = sysroot / "lib" / "aarch64-linux-gnu" / "libc.so.6"
    notes = subprocess.run(["readelf", "-n", str(libc)], capture_output=True, text=True)
    found = re.search(r"Build ID: ([0-9a-f]{2})([0-9a-f]+)", notes.stdout)
    assert found, f"{libc} has no build-id"
    debug = sysroot / "usr/lib/debug/.build-id" / found.group(1) / f"{found.group(2)}.debug"
    return text_aliases(libc, *([debug] if debug.exists() else []))


def frame_problem(
    gdb: list[GdbFrame], ours: list[tuple[int, str | None]], aliases: dict[str, str]
) -> str | None:
    """Why `ours` is not GDB's stack as far as GDB can tell it (None: it is)."""
    for index, frame in enumerate(gdb):
        named = frame.function not in (None, "??")
        if index and not named:
            return None  # where GDB cannot name a frame, its unwind guesses on
        if index >= len(ours):
            return f"frame {index} missing: GDB has {frame}"
        address, name = ours[index]
        if address != frame.address:
            return f"frame {index}: {address:#x} {name}, GDB {frame.address:#x} {frame.function}"
        # A function of a stripped file's own (libc's static ones) has no name from the
        # guest: its address is judged (GDB names it from libc6-dbg's debug file).
        if (
            named
            and name
            and same_function(name, aliases) != same_function(frame.function, aliases)
        ):
            return f"frame {index} at {address:#x}: {name}, GDB {frame.function}"
        if named and ENTRY.match(str(frame.function)):
            return None
    return None


def pause(gdb: GdbMi, rng: random.Random) -> None:
    gdb.resume()
    time.sleep(rng.uniform(0.001, 0.08))  # chooses where to pause; not a synchronisation
    gdb.interrupt()


def test_no_file_dumps_agree_with_gdb(arm64_guest: tuple[LinuxGuest, GdbMi]) -> None:
    guest, gdb = arm64_guest
    pids = started_pids(Path(guest.serial).read_text(errors="replace"))
    programs = {pid: name for name, pid in pids.items()}
    aliases = text_aliases(guest.kernel, *(BUILD / name for name in STATIC)) | libc_aliases(
        guest.sysroot
    )
    rng = seeded("linux-arm64")
    tally = Tally(Counter(), Counter(), [])
    for _ in range(PAUSES):
        pause(gdb, rng)
        halted = {int(n) for n in HALTED.findall("".join(gdb.console("info threads")))}
        ours = dump(guest)
        for vcpu in ours:
            index = int(vcpu["vcpu"])
            judge(guest, gdb, index, vcpu, index in halted, programs, aliases, tally)
    print(f"\nagreeing with GDB, by class: {dict(tally.agreeing)} of {dict(tally.judged)}")
    for failure in tally.failures:
        print(f"  {failure}")
    for kind, judged in tally.judged.items():
        assert tally.agreeing[kind] >= MIN_AGREEING * judged, tally.failures


def judge(
    guest: LinuxGuest,
    gdb: GdbMi,
    index: int,
    vcpu: dict[str, Any],
    halted: bool,
    programs: dict[int, str],
    aliases: dict[str, str],
    tally: Tally,
) -> None:
    thread = index + 1
    registers = gdb.registers(thread)
    el = int(registers["cpsr"], 16) >> 2 & 3
    kind = "idle" if halted else ("user" if el == 0 else "kernel")
    assert vcpu["mode"] == kind, (vcpu, registers["cpsr"], halted)
    tid = int(registers["CONTEXTIDR_EL1"], 16)
    process = vcpu.get("process") or {}
    program = programs.get(tid)
    if kind != "idle" and tid == 0:  # a CPU's idle task, running (an interrupt)
        assert process.get("name") == IDLE, (vcpu["process"], tid)
    elif kind != "idle":
        assert process.get("tid") == tid, (vcpu["process"], tid)
        assert program is None or process.get("name") == program, (process, program)
    frames = [(int(f["address"], 16), f["function"]) for f in vcpu["frames"]]
    expected = gdb_stack(gdb, thread, program if kind == "user" else None, guest)
    problem = frame_problem(expected, frames, aliases) or vector_problem(frames, program)
    tally.add(kind, problem and f"{process.get('name')} {problem}")


#: Where a thread's user stack begins: the program's entry, a new thread's (glibc's clone).
THREAD_ROOTS = {"_start", "thread_start"}


def vector_problem(frames: list[tuple[int, str | None]], program: str | None) -> str | None:
    """A vCPU at an exception vector taken from EL0, GDB's unwind ends there: the user
    frames after it (from x30 and the frame records) must be the static program's own
    functions, down to where its thread began."""
    from_user = len(frames) > 1 and frames[1][0] < 1 << 63  # else taken from EL1
    if not frames or frames[0][1] != "vectors" or not from_user or program not in STATIC:
        return None
    user = [name for address, name in frames[1:] if address < 1 << 63]
    if len(user) != len(frames) - 1 or not user or user[-1] not in THREAD_ROOTS:
        return f"from its exception vector: {[name for _, name in frames]}"
    return None


#: Pauses of the vmlinux test (each a GDB backtrace and a dump with the vmlinux).
VMLINUX_PAUSES = int(os.environ.get("QMPPROF_ARM64_VMLINUX_PAUSES", "10"))


def test_with_the_vmlinux_kernel_frames_are_gdb_s_inlined_calls_included(
    arm64_guest: tuple[LinuxGuest, GdbMi],
) -> None:
    """`dump --kernel VMLINUX` (the -dbg vmlinux): every kernel-mode vCPU's frames are
    GDB's, its inlined calls included, up to the entry code."""
    guest, gdb = arm64_guest
    aliases = text_aliases(guest.kernel)
    rng = seeded("linux-arm64-vmlinux")
    judged, problems = 0, []
    for _ in range(VMLINUX_PAUSES):
        pause(gdb, rng)
        for vcpu in dump(guest, "--kernel", str(guest.kernel)):
            thread = int(vcpu["vcpu"]) + 1
            if vcpu["mode"] != "kernel":
                continue
            frames = [(int(f["address"], 16), f["function"]) for f in vcpu["frames"]]
            expected = up_to_first_signed(gdb.frames(thread))[0]
            judged += 1
            frames = without_hidden_inline_leaf(frames, expected)  # GDB's rule, see there
            problem = frame_problem(expected, frames, aliases)
            if problem is not None:
                problems.append(problem)
    print(f"\nwith the vmlinux, {judged - len(problems)} of {judged} kernel samples agree")
    for problem in problems:
        print(f"  {problem}")
    assert len(problems) <= (1 - MIN_AGREEING) * judged, problems
