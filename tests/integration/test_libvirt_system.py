"""The Linux example guest as a TCG domain of a real system-mode libvirtd, started here
as root (tests/libvirt_system.py), profiled as a user on such a host would:
`qmpprof --libvirt NAME`, `dump --libvirt`, `top --libvirt`, `serve --libvirt`, a domain
libvirt does not have, a domain suspended by its owner, Ctrl-C, and a domain given its
own QMP socket.

Each test ends with the domain running (or, suspended by the test, still suspended),
no bridge process of qmpprof's left, and libvirtd's log free of the end-of-file error
a client that drops its connection leaves. One libvirtd and one boot for the file but
the own-socket domain's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import interrupted_when, run_qmpprof
from tests.integration.test_libvirt import assert_one_line_error, recording_began
from tests.integration.test_serve import samples_by_label, serving, wait_for
from tests.libvirt_system import (
    QEMU_USER,
    LinuxDomain,
    bridges,
    linux_domain,
    missing,
    system_libvirtd,
)
from tests.libvirt_vm import Libvirt

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

DOMAIN = "qmpprof-sys"
#: What libvirtd logs when a client's connection drops without closing it.
DROPPED = "End of file while reading data"


@pytest.fixture(scope="module")
def libvirt() -> Iterator[Libvirt]:
    with system_libvirtd() as daemon:
        yield daemon


@pytest.fixture(scope="module")
def domain(libvirt: Libvirt) -> Iterator[LinuxDomain]:
    with linux_domain(libvirt, DOMAIN) as booted:
        yield booted


@pytest.fixture(autouse=True)
def nothing_left(libvirt: Libvirt) -> Iterator[None]:
    """After each test: no bridge left, and libvirtd logged no dropped connection."""
    log = libvirt.root / "libvirtd.log"
    before = _dropped(log)
    yield
    assert bridges() == []
    assert _dropped(log) == before, log.read_text(errors="replace")[-2000:]


def _dropped(log: Path) -> int:
    return log.read_text(errors="replace").count(DROPPED) if log.exists() else 0


def libvirt_args(domain: LinuxDomain, command: str = "record") -> list[str]:
    return [command, "--libvirt", domain.name, "--libvirt-uri", "qemu:///system"]


def test_record_through_libvirt_is_nonblocking_by_default(
    libvirt: Libvirt, domain: LinuxDomain, tmp_path: Path
) -> None:
    out = tmp_path / "profile.folded"
    done = run_qmpprof(*libvirt_args(domain), "--duration", "3", "-o", str(out))
    assert done.returncode == 0, done.stderr
    pid = domain.qemu_pid()
    said = f"QEMU pid {pid} (user {QEMU_USER}, from libvirt's pid file /run/libvirt/qemu/"
    assert said in done.stderr, done.stderr
    assert "a QMP round trip through libvirt takes" in done.stderr
    assert "so sampling nonblocking (--stop pauses it all the same)" in done.stderr
    stacks = out.read_text()
    assert "_start;__libc_start_main_impl" in stacks  # user frames named from its memory
    assert libvirt.domstate(domain.name) == "running"


def test_stop_forces_stop_mode_through_libvirt(
    libvirt: Libvirt, domain: LinuxDomain, tmp_path: Path
) -> None:
    out = tmp_path / "profile.folded"
    args = ("--duration", "2", "--rate", "10", "--stop", "-o", str(out))
    done = run_qmpprof(*libvirt_args(domain), *args)
    assert done.returncode == 0, done.stderr
    assert "sampling nonblocking" not in done.stderr
    assert "held paused" in done.stdout or "paused" in done.stdout, done.stdout
    assert out.read_text()
    assert libvirt.domstate(domain.name) == "running"


def test_dump_through_libvirt(libvirt: Libvirt, domain: LinuxDomain) -> None:
    done = run_qmpprof(*libvirt_args(domain, "dump"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("vCPU 0 ")
    assert libvirt.domstate(domain.name) == "running"


def test_top_through_libvirt_until_ctrl_c(libvirt: Libvirt, domain: LinuxDomain) -> None:
    """Not on a terminal, top prints a snapshot a refresh; SIGINT ends it."""
    args = [*libvirt_args(domain, "top"), "--refresh", "0.5"]
    status, err = interrupted_when(args, _names_a_process)
    assert status == 0, err
    assert libvirt.domstate(domain.name) == "running"


def _names_a_process(line: str) -> bool:
    """A snapshot with a sampled process in it."""
    return "processes: " in line and not line.rstrip().endswith("processes: -")


def test_serve_through_libvirt(libvirt: Libvirt, domain: LinuxDomain) -> None:
    """Two scrapes of the domain, served under its name: each a profile of its
    processes, the sampling mode said once in the log (its figures change each time)."""
    uri = ("--libvirt", domain.name, "--libvirt-uri", "qemu:///system")
    with serving({}, None, *uri) as serve:
        bodies = [serve.get(f"/vm/{domain.name}/debug/pprof/profile?seconds=2") for _ in range(2)]
        answered = lambda: sum(" 200" in line for line in serve.log) == 2  # noqa: E731
        wait_for(answered, "both answers in the log")
        log = list(serve.log)
    for status, _, body in bodies:
        assert status == 200, body
        assert set(samples_by_label(body, "vm")) == {domain.name}
        assert len(samples_by_label(body, "process")) > 1, samples_by_label(body, "process")
    assert sum("sampling nonblocking" in line for line in log) == 1, log
    assert libvirt.domstate(domain.name) == "running"


def test_a_domain_libvirt_does_not_have(libvirt: Libvirt) -> None:
    args = ("dump", "--libvirt", "no-such-domain", "--libvirt-uri", "qemu:///system")
    done = run_qmpprof(*args)
    assert_one_line_error(done, "libvirt domain no-such-domain: Domain not found")


def test_a_suspended_domain_is_an_error_to_record_and_stays_suspended(
    libvirt: Libvirt, domain: LinuxDomain, tmp_path: Path
) -> None:
    out = tmp_path / "profile.folded"
    libvirt.virsh("suspend", domain.name)
    try:
        done = run_qmpprof(*libvirt_args(domain), "--duration", "2", "-o", str(out))
        assert libvirt.domstate(domain.name) == "paused"
        dumped = run_qmpprof(*libvirt_args(domain, "dump"))  # debugging a paused VM
        assert libvirt.domstate(domain.name) == "paused"
    finally:
        libvirt.virsh("resume", domain.name)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("qmpprof: error: no sample taken: the VM was paused by someone else")
    assert out.exists()  # written all the same, empty
    assert dumped.returncode == 0 and dumped.stdout.startswith("vCPU 0 "), dumped.stderr


def test_ctrl_c_leaves_the_domain_running(
    libvirt: Libvirt, domain: LinuxDomain, tmp_path: Path
) -> None:
    """The bridge, in a session of its own, lives on to carry qmpprof's last commands."""
    args = [*libvirt_args(domain), "--duration", "60", "--stop", "-o", str(tmp_path / "p.folded")]
    status, rest = interrupted_when(args, recording_began, on_stderr=True, group=True)
    assert status == 0, rest
    assert libvirt.domstate(domain.name) == "running"


def test_a_domain_with_its_own_qmp_socket_is_reached_there(
    libvirt: Libvirt, domain: LinuxDomain, tmp_path: Path
) -> None:
    """Booted after the others' (one Linux guest at a time on two cores)."""
    libvirt.virsh("suspend", domain.name)  # the first domain gets out of the way
    try:
        with linux_domain(libvirt, "qmpprof-own", own_monitor=True) as own:
            out = tmp_path / "profile.folded"
            args = ("--duration", "2", "--stop", "-o", str(out))
            done = run_qmpprof(*libvirt_args(own), *args)
            assert done.returncode == 0, done.stderr
            pid = own.qemu_pid()
            said = (
                f"libvirt domain {own.name}: its own QMP socket {own.own_monitor}, QEMU pid {pid}"
            )
            assert said in done.stderr, done.stderr
            assert "round trip through libvirt" not in done.stderr
            assert libvirt.domstate(own.name) == "running"
    finally:
        libvirt.virsh("resume", domain.name)
