"""Record the QMP exchanges that tests/unit/test_capture_replay.py and
test_sampler_replay.py replay: `python -m tests.unit.data.qmp.record_capture` (from the
repository root, after `make guest`; GDB is needed).

It boots the example guest (guest_setup.BOOT_ARGS) with a GDB stub and a second QMP
monitor for "another client", and runs qmpprof's own Capturer and sampler through the
recording proxy of record.py, each scenario on its own connection:

- tick_then_paused_by_other: a stop-mode tick, then another client's `stop`, then a tick
  that must leave the VM alone;
- failing_ticks: the sampler until it gives up, every tick's register request answered
  with something that is not a register dump (capture.REGISTERS misspelt);
- capture_user, capture_one_vcpu, capture_no_extra_window: GDB holds the VM stopped
  where one vCPU runs user code and the other kernel code over pulse's user code (an
  interrupt or a system call), and the Capturer reads it (all vCPUs; the one in user
  code alone; no window beyond the first). GDB's backtrace of each vCPU, and
  the process it says each runs, go to capture_user.gdb.json: the tests' oracle;
- capture_at_reset: a QEMU started with -S (the example guest not booted yet): every
  vCPU in 16-bit real mode, as after a reset;
- tick_then_quit: a tick, then the other client quits QEMU.

Re-record when QEMU, the example guest or qmpprof's requests change, and read the diff.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import qmpprof.record.capture as capture
from qmpprof.errors import RegisterParseError
from qmpprof.model import RecordStats
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.record.sampler import LoopConfig, paused_capture, sample_loop
from qmpprof.target.memory import HmpMemory
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.guest_vm import BareQmp, Guest, running_guest
from tests.integration.gdb_mi import GdbFrame, GdbMi
from tests.integration.test_gdb_agreement import gdb_frames_in, program_names
from tests.unit.data.qmp import guest_setup
from tests.unit.data.qmp.guest_setup import (
    BOOT_ARGS,
    CAPTURE,
    MISSPELT_REGISTERS,
    TICK,
    USER_END,
    guest_analyzer,
    tick_analyzer,
)
from tests.unit.data.qmp.record import HERE, record, save

Scenario = Callable[[QmpSession], Awaitable[None]]


def tick_capturer(session: QmpSession) -> Capturer:
    return Capturer(session, HmpMemory(session), tick_analyzer(), TICK)


async def until_paused(session: QmpSession) -> None:
    """Wait until the session has read the STOP event of another client's `stop`."""
    for _ in range(500):
        if not await session.is_running():
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the other client's STOP never reached the session")


async def tick_then_paused_by_other(other: BareQmp, session: QmpSession) -> None:
    capturer, stats = tick_capturer(session), RecordStats()
    assert await session.is_running()
    assert await paused_capture(session, capturer, stats, None) is not None
    other.call("stop")
    await until_paused(session)
    assert await paused_capture(session, capturer, stats, None) is None


async def failing_ticks(session: QmpSession) -> None:
    assert await session.is_running()
    capture.REGISTERS = MISSPELT_REGISTERS
    try:
        config = LoopConfig(period_s=0.02, duration_s=None)
        stats = await sample_loop(
            session, tick_capturer(session), config, asyncio.Event(), lambda _: None
        )
    finally:
        capture.REGISTERS = "info registers -a"
    assert stats.ended_by is not None and stats.failed == 5, stats
    assert await session.is_running()


async def tick_then_quit(other: BareQmp, session: QmpSession) -> None:
    capturer, stats = tick_capturer(session), RecordStats()
    assert await session.is_running()
    assert await paused_capture(session, capturer, stats, None) is not None
    other.call("quit")
    await asyncio.sleep(0.5)  # the recorder's wait: QEMU's last words and its hang-up


async def captured(config: CaptureConfig, session: QmpSession) -> None:
    """One capture of the VM as GDB (or the other client) holds it stopped."""
    await Capturer(session, HmpMemory(session), guest_analyzer(), config).capture()


async def capture_without_extra_windows(session: QmpSession) -> None:
    capture.MAX_EXTRA_WINDOWS = 0
    try:
        await captured(CAPTURE, session)
    finally:
        capture.MAX_EXTRA_WINDOWS = 3


def record_scenario(guest: Guest, name: str, scenario: Scenario) -> None:
    save(name, asyncio.run(record(guest.qmp, scenario)))
    print(f"recorded {name}")


def frames_as_json(frames: list[GdbFrame]) -> list[list[Any]]:
    return [[frame.address, frame.function] for frame in frames]


