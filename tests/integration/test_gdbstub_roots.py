"""An AArch64 guest's page-table roots read from QEMU's gdbstub without disturbing anyone
(target/gdbstub.py): the values GDB reads too, the VM running again after, a pause made
by someone else kept, a debugger's session left alone, a stub configured with `-gdb`
left as it was, and no stub of ours left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.errors import DirectMemoryUnavailable
from qmpprof.target.gdbstub import read_system_registers
from qmpprof.target.qmp import QmpSession
from tests.integration.conftest import Guest, running_guest
from tests.integration.gdb_mi import GdbMi

ROOTS = ("TTBR0_EL1", "TTBR1_EL1", "TCR_EL1")
BOOT = ("--arch", "aarch64", "--workload", "user", "--smp", "2")


def read_roots(guest: Guest) -> dict[int, dict[str, int]]:
    async def read() -> dict[int, dict[str, int]]:
        session = await QmpSession.connect(guest.qmp)
        try:
            return await read_system_registers(session, ROOTS)
        finally:
            await session.close()

    return asyncio.run(read())


def gdb_chardevs(guest: Guest) -> list[str]:
    chardevs = guest.qmp_call("query-chardev")
    assert isinstance(chardevs, list)
    return [str(c["filename"]) for c in chardevs if c.get("label") == "gdb"]


@pytest.fixture
def guest(workdir: Path) -> Iterator[Guest]:
    with running_guest(workdir, *BOOT) as booted:
        yield booted


def test_roots_are_read_and_the_vm_runs_on_with_no_stub_left(guest: Guest) -> None:
    values = read_roots(guest)
    assert sorted(values) == [0, 1]
    # examples/guest/README.md, "The AArch64 build": T0SZ = T1SZ = 16, 4 KiB granules
    # (TCR_EL1 0x12b5103510), one kernel table in every vCPU's TTBR1_EL1
    assert {v["TCR_EL1"] for v in values.values()} == {0x12B5103510}
    assert len({v["TTBR1_EL1"] for v in values.values()}) == 1
    assert guest.status() == "running"
    assert gdb_chardevs(guest) == []


def test_a_vm_paused_by_someone_else_stays_paused(guest: Guest) -> None:
    guest.qmp_call("stop")
    with pytest.raises(DirectMemoryUnavailable, match="not running"):
        read_roots(guest)
    assert guest.status() == "paused"
    assert gdb_chardevs(guest) == []


def test_a_configured_stub_is_borrowed_and_a_debugger_on_it_left_alone(workdir: Path) -> None:
    socket = str(workdir / "gdb.sock")
    with running_guest(workdir, *BOOT, "--gdb", socket) as guest:
        ours = read_roots(guest)
        assert guest.status() == "running"
        assert gdb_chardevs(guest) == [f"disconnected:unix:{socket},server=on"]
        gdb = GdbMi(guest.kernel, socket, architecture="aarch64")
        try:
            with pytest.raises(DirectMemoryUnavailable, match="not running"):
                read_roots(guest)  # GDB holds the VM
            gdb.resume()
            with pytest.raises(DirectMemoryUnavailable, match="debugger is attached"):
                read_roots(guest)  # GDB lets it run, still attached
            gdb.interrupt()
            for vcpu, values in ours.items():  # the same registers, GDB's own reading
                for name in ("TTBR1_EL1", "TCR_EL1"):
                    assert int(gdb.evaluate(f"${name}", vcpu + 1) or "", 0) == values[name]
            assert guest.status() == "paused"  # GDB holds it, as it did
            assert gdb.frames(1), "GDB's session no longer answers"
        finally:
            gdb.close()
        assert guest.status() == "running"
