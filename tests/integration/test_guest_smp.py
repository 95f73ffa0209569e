"""The example guest's user workload on 8 vCPUs under multi-threaded TCG stays mostly idle.

Three processes need 0.7 of one CPU; the other 7.3 CPUs' worth is halted, apart from
each CPU's timer handler (examples/guest/README.md, "SMP"). A global counter once bumped
by every CPU in the handler's loop made handlers outlast the tick under multi-threaded
TCG, and every CPU stayed in timer_account_leaf for good; the handler's guest-time cap
keeps that from coming back whatever the host's speed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.target.registers import parse_all
from tests.guest_vm import BareQmp, Guest, running_guest

CPUS = 8
#: Register dumps of the running VM (the VM is never paused: nothing of qmpprof runs),
#: back to back: a few seconds, long enough for the old storm to settle in (on 2 quiet
#: host cores the old guest had 36-43 % halted in 150 dumps, 15-19 % over 8 s).
DUMPS = 400


@pytest.fixture(scope="module")
def eight_cpu_guest() -> Iterator[Guest]:
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-smp-") as name,
        running_guest(
            Path(name),
            *("--accel", "tcg,thread=multi", "--smp", str(CPUS), "--workload", "user"),
            *("--timeout", "180"),
        ) as guest,
    ):
        yield guest


def test_eight_cpus_are_mostly_halted(eight_cpu_guest: Guest) -> None:
    qmp = BareQmp(eight_cpu_guest.qmp)
    try:
        dumps = [
            str(qmp.call("human-monitor-command", {"command-line": "info registers -a"}))
            for _ in range(DUMPS)
        ]
    finally:
        qmp.close()
    states = [regs.halted for text in dumps for regs in parse_all(text)]
    assert len(states) == DUMPS * CPUS
    halted = sum(states) / len(states)
    assert halted > 0.5, f"only {halted:.0%} of {len(states)} vCPU states halted"
