"""An AArch64 program nobody here wrote, with no symbols: Debian's U-Boot for QEMU's virt
board (package u-boot-qemu, `-bios u-boot.bin`; its uboot.elf is stripped), sitting at
its prompt after its autoboot found nothing. `record` with no files gives an honest
address profile: every sample kept, no frame named, and its stacks unwound through the
firmware's frame records, each return address right after a call as GDB's disassembler
reads the guest's memory."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_no_symbols import _ADDRESS, record_unnamed

UBOOT = Path("/usr/lib/u-boot/qemu_arm64/u-boot.bin")
PROMPT = "=> "
#: U-Boot tries DHCP and TFTP first; it reaches its prompt within this (TCG, 2 cores).
PROMPT_WITHIN_S = 60
#: What GDB 13 calls the A64 calls (Arm ARM C6: BL, BLR, and the authenticated BLRA*).
_CALL = re.compile(r"\s(bl|blr|blraa|blrab|blraaz|blrabz)\s")


@pytest.fixture
def uboot(workdir: Path) -> Iterator[tuple[str, str]]:
    """U-Boot at its prompt: its QMP socket and its gdbstub's."""
    if not UBOOT.is_file():
        pytest.fail(f"no {UBOOT}: make test installs u-boot-qemu")
    qmp, gdb, pid_file = workdir / "qmp", workdir / "gdb", workdir / "pid"
    serial = workdir / "serial.log"
    command = [
        "qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-m", "512M", "-daemonize",
        "-pidfile", str(pid_file), "-qmp", f"unix:{qmp},server=on,wait=off",
        "-gdb", f"unix:{gdb},server=on,wait=off", "-display", "none",
        "-serial", f"file:{serial}", "-bios", str(UBOOT), "-accel", "tcg",
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=60)
    try:
        deadline = time.monotonic() + PROMPT_WITHIN_S
        while PROMPT not in serial.read_text(errors="replace"):  # the guest's own line
            assert time.monotonic() < deadline, f"no U-Boot prompt: {serial.read_text()!r}"
            time.sleep(0.2)
        yield str(qmp), str(gdb)
    finally:
        subprocess.run(["kill", pid_file.read_text().strip()], check=False)


def folded_stacks(output: Path) -> list[list[int]]:
    """Each stack of a folded file, leaf first, its frames as addresses."""
    stacks = []
    for line in output.read_text().splitlines():
        frames, _ = line.rsplit(" ", 1)
        names = frames.split(";")[1:]  # the first is the address space's label
        assert all(_ADDRESS.match(name) for name in names), line
        stacks.append([int(name, 16) for name in reversed(names)])
    return stacks


def disassembled(gdb_socket: str, addresses: list[int]) -> list[str]:
    """GDB's disassembly of the instruction before each address (the VM held meanwhile)."""
    commands = ["-ex", "set architecture aarch64", "-ex", f"target remote {gdb_socket}"]
    for address in addresses:
        commands += ["-ex", f"x/i {address - 4:#x}"]
    done = subprocess.run(
        ["gdb-multiarch", "-batch", "-nx", *commands, "-ex", "detach"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [
        line for line in done.stdout.splitlines() if re.match(r"\s*(?:=> )?0x[0-9a-f]+:", line)
    ]
    assert len(lines) == len(addresses), done.stdout + done.stderr
    return lines


def test_uboot_without_symbols_unwinds_through_its_frame_records(
    uboot: tuple[str, str], workdir: Path
) -> None:
    qmp, gdb = uboot
    output = workdir / "uboot.folded"
    summary = record_unnamed(qmp, output, "--idle")
    assert "samples: kernel" in summary
    stacks = folded_stacks(output)
    assert stacks
    deep = [stack for stack in stacks if len(stack) >= 4]
    assert deep, stacks  # its console loop calls a few functions deep
    returns = sorted({address for stack in stacks for address in stack[1:]})
    for address, line in zip(returns, disassembled(gdb, returns), strict=True):
        assert _CALL.search(line + " "), f"{address:#x} follows no call: {line}"
