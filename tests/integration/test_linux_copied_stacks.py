"""Stop mode unwinds a copy: with guest RAM read on this host, a tick copies the memory
its unwind will read while the VM is paused and unwinds that copy once the VM runs again
(Capturer.take, Capturer.finish), as perf copies a user stack. The oracle is the exact
examination: at each pause both run, the copy and, still paused, the live examination
that reads whatever it needs from the guest (Capturer.capture, what `dump` does), and
every sample of the busy Linux guest (CPU-bound, system-call and threaded workloads,
KASLR on) must come out the same from both, frame for frame and task for task. GDB stops
the guest where random pauses rarely fall: an interrupt's first instruction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import KERNEL_HALF, CapturedSample, RawSample
from qmpprof.target.pause import paused
from tests.integration.gdb_mi import GdbMi
from tests.linux_vm import BUILD, LinuxGuest, kernel_slide, running_linux

WORKLOADS = tuple(BUILD / name for name in ("crunch", "crunchnofp", "sysloop", "pinned", "sleeper"))
PAUSES = 150
#: Timer interrupts from user mode that GDB stops the guest at.
ENTRY_HITS = 12
#: The timer interrupt's entry stub, and a GDB condition: taken in user mode (the CS the
#: CPU pushed, above the RIP at RSP).
ENTRY_STUB = "asm_sysvec_apic_timer_interrupt"
FROM_USER_MODE = "(*(unsigned long *)($rsp + 8) & 3) == 3"
#: The user RSP in the frame the CPU pushed (RIP, CS, RFLAGS, RSP, SS).
FRAME_RSP = '"*(unsigned long *)($rsp + 24)"'


@pytest.fixture(scope="module")
def busy_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("copied"), "--smp", "2") as guest:
        yield guest


Pair = tuple[CapturedSample, CapturedSample]


async def copied_and_exact(guest: LinuxGuest) -> list[Pair]:
    """Per vCPU and pause: (the copy's sample, the live examination's sample)."""
    options = TargetOptions(guest.qmp, guest.kernel, user_files=WORKLOADS, memory="direct")
    analyzer = build_analyzer(options)
    pairs: list[Pair] = []
    copies = 0
    async with connected(options, analyzer) as (session, _, capturer):
        for _ in range(PAUSES):
            async with paused(session) as ours:
                assert ours, "someone else paused the guest"
                taken = await capturer.take()
                copies += sum(isinstance(item, RawSample) for item in taken)
                copied = await capturer.finish(taken)
                exact = await capturer.capture()
            pairs += zip(copied, exact, strict=True)
    assert copies > len(pairs) * 0.9, f"only {copies} of {len(pairs)} samples were copies"
    return pairs


@pytest.fixture(scope="module")
def dynwork_under_gdb(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LinuxGuest, GdbMi]]:
    workdir = tmp_path_factory.mktemp("entry-stack")
    gdb_socket = str(workdir / "gdb.sock")
    boot = ("--smp", "1", "--gdb", gdb_socket, "--workloads", "dynwork")
    with running_linux(workdir, *boot) as guest:
        gdb = GdbMi(guest.kernel, gdb_socket, timeout=300, offset=kernel_slide(guest))
        try:
            yield guest, gdb
        finally:
            gdb.close()


async def copied_and_exact_at_entries(guest: LinuxGuest, gdb: GdbMi) -> list[tuple[Pair, int]]:
    """Per stop of GDB's at the entry stub: the pair (see copied_and_exact) and the user
    RSP in the interrupt frame. The guest stays GDB's: qmpprof pauses and resumes nothing."""
    options = TargetOptions(guest.qmp, guest.kernel, user_files=WORKLOADS, memory="direct")
    analyzer = build_analyzer(options)
    gdb.console(f"hbreak {ENTRY_STUB} if {FROM_USER_MODE}")
    found = []
    async with connected(options, analyzer) as (_, _, capturer):
        for _ in range(ENTRY_HITS):
            gdb.resume()
            gdb.wait_for("*stopped")
            user_rsp = int(gdb.evaluate(FRAME_RSP, 1) or "")
            (copied,) = await capturer.finish(await capturer.take())
            (exact,) = await capturer.capture()
            found.append(((copied, exact), user_rsp))
    return found


def summary(sample: CapturedSample) -> tuple[object, ...]:
    return sample.process, tuple(frame.address for frame in sample.stack.frames)


def test_the_copy_unwinds_as_the_paused_guest_does(busy_guest: LinuxGuest) -> None:
    pairs = asyncio.run(copied_and_exact(busy_guest))
    different = [(c, e) for c, e in pairs if summary(c) != summary(e)]
    kernel = sum(e.raw.registers.cpl == 0 for _, e in pairs)
    assert kernel and kernel < len(pairs), "no kernel or no user samples to compare"
    assert not different, [
        (summary(c), summary(e), c.stack.stop, e.stack.stop) for c, e in different[:3]
    ]


def test_an_interrupt_from_user_mode_still_on_the_entry_stack_copies_its_user_stack(
    dynwork_under_gdb: tuple[LinuxGuest, GdbMi],
) -> None:
    """At the entry stub of an interrupt taken in user mode, the CPU is on the stack the
    task-state segment's RSP0 names (Linux's per-CPU entry stack), and the user registers
    the task keeps are still the last entry's. The copy must hold the user stack at the
    RSP of the frame the CPU just pushed (GDB reads it) and unwind as the paused guest
    does: dynwork's stack depth changes from one interrupt to the next (before the copy
    read that frame, 4 of 10 such samples lost their user frames)."""
    found = asyncio.run(copied_and_exact_at_entries(*dynwork_under_gdb))
    for (copied, exact), user_rsp in found:
        windows = copied.raw.windows
        spans = [(hex(w.base), hex(w.end)) for w in windows]
        assert any(w.base <= user_rsp and user_rsp + 8 <= w.end for w in windows), (
            f"no copy of the user stack at {user_rsp:#x}: {spans}"
        )
        assert summary(copied) == summary(exact), (copied.stack.stop, exact.stack.stop)
        assert any(f.address < KERNEL_HALF for f in exact.stack.frames), "no user frame"
