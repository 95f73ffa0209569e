"""Issue 16's third acceptance bullet: with no --sysroot at all, dynwork's stacks still
unwind through libc with the .eh_frame the guest loaded, most of which dynwork never
touched (so its page tables do not map it): those pages come from the guest kernel's
page cache (guest/linux/page_cache.py).

The Linux example guest runs dynwork alone on 2 vCPUs, KASLR on. At each QMP `stop`,
`qmpprof dump --json` runs twice on the same pause, without and with the sysroot (the
guest's very files, with libc's debug file): the frames' addresses must be the same
(each machine frame once: the sysroot's DWARF adds inlined calls), down to `_start`,
and every function named without the sysroot must be the one named with it (up to
aliases at one address and GCC's clone suffixes): never a wrong name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest_vm import qmp_call
from tests.integration.conftest import run_cached
from tests.integration.gdb_mi import same_function, text_aliases
from tests.linux_vm import LinuxGuest, guest_sysroot, kernel_abis, running_linux

#: Pauses at most, and dynwork's user stacks to compare before stopping.
MAX_PAUSES = 20
ENOUGH_STACKS = 3
KERNEL_HALF = 1 << 63
LIBC = "lib/x86_64-linux-gnu/libc.so.6"
#: (address, function) of each machine frame, leaf first.
Stack = list[tuple[int, str | None]]


def dynwork_stack(guest: LinuxGuest, *extra: str) -> Stack | None:
    """dynwork's user frames in `qmpprof dump --json` of the paused guest, None when no
    vCPU runs it; the VM stays paused."""
    done = run_cached(
        "dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), *extra
    )
    assert done.returncode == 0, done.stderr
    status = qmp_call(guest.qmp, "query-status")
    assert isinstance(status, dict) and status["status"] == "paused", "qmpprof resumed it"
    for vcpu in json.loads(done.stdout)["vcpus"]:
        if (vcpu["process"] or {}).get("name") != "dynwork":
            continue
        frames = [f for f in vcpu["frames"] if not f["inlined"]]
        user = [(int(f["address"], 16), f["function"]) for f in frames]
        user = [(address, name) for address, name in user if address < KERNEL_HALF]
        return user or None
    return None


def pauses(guest: LinuxGuest) -> Iterator[tuple[Stack, Stack]]:
    """(without the sysroot, with it) at each pause that caught dynwork in user code."""
    for _ in range(MAX_PAUSES):
        qmp_call(guest.qmp, "stop")
        try:
            bare = dynwork_stack(guest)
            full = dynwork_stack(guest, "--sysroot", str(guest_sysroot(guest)))
        finally:
            qmp_call(guest.qmp, "cont")
        if bare is not None and full is not None:
            yield bare, full


@pytest.fixture(scope="module", params=kernel_abis())
def stacks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:  # type: ignore[type-arg]
    """The guest's sysroot (its kernel's: bullseye's 5.10 has its own libc) and the pairs."""
    workdir = tmp_path_factory.mktemp("linux-page-cache")
    boot = ("--smp", "2", "--workloads", "dynwork")
    with running_linux(workdir, *boot, abi=request.param) as guest:
        found = []
        for pair in pauses(guest):
            found.append(pair)
            if len(found) >= ENOUGH_STACKS:
                break
        return guest_sysroot(guest), found


def aliases(sysroot: Path) -> dict[str, str]:
    """One name per address over dynwork, libc and the debug files, symbol versions
    dropped (the debug file's `__libc_start_main@@GLIBC_2.34` is .dynsym's
    `__libc_start_main`)."""
    found: dict[str, str] = {}
    paths = [sysroot / "bin/dynwork", sysroot / LIBC]
    for path in [*paths, *sorted((sysroot / "usr/lib/debug/.build-id").glob("*/*.debug"))]:
        found.update(text_aliases(path))
    return {name.split("@")[0]: alias.split("@")[0] for name, alias in found.items()}


def test_without_a_sysroot_dynwork_unwinds_to_start_as_with_it(
    stacks: tuple[Path, list[tuple[Stack, Stack]]],
) -> None:
    sysroot, pairs = stacks
    assert pairs, "dynwork was never caught in user code"
    names = aliases(sysroot)
    for bare, full in pairs:
        shown = f"\nwithout: {bare}\nwith:    {full}"
        assert [a for a, _ in bare] == [a for a, _ in full], shown
        assert full[-1][1] == "_start", shown
        assert "__libc_start_main" in [same_function(n, {}) for _, n in bare], shown
        for (_, mine), (_, theirs) in zip(bare, full, strict=True):
            if mine is not None:
                assert same_function(mine, names) == same_function(theirs, names), shown