def gdb_view(guest: Guest, gdb: GdbMi, other: BareQmp, programs: dict[int, str]) -> dict[str, Any]:
    """What GDB says of each vCPU now: the program its address space runs, its frames,
    and the process `cpu_current` names."""
    dump = other.call("human-monitor-command", {"command-line": "info registers -a"})
    vcpus = {}
    for registers in parse_all(str(dump)):
        vcpu = registers.vcpu
        program = programs.get(registers.cr3 & ~0xFFF)
        thread = vcpu + 1
        vcpus[str(vcpu)] = {
            "program": program,
            "frames": frames_as_json(gdb_frames_in(gdb, guest, vcpu, program)),
            "pid": gdb.evaluate(f"cpu_current[{vcpu}]->pid", thread),
            "name": gdb_string(gdb.evaluate(f"cpu_current[{vcpu}]->name", thread)),
        }
    return vcpus


def gdb_string(value: str | None) -> str | None:
    """A char array as GDB/MI prints it (`\\"crunch\\", '\\000' <repeats 9 times>`)."""
    quoted = re.match(r'^\\"([^\\]*)', value or "")
    return quoted.group(1) if quoted else None


def wanted(vcpus: dict[str, Any]) -> bool:
    """One vCPU in user code below a caller, the other in kernel code entered from user
    code (its frames go on into the program): both need windows beyond the first. The
    user code under the kernel is pulse's, built with frame pointers, whose frames are
    found in the window read at the user stack even where its CFI cannot be used."""
    kinds = set()
    for vcpu in vcpus.values():
        addresses = [address for address, _ in vcpu["frames"]]
        if vcpu["program"] is None or len(addresses) < 3:
            continue
        if addresses[0] < USER_END:
            kinds.add("user")
        elif any(address < USER_END for address in addresses) and vcpu["program"] == "pulse":
            kinds.add("kernel over user")
    return kinds == {"user", "kernel over user"}


def record_gdb_captures(guest: Guest, other: BareQmp) -> None:
    gdb = GdbMi(guest.kernel, guest.gdb)
    rng = random.Random(14)
    try:
        programs: dict[int, str] = {}
        for _ in range(1000):
            gdb.resume()
            time.sleep(rng.uniform(0.001, 0.05))  # where to pause, not a synchronisation
            gdb.interrupt()
            programs = programs or program_names(gdb)
            vcpus = gdb_view(guest, gdb, other, programs)
            if wanted(vcpus):
                break
        else:
            raise RuntimeError("no pause with a vCPU in user code and one in the kernel over it")
        (HERE / "capture_user.gdb.json").write_text(json.dumps({"vcpus": vcpus}, indent=1) + "\n")
        record_scenario(guest, "capture_user", functools.partial(captured, CAPTURE))
        user = next(int(n) for n, view in vcpus.items() if view["frames"][0][0] < USER_END)
        one = CaptureConfig(CAPTURE.stack_bytes, cpus=(user,))
        record_scenario(guest, "capture_one_vcpu", functools.partial(captured, one))
        record_scenario(guest, "capture_no_extra_window", capture_without_extra_windows)
        if gdb_view(guest, gdb, other, programs) != vcpus:
            raise RuntimeError("the VM moved while GDB was to hold it stopped")
    finally:
        gdb.close()


@contextmanager
def qemu_at_reset(work: Path) -> Iterator[Guest]:
    """QEMU holding the example guest at the reset vector (-S): its vCPUs have not run.
    (boot.sh waits for the guest to boot, and its -no-reboot makes a reset a quit.)"""
    qmp, pid_file = work / "reset.sock", work / "reset.pid"
    kernel = guest_setup.BUILD / "kernel.boot"
    qemu = os.environ.get("QEMU", "qemu-system-x86_64")
    arguments = ["-S", "-display", "none", "-smp", "2", "-kernel", str(kernel)]
    arguments += ["-qmp", f"unix:{qmp},server=on,wait=off", "-daemonize", "-pidfile", str(pid_file)]
    subprocess.run([qemu, *arguments], check=True, timeout=60)
    pid = int(pid_file.read_text())
    try:
        yield Guest(pid, guest_setup.KERNEL, str(qmp), "", "")
    finally:
        os.kill(pid, signal.SIGTERM)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="qmprec-") as work:
        gdb_socket, other_socket = f"{work}/gdb.sock", f"{work}/other.sock"
        boot = (*BOOT_ARGS, "--gdb", gdb_socket, "--extra-qmp", other_socket)
        with running_guest(Path(work), *boot) as guest:
            other = BareQmp(other_socket)
            record_scenario(
                guest,
                "tick_then_paused_by_other",
                functools.partial(tick_then_paused_by_other, other),
            )
            other.call("cont")
            record_scenario(guest, "failing_ticks", failing_ticks)
            record_gdb_captures(guest, other)
            record_scenario(guest, "tick_then_quit", functools.partial(tick_then_quit, other))
        with qemu_at_reset(Path(work)) as at_reset:
            record_scenario(at_reset, "capture_at_reset", functools.partial(captured, CAPTURE))


if __name__ == "__main__":
    try:
        main()
    except RegisterParseError as err:
        raise SystemExit(f"record_capture: {err}") from err
