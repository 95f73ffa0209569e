"""A 32-bit process under a 64-bit kernel (compatibility mode, CS.L = 0): the example
guest's compat workload runs crunch32, the i386 build of crunch, beside its 64-bit
programs. Its user samples are 32-bit (4-byte words, i386 CFI from crunch32.elf); a
kernel sample taken on its behalf has 64-bit kernel frames, then, past the interrupt
frame, its 32-bit ones.

GDB is the oracle where it can be one: through gdb-i386-proxy.py, GDB's i386
architecture reads a vCPU stopped in crunch32's code as qemu-system-i386 would show it.
Which samples are crunch32's user samples is GDB's word too (the 32-bit user code
segment in CS), and qmpprof must say the same (user mode, 32-bit, crunch32).
No one GDB unwinds a 64-bit kernel stack into 32-bit user frames, so the user part of
those kernel samples is held to crunch32's documented chains instead (its functions,
down to crunch_main and _start).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest_vm import ROOT
from tests.integration.conftest import Guest, dump_json, running_guest
from tests.integration.gdb_mi import GdbMi
from tests.integration.test_gdb_agreement import REQUIRED_AGREEMENT, Tally, pause_randomly
from tests.seeds import seeded
from tests.unit.test_symbols import nm_functions

PROXY = ROOT / "examples" / "guest" / "gdb-i386-proxy.py"
PAUSES = int(os.environ.get("QMPPROF_COMPAT_PAUSES", "30"))
#: The guest's 32-bit user code segment (examples/guest/src/config.h): a vCPU whose CS
#: GDB reads as this one runs crunch32's code, the only 32-bit program.
USER32_CS = 0x3B


@pytest.fixture
def compat_guest(workdir: Path) -> Iterator[tuple[Guest, GdbMi]]:
    gdb_socket = str(workdir / "gdb.sock")
    boot = ("--gdb", gdb_socket, "--accel", "tcg", "--workload", "compat", "--smp", "2")
    with running_guest(workdir, *boot) as guest:
        assert guest.user_dir is not None
        gdb = GdbMi(guest.user_dir / "crunch32.elf", f"| {PROXY} {gdb_socket}")
        try:
            yield guest, gdb
        finally:
            gdb.close()


def test_a_32_bit_process_under_a_64_bit_kernel(compat_guest: tuple[Guest, GdbMi]) -> None:
    guest, gdb = compat_guest
    assert guest.user_dir is not None
    crunch32 = set(nm_functions(guest.user_dir / "crunch32.elf"))
    rng = seeded("compat workload")
    user, kernel_over_user = Tally(), 0
    for _ in range(PAUSES):
        pause_randomly(gdb, rng)
        for vcpu in dump_json(guest, "--user-dir", str(guest.user_dir)):
            process, thread = vcpu["process"], int(vcpu["vcpu"]) + 1
            frames = vcpu["frames"]
            ours = [(int(f["address"], 16), f["function"]) for f in frames]
            cs = gdb.evaluate("$cs", thread)
            assert cs is not None, "GDB read no CS"
            said = (vcpu["mode"], vcpu["bits"], process and process["name"])
            if int(cs, 0) == USER32_CS:  # the oracle's class: crunch32's own code
                assert said == ("user", 32, "crunch32"), said
                user.add(gdb.frames(thread), ours)
                continue
            assert said[0] != "user" or said[2] != "crunch32", f"CS {cs}, qmpprof {said}"
            if said[2] != "crunch32":
                continue
            assert vcpu["bits"] == 64
            in_program = [f["function"] for f in frames if f["module"] == "crunch32.elf"]
            if in_program:
                kernel_over_user += 1
                assert set(in_program) <= crunch32 and in_program[-2:] == ["crunch_main", "_start"]
        assert guest.status() == "paused", "qmpprof resumed a VM that GDB holds"
    print(user.report("crunch32 user samples against GDB (i386)"))
    print(f"crunch32 kernel samples with its user frames below: {kernel_over_user}")
    assert user.pauses > 0 and user.agreement >= REQUIRED_AGREEMENT
