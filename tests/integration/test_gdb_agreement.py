"""With GDB holding the guest stopped at random points, `qmpprof dump --json` must agree
with GDB's backtrace frame for frame, inlined calls included (both list them, above
their caller at the same address), and must leave the VM paused.

The points are drawn from a fixed seed (tests.seeds; QMPPROF_SEED=N draws others).

The fp guest is checked with the default unwinder; the nofp guest (-O2
-fomit-frame-pointer, only DWARF CFI can unwind it) with the default unwinder and,
for comparison, with frame pointers alone.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, dump_json, running_guest
from tests.integration.gdb_mi import (
    SIGNAL_FRAME,
    Frames,
    GdbFrame,
    GdbMi,
    agree,
    without_hidden_inline_leaf,
)
from tests.seeds import seeded

REQUIRED_AGREEMENT = 0.99


@dataclass
class Tally:
    pauses: int = 0
    agreed: int = 0
    in_interrupt: int = 0
    with_inlined: int = 0
    disagreements: list[tuple[Frames, Frames]] = field(default_factory=list)

    def add(self, gdb: list[GdbFrame], ours: Frames) -> None:
        self.pauses += 1
        self.in_interrupt += any(f.function == SIGNAL_FRAME for f in gdb)
        # an inlined call is listed above its caller, at the same address
        self.with_inlined += any(a.address == b.address for a, b in itertools.pairwise(gdb))
        if agree(gdb, without_hidden_inline_leaf(ours, gdb)):
            self.agreed += 1
        else:
            self.disagreements.append(([(f.address, f.function) for f in gdb], ours))

    @property
    def agreement(self) -> float:
        return self.agreed / self.pauses if self.pauses else 0.0

    def report(self, label: str) -> str:
        lines = [
            f"{label}: agreement {self.agreement:.1%} of {self.pauses} pauses "
            f"({self.in_interrupt} inside the timer interrupt, "
            f"{self.with_inlined} with inlined calls)"
        ]
        for gdb, ours in self.disagreements[:3]:
            lines.append(f"  gdb:     {[(hex(a), n) for a, n in gdb]}")
            lines.append(f"  qmpprof: {[(hex(a), n) for a, n in ours]}")
        return "\n".join(lines)


@contextmanager
def guest_under_gdb(workdir: Path, *boot_args: str) -> Iterator[tuple[Guest, GdbMi]]:
    """The example guest under TCG with GDB/MI attached to its gdbstub."""
    gdb_socket = str(workdir / "gdb.sock")
    with running_guest(workdir, "--gdb", gdb_socket, "--accel", "tcg", *boot_args) as guest:
        gdb = GdbMi(guest.kernel, guest.gdb)
        try:
            yield guest, gdb
        finally:
            gdb.close()


@pytest.fixture
def gdb_guest(request: pytest.FixtureRequest, workdir: Path) -> Iterator[tuple[Guest, GdbMi]]:
    with guest_under_gdb(workdir, "--variant", request.param) as pair:
        yield pair


def qmpprof_frames(guest: Guest, unwind: str) -> Frames:
    frames = dump_json(guest, "--unwind", unwind)[0]["frames"]
    return [(int(f["address"], 16), f["function"]) for f in frames]


def pause_randomly(gdb: GdbMi, rng: random.Random) -> list[GdbFrame]:
    gdb.resume()
    time.sleep(rng.uniform(0.001, 0.05))  # chooses where to pause; not a synchronisation
    gdb.interrupt()
    return gdb.frames()


def run_pauses(
    guest: Guest, gdb: GdbMi, pauses: int, unwinders: dict[str, int], name: str
) -> dict[str, Tally]:
    """qmpprof's stack against GDB's at `pauses` random pauses, per `--unwind` method;
    `unwinders`: each method, with every how many pauses it is asked (1: at each)."""
    rng = seeded(name)
    tallies = {unwind: Tally() for unwind in unwinders}
    for pause in range(pauses):
        expected = pause_randomly(gdb, rng)
        for unwind, tally in tallies.items():
            if pause % unwinders[unwind] == 0:
                tally.add(expected, qmpprof_frames(guest, unwind))
        assert guest.status() == "paused", "qmpprof resumed a VM that GDB holds"
    return tallies


@pytest.mark.parametrize("gdb_guest", ["fp"], indirect=True)
def test_fp_guest_agrees_with_gdb(gdb_guest: tuple[Guest, GdbMi]) -> None:
    guest, gdb = gdb_guest
    pauses = int(os.environ.get("QMPPROF_GDB_PAUSES", "100"))
    tally = run_pauses(guest, gdb, pauses, {"auto": 1}, "fp guest")["auto"]
    print(tally.report("fp guest, --unwind auto"))
    assert tally.agreement >= REQUIRED_AGREEMENT


@pytest.mark.parametrize("gdb_guest", ["nofp"], indirect=True)
def test_nofp_guest_agrees_with_gdb_through_cfi(gdb_guest: tuple[Guest, GdbMi]) -> None:
    guest, gdb = gdb_guest
    pauses = int(os.environ.get("QMPPROF_GDB_PAUSES", "140"))
    # Frame pointers alone, shown beside CFI, get a seventh of the pauses: nothing is
    # asserted of them (they fail where the code keeps none), and each is a dump.
    tallies = run_pauses(guest, gdb, pauses, {"auto": 1, "fp": 7}, "nofp guest")
    print(tallies["auto"].report("nofp guest, --unwind auto (CFI)"))
    print(tallies["fp"].report("nofp guest, --unwind fp (frame pointers alone)"))
    assert tallies["auto"].in_interrupt > 0, "no pause landed in the timer interrupt"
    assert tallies["auto"].agreement >= REQUIRED_AGREEMENT


@pytest.fixture
def user_gdb_guest(workdir: Path) -> Iterator[tuple[Guest, GdbMi]]:
    with guest_under_gdb(workdir, "--workload", "user", "--smp", "2") as pair:
        yield pair


def program_names(gdb: GdbMi) -> dict[int, str]:
    """Address space (CR3) -> program name, from the guest's process table as GDB reads it.

    The address space decides which binary is mapped; `cpu_current` can already name
    the next process while a CPU is in the middle of switching to it."""
    names = {}
    for slot in range(8):
        cr3 = gdb.evaluate(f"process_table[{slot}].cr3", 1)
        value = gdb.evaluate(f"process_table[{slot}].name", 1) or ""
        quoted = re.match(r'^\\"([^\\]*)', value)  # "crunch", '\000' <repeats …>
        if cr3 and cr3 != "0" and quoted and quoted.group(1):
            names[int(cr3) & ~0xFFF] = quoted.group(1)
    return names


def gdb_frames_in(gdb: GdbMi, guest: Guest, vcpu: int, program: str | None) -> list[GdbFrame]:
    """GDB's frames of one vCPU, with the symbols of `program` loaded if it is given."""
    thread = vcpu + 1
    path = guest.user_dir / f"{program}.elf" if guest.user_dir and program else None
    if path is None or not path.exists():
        return gdb.frames(thread)
    gdb.console(f"add-symbol-file {path}")
    try:
        return gdb.frames(thread)
    finally:
        gdb.console(f"remove-symbol-file {path}")


