"""A Linux guest's loaded kernel modules, read by qmpprof from the guest's module list.

The oracle is the guest's own word: examples/linux's init loads crc8.ko and prints the
name and address of every module /proc/modules lists, and where /proc/kallsyms puts
crc8's functions. `record` must read the same list (names and text addresses) and keep
it in its capture's header, for `report`; with --module-dir holding the crc8.ko the
guest loaded, crc8's functions must be named where kallsyms puts them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import RawSample, RegisterSet
from qmpprof.record.qmpcap import read_capture
from tests.integration.conftest import run_cached
from tests.linux_vm import LinuxGuest, initramfs_file, kernel_abis, running_linux


@pytest.fixture(scope="module", params=kernel_abis())
def module_guest(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("modules"), abi=request.param) as guest:
        yield guest


def proc_modules(guest: LinuxGuest) -> list[tuple[str, int]]:
    """What /proc/modules listed, as the guest's init printed it."""
    said = re.findall(
        r"qmpprof-linux: module (\S+) at 0x([0-9a-f]+)", Path(guest.serial).read_text()
    )
    return [(name, int(address, 16)) for name, address in said]


def test_record_reads_the_modules_proc_modules_lists(
    module_guest: LinuxGuest, tmp_path: Path
) -> None:
    listed = proc_modules(module_guest)
    assert "crc8" in dict(listed), "the guest's init loaded no crc8.ko: nothing is tested"
    capture = tmp_path / "run.qmpcap"
    target = ["--qmp-socket", module_guest.qmp, "--kernel", str(module_guest.kernel)]
    done = run_cached("record", *target, "--duration", "1", "--rate", "10", "-o", str(capture))
    assert done.returncode == 0, done.stderr
    with read_capture(capture) as read:
        recorded = read.recording.kernel_modules
    assert sorted((m.name, m.base) for m in recorded) == sorted(listed)


def kallsyms_of_crc8(guest: LinuxGuest) -> dict[str, int]:
    """Where the guest's /proc/kallsyms puts crc8.ko's functions (its text symbols, t or
    T; init printed them)."""
    serial = Path(guest.serial).read_text()
    said = re.findall(r"qmpprof-linux: ksym ([0-9a-f]+) [tT] (\S+)", serial)
    return {name: int(address, 16) for address, name in said}


def test_module_dir_names_a_modules_functions_as_kallsyms_does(
    module_guest: LinuxGuest, tmp_path: Path
) -> None:
    """With --module-dir holding the guest's crc8.ko, each function kallsyms lists in
    crc8 is symbolized by its name at its address."""
    expected = kallsyms_of_crc8(module_guest)
    assert expected, "the guest's init printed no crc8 symbol: nothing is tested"
    crc8 = initramfs_file(f"lib/modules/{module_guest.abi}/crc8.ko", module_guest)
    (tmp_path / "crc8.ko").write_bytes(crc8)
    options = TargetOptions(module_guest.qmp, module_guest.kernel, module_dirs=(tmp_path,))
    analyzer = build_analyzer(options)

    async def connect() -> None:
        async with connected(options, analyzer):
            pass

    asyncio.run(connect())
    named = {}
    for name, address in expected.items():
        frame = analyzer.analyze(kernel_leaf(address)).frames[0]
        named[name] = (frame.function, frame.offset, frame.module)
    assert named == {name: (name, 0, "crc8") for name in expected}


def kernel_leaf(address: int) -> RawSample:
    registers = RegisterSet(0, {"rip": address, "rsp": 0, "rbp": 0}, 0x10, 0, False, 64)
    return RawSample(0.0, registers)
