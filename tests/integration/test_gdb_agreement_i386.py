"""The 32-bit build of the example guest (protected mode, ELF32, i386 CFI and frame
pointers) against GDB, as the 64-bit guest is checked in test_gdb_agreement.py: with
GDB holding the guest stopped at random points, `qmpprof dump --json` must agree with
GDB's backtrace of every vCPU frame for frame, and leave the VM paused.

Each configuration is one paging mode (2-level with 4 MiB kernel pages, or PAE) and one
build (frame pointers, or CFI alone): the user workload on two vCPUs gives kernel, user
and idle samples, and interrupts taken in ring 0 and in ring 3. The guest runs under
qemu-system-i386, whose gdbstub speaks the 32-bit register set GDB's i386 architecture
reads. QMPPROF_I386_PAUSES pauses each (`make i386-oracle` runs 150 of them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, dump_json, record_folded, running_guest
from tests.integration.gdb_mi import GdbMi
from tests.integration.test_gdb_agreement import (
    REQUIRED_AGREEMENT,
    assert_every_class_agrees,
    guest_under_gdb,
    run_pauses,
    run_user_workload_pauses,
)
from tests.unit.test_symbols import nm_functions

PAUSES = int(os.environ.get("QMPPROF_I386_PAUSES", "25"))
I386 = ("--arch", "i386", "--qemu-binary", "qemu-system-i386")


@pytest.fixture
def i386_user_guest(request: pytest.FixtureRequest, workdir: Path) -> Iterator[tuple[Guest, GdbMi]]:
    paging, variant = request.param
    boot = (*I386, "--paging", paging, "--variant", variant, "--workload", "user", "--smp", "2")
    with guest_under_gdb(workdir, *boot) as pair:
        yield pair


@pytest.mark.parametrize(
    "i386_user_guest",
    [(paging, variant) for paging in ("2level", "pae") for variant in ("fp", "nofp")],
    indirect=True,
    ids=lambda config: "-".join(config),
)
def test_i386_user_workload_agrees_with_gdb(i386_user_guest: tuple[Guest, GdbMi]) -> None:
    guest, gdb = i386_user_guest
    tallies = run_user_workload_pauses(guest, gdb, PAUSES, "i386 user workload")
    # One sample a class may disagree: make test 2026-11-28 had one (pae-nofp) in about
    # 30 runs of these four configurations, its cause not found (docs/accuracy.md).
    assert_every_class_agrees(tallies, tolerated=1)


@pytest.mark.parametrize("variant", ["fp", "nofp"])
def test_i386_kernel_workload_agrees_with_gdb(variant: str, workdir: Path) -> None:
    """The kernel workload's chains and its timer interrupt, taken in ring 0 (an iret
    frame without ESP and SS), one vCPU."""
    boot = (*I386, "--paging", "pae", "--variant", variant)
    with guest_under_gdb(workdir, *boot) as (guest, gdb):
        unwinders = {"auto": 1, "fp": 1} if variant == "fp" else {"auto": 1}
        tallies = run_pauses(guest, gdb, PAUSES, unwinders, f"i386 {variant} guest")
    for unwind, tally in tallies.items():
        print(tally.report(f"i386 {variant} guest, --unwind {unwind}"))
        assert tally.agreement >= REQUIRED_AGREEMENT, tally.report(f"--unwind {unwind}")


def test_qemu_system_x86_64_runs_it_too_and_the_dump_says_32_bit(workdir: Path) -> None:
    """The same ELF32 booted by qemu-system-x86_64 (whose `info registers` still
    prints EAX=…, EIP=… for a vCPU outside long mode): a 32-bit sample, fully unwound."""
    with running_guest(workdir, "--arch", "i386", "--accel", "tcg") as guest:
        vcpus = dump_json(guest)
    assert [vcpu["bits"] for vcpu in vcpus] == [32]
    frames = vcpus[0]["frames"]
    assert isinstance(frames, list) and frames[-1]["function"] == "kernel_entry"


def test_kernel_and_user_frames_are_told_apart_by_the_32_bit_split(workdir: Path) -> None:
    """--kernel-only keeps the kernel's frames (0xc0000000 up) of a 32-bit guest and
    --user-only its programs': x86-64's kernel half says nothing of 32-bit addresses."""
    boot = ("--arch", "i386", "--accel", "tcg", "--workload", "user", "--smp", "2")
    with running_guest(workdir, *boot) as guest:
        users = ("--user-dir", str(guest.user_dir))
        _, kernel = record_folded(guest, workdir / "k.folded", 2, *users, "--kernel-only")
        _, user = record_folded(guest, workdir / "u.folded", 2, *users, "--user-only")
    kernel_names = set(nm_functions(guest.kernel))
    assert guest.user_dir is not None
    program_names = set(nm_functions(guest.user_dir / "crunch.elf"))
    kernel_frames = {frame for frames, _ in kernel for frame in frames[1:]}
    user_frames = {frame for frames, _ in user for frame in frames[1:]}
    assert kernel_frames and kernel_frames <= kernel_names
    assert "crunch_main" in user_frames and not user_frames & (kernel_names - program_names)
