"""A 64-bit guest caught while it boots: its vCPUs in real mode at the reset vector; the
bootstrap CPU in 32-bit protected mode (paging off) at the kernel's multiboot entry while
the firmware keeps the AP parked in its own 32-bit code; the AP in real mode at the
kernel's trampoline, before it enters long mode. `dump` samples every vCPU without an
error, says which mode each runs, names a real-mode pc by its linear address, and leaves
the VM paused.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guest_vm import ROOT, qmp_call
from tests.integration.conftest import run_qmpprof
from tests.integration.gdb_mi import GdbMi

BUILD = ROOT / "examples" / "guest" / "build" / "fp"
#: Where QEMU's x86 CPUs start: CS base 0xffff0000, IP 0xfff0.
RESET_VECTOR = 0xFFFF_FFF0


@pytest.fixture
def held_at_reset(workdir: Path) -> Iterator[tuple[str, GdbMi]]:
    """The example guest's QEMU started with -S (no instruction run yet), GDB attached."""
    qmp, gdb_socket, pid_file = workdir / "qmp", workdir / "gdb", workdir / "pid"
    sockets = [
        "-qmp",
        f"unix:{qmp},server=on,wait=off",
        "-gdb",
        f"unix:{gdb_socket},server=on,wait=off",
    ]
    machine = ["-smp", "2", "-m", "128M", "-accel", "tcg", "-display", "none"]
    boot = ["-kernel", str(BUILD / "kernel.boot"), "-append", "workload=user"]
    daemon = ["-S", "-daemonize", "-pidfile", str(pid_file)]
    subprocess.run(
        ["qemu-system-x86_64", *daemon, *sockets, *machine, *boot], check=True, timeout=60
    )
    try:
        gdb = GdbMi(BUILD / "kernel.elf", str(gdb_socket))
        try:
            yield str(qmp), gdb
        finally:
            gdb.close()
    finally:
        subprocess.run(["kill", pid_file.read_text().strip()], check=False)


def dump(qmp: str) -> list[dict[str, Any]]:
    kernel = str(BUILD / "kernel.elf")
    done = run_qmpprof("dump", "--qmp-socket", qmp, "--kernel", kernel, "--json")
    assert done.returncode == 0, done.stderr
    vcpus: list[dict[str, Any]] = json.loads(done.stdout)["vcpus"]
    return vcpus


def test_vcpus_in_real_and_protected_mode_are_sampled(held_at_reset: tuple[str, GdbMi]) -> None:
    qmp, gdb = held_at_reset
    at_reset = dump(qmp)
    assert [(v["bits"], int(v["pc"], 16)) for v in at_reset] == [(16, RESET_VECTOR)] * 2
    assert all(v["stop"] == "no-stack" for v in at_reset)

    entry = 0x100020  # _start's load address: the multiboot loader jumps there, paging off
    stop_at(gdb, entry)
    booting = dump(qmp)
    assert (booting[0]["bits"], booting[0]["pc"]) == (32, hex(entry))
    assert booting[1]["bits"] == 32 and booting[1]["mode"] == "idle"  # the firmware's

    trampoline = 0x8000  # AP_TRAMPOLINE_PHYS: the SIPI starts the AP at 0800:0000
    stop_at(gdb, trampoline)
    ap_starting = dump(qmp)
    bsp_functions = [frame["function"] for frame in ap_starting[0]["frames"]]
    assert ap_starting[0]["bits"] == 64 and "smp_start_aps" in bsp_functions
    assert (ap_starting[1]["bits"], ap_starting[1]["pc"]) == (16, hex(trampoline))
    status = qmp_call(qmp, "query-status")
    assert isinstance(status, dict) and not status["running"]  # "debug": GDB holds it


def stop_at(gdb: GdbMi, address: int) -> None:
    """Run until a vCPU reaches `address` (GDB then holds the VM stopped)."""
    gdb.command(f"-break-insert *{address:#x}")
    gdb.resume()
    gdb.wait_for("*stopped")
    gdb.command("-break-delete")
