"""The AArch64 build of the example guest against gdb-multiarch, as the x86 builds are
checked in test_gdb_agreement.py: with GDB holding the guest stopped at random points,
`qmpprof dump --json` must agree with GDB's backtrace of every vCPU frame for frame, in
the class GDB gives it, and leave the VM paused.

The classes come from the gdbstub, with none of qmpprof's code: idle where GDB's thread
list says the vCPU is halted, else kernel at EL1 and user at EL0 (CPSR's M[3:2]); the
program a vCPU runs is the process whose page-table root (`struct process` cr3) is the
vCPU's TTBR0_EL1, and a user sample's process label (read through a vCPU at EL1: QEMU
does not let one at EL0 read the kernel's memory) must name that program.

User code signs its return addresses. QEMU 7.2 does not tell GDB the CPU has pointer
authentication, so GDB cannot strip them and stops at the first signed one: there its
frame's address is compared with the signature taken off (the bits above the 48-bit
address), and qmpprof's frames beyond where GDB stops are not judged. The same build
booted on `-cpu max,pauth=off` (PACIASP/AUTIASP are NOPs there) is judged whole.
Each configuration: QMPPROF_AARCH64_PAUSES pauses (`make aarch64-oracle` runs 150).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Guest, run_qmpprof, running_guest
from tests.integration.gdb_mi import Frames, GdbFrame, GdbMi, agree, instructions_in
from tests.integration.test_gdb_agreement import (
    IDLE_LOOP,
    Tally,
    assert_every_class_agrees,
    gdb_frames_in,
    pause_randomly,
    window_between,
)
from tests.seeds import seeded

PAUSES = int(os.environ.get("QMPPROF_AARCH64_PAUSES", "25"))
MORE_PAUSES = 10
AARCH64 = ("--arch", "aarch64")
#: "Thread 1.2 (CPU#1 [halted ])" in GDB's thread list: QEMU's gdbstub says so.
HALTED = re.compile(r"CPU#(\d+) \[halted ?\]")
#: An address with anything above bit 47 but the upper half's ones: signed.
_VA_BITS = 48


def mid_switch_window(kernel: Path) -> range:
    """The pcs of switch_context that run on the new task's kernel stack with the old
    task's TTBR0_EL1 (after `mov sp, x1`, up to the `msr ttbr0_el1`): the new task's user
    frames lie in an address space not loaded yet, which GDB reads through the old one.
    There the kernel frames alone are judged (as on x86: test_gdb_agreement.py). From
    gdb-multiarch's disassembly of the kernel file (the guest's memory may not be
    readable through the vCPU when GDB attaches)."""
    command = ["gdb-multiarch", "-batch", "-ex", "set architecture aarch64"]
    command += ["-ex", "x/32i switch_context", str(kernel)]
    text = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    return window_between(
        instructions_in(text),
        lambda op, args: op == "mov" and args.startswith("sp,"),
        lambda op, args: op == "msr" and "ttbr0_el1" in args,
    )


@contextmanager
def aarch64_guest_under_gdb(workdir: Path, *boot_args: str) -> Iterator[tuple[Guest, GdbMi]]:
    """The guest with GDB attached; before GDB, one `dump --memory direct` has read its
    page-table roots from the gdbstub (then free) and remembered them for the QEMU
    process, for the dumps made while GDB holds the stub."""
    gdb_socket = str(workdir / "gdb.sock")
    with running_guest(workdir, *AARCH64, "--gdb", gdb_socket, *boot_args) as guest:
        dump_vcpus(guest, "--memory", "direct")
        assert guest.status() == "running", "reading the roots left the VM paused"
        gdb = GdbMi(guest.kernel, gdb_socket, architecture="aarch64")
        try:
            yield guest, gdb
        finally:
            gdb.close()


def dump_vcpus(guest: Guest, *extra: str) -> list[dict[str, Any]]:
    """`qmpprof dump --json` with the session's derived cache (where the roots are kept)."""
    done = run_qmpprof(
        "dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel),
        "--user-dir", str(guest.user_dir), *extra, cached=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "memory: memsave" not in done.stderr or "memsave" in extra, done.stderr
    vcpus: list[dict[str, Any]] = json.loads(done.stdout)["vcpus"]
    return vcpus


def signed(address: int) -> bool:
    return address >> _VA_BITS not in (0, (1 << (64 - _VA_BITS)) - 1)


def stripped(address: int) -> int:
    """The address with a pointer-authentication signature taken off (bit 55 says
    which half: Arm ARM, 'Pointer authentication', the PAC field)."""
    low = address & ((1 << _VA_BITS) - 1)
    return low | ((1 << 64) - (1 << _VA_BITS)) if address >> 55 & 1 else low


def up_to_first_signed(frames: list[GdbFrame]) -> tuple[list[GdbFrame], bool]:
    """GDB's frames through the first one it reached by a signed return address (that
    frame's address stripped, GDB names no function there), and whether it stopped so."""
    for index, frame in enumerate(frames):
        if signed(frame.address):
            return [*frames[:index], GdbFrame(frame.level, stripped(frame.address), None)], True
    return frames, False


#: The example guest's kernel maps physical memory at this offset (examples/guest/README.md,
#: "The AArch64 build").
KERNEL_MAP = 0xFFFF_0000_0000_0000
_XP_WORD = re.compile(r":\s*0x([0-9a-f]+)")


def physical_word(guest: Guest, address: int) -> int:
    """The 8 bytes at the kernel's virtual `address`, read by QEMU from physical memory
    (a vCPU at EL0 may not read the kernel's pages, GDB's reads go through one)."""
    text = str(
        guest.qmp_call(
            "human-monitor-command", {"command-line": f"xp /1gx {address - KERNEL_MAP:#x}"}
        )
    )
    found = _XP_WORD.search(text)
    assert found, f"xp said {text!r}"
    return int(found.group(1), 16)


def program_names(gdb: GdbMi, guest: Guest) -> dict[int, str]:
    """TTBR0_EL1 value (table, ASID) -> program name, from the guest's process table:
    where each slot's fields are (GDB, from the DWARF), their bytes (QEMU)."""
    names = {}
    for slot in range(8):
        root = physical_word(guest, address_of(gdb, f"process_table[{slot}].cr3"))
        at = address_of(gdb, f"process_table[{slot}].name")
        name = b"".join(physical_word(guest, at + n).to_bytes(8, "little") for n in (0, 8))
        program = name.split(b"\0", 1)[0].decode("ascii", "replace")
        if root and program:
            names[root] = program
    return names


def address_of(gdb: GdbMi, expression: str) -> int:
    value = gdb.evaluate(f"(long)&{expression}", 1)  # MI's arguments: no spaces
    assert value is not None, f"GDB has no address for {expression}"
    return int(value, 0) % (1 << 64)


def halted_vcpus(gdb: GdbMi) -> set[int]:
    text = "".join(gdb.console("info threads"))
    return {int(vcpu) for vcpu in HALTED.findall(text)}


def oracle_mode(gdb: GdbMi, vcpu: int, frames: list[GdbFrame], halted: set[int]) -> str:
    if vcpu in halted:
        leaf = frames[0].function if frames else None
        assert leaf == IDLE_LOOP, f"vCPU {vcpu} halted in {leaf}, not in {IDLE_LOOP}"
        return "idle"
    cpsr = gdb.evaluate("$cpsr", vcpu + 1)
    assert cpsr is not None, "GDB read no CPSR"
    return "user" if (int(cpsr, 0) >> 2) & 3 == 0 else "kernel"


def woken_in_idle_loop(mode: str, our_mode: str, expected: list[GdbFrame], ours: Frames) -> bool:
    """A vCPU QEMU no longer calls halted, in the idle loop right after its WFI (woken,
    its interrupt not taken yet, or back from it): QEMU's AArch64 dump has no halt flag,
    and qmpprof calls a vCPU whose last instruction was WFI idle. Its stack must agree."""
    return (
        (mode, our_mode) == ("kernel", "idle")
        and bool(expected)
        and expected[0].function == IDLE_LOOP
        and agree(expected, ours)
    )


def run_pauses(
    guest: Guest,
    gdb: GdbMi,
    pauses: int,
    name: str,
    *dump_args: str,
    programs_judged: frozenset[str] | None = None,
    needed: dict[str, int] | None = None,
) -> dict[str, Tally]:
    """Every vCPU's stack at `pauses` random points against GDB's, in the class GDB gives
    it; `programs_judged`: only the busy samples whose address space runs one of these
    (and the idle ones): the others' code keeps nothing the unwind asked for needs.
    `needed`: the samples each class must have (default one each): pausing goes on past
    `pauses` until it has them, up to MORE_PAUSES times as many, for a class a random
    pause seldom lands in (pulse runs 10 % of one CPU)."""
    rng = seeded(name)
    tallies = {mode: Tally(mode) for mode in ("user", "kernel", "idle")}
    needed = needed or dict.fromkeys(tallies, 1)
    counts = Counter[str]()
    programs: dict[int, str] = {}
    window = mid_switch_window(guest.kernel)
    taken = 0
    while taken < pauses or not all(tallies[m].pauses >= n for m, n in needed.items()):
        assert taken < MORE_PAUSES * pauses, f"{name}: too few samples of a class needed"
        taken += 1
        pause_randomly(gdb, rng)
        programs = programs or program_names(gdb, guest)
        judge_pause(guest, gdb, programs, window, dump_args, programs_judged, tallies, counts)
        assert guest.status() == "paused", "qmpprof resumed a VM that GDB holds"
    print(f"{name}: {taken} pauses")
    for mode, tally in tallies.items():
        print(tally.report(f"{name}, {mode} samples"))
    cut, woken, labelled = counts["cut"], counts["woken"], counts["labelled"]
    print(f"{name}: {cut} samples judged up to the signed return address where GDB stopped")
    print(f"{name}: {woken} vCPUs woken, still at the instruction after their WFI")
    print(f"{name}: {labelled} user samples labelled with their process, each rightly")
    print(f"{name}: {counts['mid_switch']} samples between sp's switch and TTBR0's, kernel judged")
    return tallies


def judge_pause(
    guest: Guest,
    gdb: GdbMi,
    programs: dict[int, str],
    window: range,
    dump_args: tuple[str, ...],
    programs_judged: frozenset[str] | None,
    tallies: dict[str, Tally],
    counts: Counter[str],
) -> None:
    """Every vCPU of one pause into `tallies` (by GDB's class); the cut, woken and
    labelled samples into `counts`."""
    judged = []
    for vcpu in dump_vcpus(guest, *dump_args):
        number = int(str(vcpu["vcpu"]))
        root = gdb.evaluate("$TTBR0_EL1", number + 1)
        program = programs.get(int(root, 0)) if root else None
        expected, stopped = up_to_first_signed(gdb_frames_in(gdb, guest, number, program))
        frames = vcpu["frames"]
        assert isinstance(frames, list)
        ours = [(int(f["address"], 16), f["function"]) for f in frames]
        if stopped:
            counts["cut"] += len(ours) > len(expected)
            ours = ours[: len(expected)]
        if expected and expected[0].address in window:
            counts["mid_switch"] += 1
            expected = [f for f in expected if f.address >> _VA_BITS]
            ours = [f for f in ours if f[0] >> _VA_BITS]
        judged.append((number, program, expected, ours, str(vcpu["mode"])))
        label = vcpu["process"]["name"] if isinstance(vcpu.get("process"), dict) else None
        if vcpu["mode"] == "user" and label is not None:
            counts["labelled"] += 1
            assert label == program, f"vCPU {number} runs {program}, labelled {label}"
    # After the backtraces: GDB's thread list unwinds each thread's leaf with the
    # symbols loaded then, and would keep that frame for the backtrace.
    halted = halted_vcpus(gdb)
    for number, program, expected, ours, our_mode in judged:
        mode = oracle_mode(gdb, number, expected, halted)
        if woken_in_idle_loop(mode, our_mode, expected, ours):
            counts["woken"] += 1
        elif mode == "idle" or programs_judged is None or program in programs_judged:
            tallies[mode].add(expected, ours, our_mode)


@pytest.mark.parametrize(
    "variant,cpu,memory",
    [
        ("fp", "max", "direct"),
        ("nofp", "max", "direct"),
        ("fp", "max,pauth=off", "direct"),
        ("nofp", "max,pauth=off", "direct"),
        ("nofp", "max", "memsave"),
    ],
    ids=["fp-signed", "nofp-signed", "fp-unsigned", "nofp-unsigned", "nofp-signed-memsave"],
)
def test_aarch64_user_workload_agrees_with_gdb(
    variant: str, cpu: str, memory: str, workdir: Path
) -> None:
    """Guest memory read on this host (`direct`: the page tables walked with the
    remembered TTBR1_EL1, each vCPU's TTBR0_EL1 from the guest's process table), or
    through QEMU (`memsave`)."""
    boot = ("--variant", variant, "--cpu", cpu, "--workload", "user", "--smp", "2")
    with aarch64_guest_under_gdb(workdir, *boot) as (guest, gdb):
        name = f"aarch64 {variant} {cpu} {memory}"
        tallies = run_pauses(guest, gdb, PAUSES, name, "--memory", memory)
    assert_every_class_agrees(tallies)


@pytest.mark.parametrize("cpu", ["max", "max,pauth=off"], ids=["signed", "unsigned"])
def test_aarch64_frame_records_alone_agree_with_gdb(cpu: str, workdir: Path) -> None:
    """`--unwind fp`: frame records alone (signed return addresses in them stripped), a
    leaf's caller in LR where its record is not stored yet or is popped. Judged where
    the code keeps frame records: the kernel's fp build and pulse (built with them in
    every variant; crunch, built without, can be unwound by its CFI only). User and idle
    samples must agree in full; kernel samples are in the timer interrupt or a system
    call, whose frame record links to the interrupted code's x29: a function interrupted
    before its `stp x29, x30` has no record of its own yet, and its caller is lost there
    (where CFI finds it). They are counted, not judged."""
    boot = ("--variant", "fp", "--cpu", cpu, "--workload", "user", "--smp", "2")
    with aarch64_guest_under_gdb(workdir, *boot) as (guest, gdb):
        name = f"aarch64 fp records {cpu}"
        judged = frozenset({"pulse"})
        needed = {"user": 5, "idle": 5}
        tallies = run_pauses(
            guest, gdb, 2 * PAUSES, name, "--unwind", "fp", programs_judged=judged, needed=needed
        )
    assert_every_class_agrees({mode: tallies[mode] for mode in needed})
