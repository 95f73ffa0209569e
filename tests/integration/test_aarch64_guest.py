"""The AArch64 example guest through qmpprof's other paths, as the x86 one is checked:
every memory backend gives the same stacks on the same paused VM (direct walks the page
tables itself; memsave and hmp let QEMU translate), and a recording saved as .qmpcap
gives, through `report` and `report --reunwind`, the folded output the recording wrote."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, run_qmpprof, running_guest
from tests.integration.test_gdb_agreement_aarch64 import dump_vcpus

BOOT = ("--arch", "aarch64", "--workload", "user", "--smp", "2")


@pytest.fixture
def aarch64_guest(workdir: Path) -> Iterator[Guest]:
    with running_guest(workdir, *BOOT) as guest:
        yield guest


def test_every_memory_backend_gives_the_same_stacks(aarch64_guest: Guest) -> None:
    guest = aarch64_guest
    dump_vcpus(guest, "--memory", "direct")  # the page-table roots, read while it runs
    guest.qmp_call("stop")
    try:
        dumps = {memory: dump_vcpus(guest, "--memory", memory) for memory in ("direct", "memsave")}
        dumps["hmp"] = dump_vcpus(guest, "--memory", "hmp")
    finally:
        guest.qmp_call("cont")
    assert dumps["hmp"] == dumps["memsave"] == dumps["direct"]
    assert {str(vcpu["mode"]) for vcpu in dumps["direct"]} <= {"user", "kernel", "idle"}


def test_report_reproduces_the_recorded_folded_output(aarch64_guest: Guest, workdir: Path) -> None:
    guest = aarch64_guest
    recorded, capture = workdir / "live.folded", workdir / "live.qmpcap"
    done = run_qmpprof(
        "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), "--user-dir",
        str(guest.user_dir), "--duration", "3", "-o", str(recorded), "-o", str(capture),
        "--capture-memory", cached=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "memory: memsave" not in done.stderr, done.stderr  # read directly
    assert recorded.read_text().strip()
    for extra in ((), ("--reunwind",)):
        replayed = workdir / f"replay{len(extra)}.folded"
        report = run_qmpprof(
            "report", str(capture), "--kernel", str(guest.kernel), "--user-dir",
            str(guest.user_dir), "-o", str(replayed), *extra,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        assert replayed.read_text() == recorded.read_text()
