"""With GDB holding the guest stopped at random points, `qmpprof dump --json` must agree
with GDB's backtrace frame for frame, and must leave the VM paused."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, boot_guest, run_qmpprof, stop_guest
from tests.integration.gdb_mi import GdbFrame, GdbMi

PAUSES = int(os.environ.get("QMPPROF_GDB_PAUSES", "100"))
REQUIRED_AGREEMENT = 0.99


@pytest.fixture
def gdb_guest(workdir: Path) -> Iterator[tuple[Guest, GdbMi]]:
    guest = boot_guest(workdir, "--gdb", str(workdir / "gdb.sock"), "--accel", "tcg")
    gdb = GdbMi(guest.kernel, guest.gdb)
    try:
        yield guest, gdb
    finally:
        gdb.close()
        stop_guest(guest)


def qmpprof_frames(guest: Guest) -> list[tuple[int, str | None]]:
    done = run_qmpprof("dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    assert done.returncode == 0, done.stderr
    vcpu = json.loads(done.stdout)["vcpus"][0]
    return [(int(f["address"], 16), f["function"]) for f in vcpu["frames"]]


def agree(gdb: list[GdbFrame], ours: list[tuple[int, str | None]]) -> bool:
    """Same addresses frame for frame, and the same function wherever GDB names one
    (GDB calls an interrupt frame '<signal handler called>' instead of its function)."""
    if [f.address for f in gdb] != [address for address, _ in ours]:
        return False
    return all(
        f.function == name
        for f, (_, name) in zip(gdb, ours, strict=True)
        if f.function != "<signal handler called>"
    )


def test_dump_agrees_with_gdb_at_random_pauses(gdb_guest: tuple[Guest, GdbMi]) -> None:
    guest, gdb = gdb_guest
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    disagreements = []
    for _ in range(PAUSES):
        gdb.resume()
        time.sleep(rng.uniform(0.001, 0.05))  # where to pause, not a synchronisation
        gdb.interrupt()
        expected = gdb.frames()
        actual = qmpprof_frames(guest)
        if not agree(expected, actual):
            disagreements.append(([(f.address, f.function) for f in expected], actual))
        assert guest.status() == "paused", "qmpprof resumed a VM that GDB holds"
    agreement = 1 - len(disagreements) / PAUSES
    print(f"\nGDB agreement: {agreement:.1%} of {PAUSES} pauses (seed {seed})")
    for expected, actual in disagreements[:5]:
        print(f"  gdb:     {expected}\n  qmpprof: {actual}")
    assert agreement >= REQUIRED_AGREEMENT
