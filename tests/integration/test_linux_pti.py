"""A Linux guest with page table isolation (PTI, the Meltdown mitigation): while a vCPU
runs user code, its CR3 is a copy of the process's page tables that maps almost none of
the kernel, so the task, the per-CPU areas and linux_banner must be read through the
kernel's own tables (target/direct.py: isolated_kernel_root).

Debian's kernels turn PTI on by themselves on the Intel CPUs that need it; TCG's CPU does
not, so the guest boots with `pti=on`, which forces it. The oracles are the guest's
bytes (the vmlinux's linux_banner), its console (the pids init printed) and QEMU's
registers: the test first shows that the vCPU's own tables really do not map the
kernel, so that the rest tests something."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.errors import MemoryFault
from qmpprof.guest.linux.kaslr import linked_string
from qmpprof.target.direct import open_direct
from qmpprof.target.paging import PagingState, VirtualMemory
from qmpprof.target.pause import paused
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.integration.conftest import run_cached
from tests.linux_vm import LinuxGuest, kernel_slide, nm_symbols, running_linux, started_pids

BUILD = Path(__file__).resolve().parents[2] / "examples" / "linux" / "build"
#: Pauses to wait for a vCPU caught in user code (both run CPU-bound programs).
MAX_PAUSES = 40


@pytest.fixture(scope="module")
def pti_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    workdir = tmp_path_factory.mktemp("pti")
    with running_linux(workdir, "--smp", "2", "--append", "pti=on") as guest:
        yield guest


async def banner_reads(guest: LinuxGuest, banner: int) -> tuple[int, bytes | None, bytes]:
    """At the first pause that catches a vCPU in user code: its CR3, linux_banner as its
    own tables give it (None: they do not map it) and as qmpprof's reader gives it."""
    session = await QmpSession.connect(guest.qmp)
    memory = await open_direct(session)
    try:
        for _ in range(MAX_PAUSES):
            async with paused(session) as ours:
                assert ours, "someone else paused the guest"
                registers = parse_all(await session.hmp("info registers -a"))
                memory.set_registers(registers)
                user = next((regs for regs in registers if regs.cpl == 3), None)
                if user is None:
                    continue
                own = VirtualMemory(memory.physical, PagingState.from_registers(user))
                try:
                    by_own: bytes | None = own.read(banner, 16)
                except MemoryFault:
                    by_own = None
                return user.cr3, by_own, memory.reader(user.vcpu).read(banner, 16)
    finally:
        await memory.close()
        await session.close()
    raise AssertionError(f"no vCPU in user code in {MAX_PAUSES} pauses")


def test_user_code_runs_on_tables_without_the_kernel_and_qmpprof_reads_it_all_the_same(
    pti_guest: LinuxGuest,
) -> None:
    (linked,) = nm_symbols(pti_guest.kernel)["linux_banner"]
    expected = linked_string(pti_guest.kernel, linked)
    assert expected is not None
    cr3, by_own, by_qmpprof = asyncio.run(banner_reads(pti_guest, linked + kernel_slide(pti_guest)))
    assert cr3 & 0x1000, f"CR3 {cr3:#x} is not the user half of a PTI pair: PTI is off"
    assert by_own is None, "the user tables map the kernel: nothing is tested"
    assert by_qmpprof == expected[:16]


def test_record_labels_every_task_and_unwinds_system_calls_into_user_space(
    pti_guest: LinuxGuest, tmp_path: Path
) -> None:
    folded = tmp_path / "pti.folded"
    target = ["--qmp-socket", pti_guest.qmp, "--kernel", str(pti_guest.kernel)]
    users = [f"--user={BUILD / name}" for name in ("crunch", "sysloop")]
    done = run_cached(
        "record", *target, *users, "--duration", "3", "--rate", "50", "-o", str(folded)
    )
    assert done.returncode == 0, done.stderr
    assert f"KASLR slide {kernel_slide(pti_guest):#x}" in done.stdout
    lines = folded.read_text().splitlines()
    roots = {line.split(";", 1)[0] for line in lines}
    pids = started_pids(Path(pti_guest.serial).read_text())
    for name in ("crunch", "sysloop"):
        assert f"{name} ({pids[name]})" in roots, sorted(roots)
    unnamed = sorted(root for root in roots if root.startswith("cr3:"))
    assert not unnamed, f"samples whose task was not read: {unnamed}"
    into_user = [line for line in lines if "do_syscall_64" in line and "sysloop_loop" in line]
    assert into_user, "no system call of sysloop unwound into its own code"


def test_through_the_monitor_the_slide_is_read_on_a_vcpu_whose_tables_map_the_kernel(
    pti_guest: LinuxGuest, tmp_path: Path
) -> None:
    """`hmp` reads with each vCPU's tables as they are when QEMU reads: the slide's
    check waits (in pauses) for a vCPU on the kernel's tables, never calling the right
    vmlinux a mismatch. Three runs: a vCPU is in user code most of the time."""
    target = ["--qmp-socket", pti_guest.qmp, "--kernel", str(pti_guest.kernel)]
    for run in range(3):
        folded = tmp_path / f"hmp{run}.folded"
        done = run_cached(
            "record",
            *target,
            "--memory",
            "hmp",
            "--duration",
            "1",
            "--rate",
            "20",
            "-o",
            str(folded),
        )
        assert done.returncode == 0, done.stderr
        assert f"KASLR slide {kernel_slide(pti_guest):#x}" in done.stdout