def run_user_workload_pauses(
    guest: Guest, gdb: GdbMi, pauses: int, name: str, *dump_args: str
) -> dict[str, Tally]:
    """Every vCPU's stack at `pauses` random points of the user workload, qmpprof's
    against GDB's (with the symbols of the program the vCPU's address space runs), by
    mode; the VM stays paused."""
    rng = seeded(name)
    tallies: dict[str, Tally] = {mode: Tally() for mode in ("user", "kernel", "idle")}
    programs: dict[int, str] = {}
    for _ in range(pauses):
        pause_randomly(gdb, rng)
        programs = programs or program_names(gdb)
        for vcpu in dump_json(guest, "--user-dir", str(guest.user_dir), *dump_args):
            frames = vcpu["frames"]
            assert isinstance(frames, list)
            ours = [(int(f["address"], 16), f["function"]) for f in frames]
            program = programs.get(int(str(vcpu["cr3"]), 16))
            expected = gdb_frames_in(gdb, guest, int(str(vcpu["vcpu"])), program)
            tallies[str(vcpu["mode"])].add(expected, ours)
        assert guest.status() == "paused", "qmpprof resumed a VM that GDB holds"
    for mode, tally in tallies.items():
        print(tally.report(f"{name}, {mode} samples"))
    return tallies


def test_user_workload_on_two_vcpus_agrees_with_gdb(
    user_gdb_guest: tuple[Guest, GdbMi],
) -> None:
    guest, gdb = user_gdb_guest
    pauses = int(os.environ.get("QMPPROF_GDB_PAUSES", "140"))
    tallies = run_user_workload_pauses(guest, gdb, pauses, "user workload")
    assert tallies["user"].pauses > 0 and tallies["kernel"].pauses > 0
    assert tallies["user"].agreement >= REQUIRED_AGREEMENT
    assert tallies["kernel"].agreement >= REQUIRED_AGREEMENT
