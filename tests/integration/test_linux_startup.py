"""qmpprof against a stock Debian kernel (examples/linux): the debug vmlinux (600 MB,
mostly DWARF) loads, the Linux adapter is chosen by its symbols, and `dump` prints
every vCPU. How fast is bench/startup.py's job; stacks through ORC are issue 15's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.guest.registry import choose_adapter
from tests.integration.conftest import run_qmpprof
from tests.linux_vm import LinuxGuest, kernel_abis, running_linux

VCPUS = 2


@pytest.fixture(scope="module", params=kernel_abis())
def linux(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinuxGuest]:
    # nokaslr: the kernel's link addresses are its guest addresses, so the dump's kernel
    # frames are named and dump's check that --kernel matches the guest applies.
    workdir = tmp_path_factory.mktemp("linux")
    with running_linux(workdir, "--smp", str(VCPUS), "--nokaslr", abi=request.param) as guest:
        yield guest


def test_the_debian_kernel_gets_the_linux_adapter(linux: LinuxGuest) -> None:
    assert choose_adapter(linux.kernel).name == "linux"


def test_dump_prints_every_vcpu(linux: LinuxGuest) -> None:
    done = run_qmpprof("dump", "--qmp-socket", linux.qmp, "--kernel", str(linux.kernel))
    assert done.returncode == 0, done.stderr
    headers = [line for line in done.stdout.splitlines() if line.startswith("vCPU ")]
    assert [header.split()[1] for header in headers] == [str(n) for n in range(VCPUS)]


def test_dump_json_names_kernel_frames_from_the_vmlinux(linux: LinuxGuest) -> None:
    done = run_qmpprof("dump", "--json", "--qmp-socket", linux.qmp, "--kernel", str(linux.kernel))
    assert done.returncode == 0, done.stderr
    vcpus = json.loads(done.stdout)["vcpus"]
    assert len(vcpus) == VCPUS
    kernel_leaves = [v["frames"][0] for v in vcpus if v["mode"] != "user" and v["frames"]]
    assert all(frame["module"] == Path(linux.kernel).name for frame in kernel_leaves)
