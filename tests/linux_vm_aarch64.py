"""The AArch64 Linux guest (examples/linux/aarch64) as tests drive it: Debian's arm64
kernels (bookworm's 6.1 generic and cloud flavours, bookworm-backports' 6.12) under
`qemu-system-aarch64 -M virt -cpu max` (TCG), with examples/linux's init and workloads
cross-built, described by tests.linux_vm's LinuxGuest."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from tests.linux_vm import BOOT_ATTEMPTS, BOOT_TIMEOUT_S, PANIC, ROOT, LinuxGuest, nm_symbols

HERE = ROOT / "examples" / "linux" / "aarch64"
BOOT = HERE / "boot.sh"
FETCH = HERE / "fetch.sh"
#: The static programs (build/NAME, each its comm) and the sysroot with dynwork's files.
BUILD = HERE / "build"
#: The kernel symbol the guest's init looks up in /proc/kallsyms (arm64 has no
#: asm_exc_divide_error): "qmpprof-linux: kallsyms ADDRESS vectors".
KALLSYMS_ANCHOR = "vectors"
#: How boot.sh's lines become LinuxGuest's fields.
FIELD_TYPES = {"int": int, "Path": Path, "str": str}


def aarch64_kernel_abis() -> list[str]:
    """The arm64 kernels the tests boot (6.1 generic first, 6.1 cloud, 6.12): fetch.sh's
    list, which `make linux-guest-aarch64` fetches."""
    listed = subprocess.run([str(FETCH), "--list"], capture_output=True, text=True, check=True)
    return listed.stdout.split()


def boot_linux_aarch64(workdir: Path, *extra: str, abi: str | None = None) -> LinuxGuest:
    """Boot the guest on kernel `abi` (boot.sh's default if None) with boot.sh's `extra`
    arguments; booted once more if the kernel panics or Oopses while booting (boot.sh
    itself retries nothing here), any other failure raises."""
    serial = workdir / "serial.log"
    command = [str(BOOT), "--qmp", str(workdir / "qmp.sock"), "--serial", str(serial)]
    command += ["--retries", "0", *extra, *(["--abi", abi] if abi else [])]
    for attempt in range(1, BOOT_ATTEMPTS + 1):
        done = subprocess.run(command, capture_output=True, text=True, timeout=BOOT_TIMEOUT_S)
        if done.returncode == 0:
            said = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
            return LinuxGuest(
                **{f.name: FIELD_TYPES[str(f.type)](said[f.name]) for f in fields(LinuxGuest)}
            )
        log = serial.read_text(errors="replace") if serial.exists() else ""
        if attempt == BOOT_ATTEMPTS or not PANIC.search(log):
            break
        print(f"the AArch64 guest's kernel panicked while booting under TCG, again:\n{log}")
    raise RuntimeError(f"examples/linux/aarch64/boot.sh failed: {done.stderr.strip()}")


@contextmanager
def running_linux_aarch64(
    workdir: Path, *extra: str, abi: str | None = None
) -> Iterator[LinuxGuest]:
    """The AArch64 guest booted on kernel `abi` with boot.sh's `extra` arguments,
    stopped however the block ends."""
    guest = boot_linux_aarch64(workdir, *extra, abi=abi)
    try:
        yield guest
    finally:
        subprocess.run([str(BOOT), "stop", str(guest.pid)], check=False, timeout=60)


def aarch64_kernel_slide(guest: LinuxGuest) -> int:
    """The KASLR slide the guest says: where its /proc/kallsyms put KALLSYMS_ANCHOR minus
    where the debug vmlinux links it (0 with boot.sh --nokaslr)."""
    text = Path(guest.serial).read_text(errors="replace")
    said = re.search(rf"qmpprof-linux: kallsyms ([0-9a-f]+) {KALLSYMS_ANCHOR}\b", text)
    assert said is not None, "the guest's init did not print its kallsyms line"
    (linked,) = nm_symbols(guest.kernel)[KALLSYMS_ANCHOR]
    return int(said.group(1), 16) - linked
