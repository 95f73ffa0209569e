"""The Linux example guest (examples/linux) as tests and benchmarks drive it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "examples" / "linux" / "boot.sh"
#: Booting Debian's kernel under TCG on a busy 2-core host, after a first download.
BOOT_TIMEOUT_S = 900


@dataclass(frozen=True)
class LinuxGuest:
    """A running Linux example guest: what boot.sh printed."""

    pid: int
    kernel: Path  # the debug vmlinux
    vmlinuz: Path
    qmp: str
    serial: str


def boot_linux(workdir: Path, *extra: str) -> LinuxGuest:
    """Boot the guest (fetching Debian's kernel first if this machine has not yet)."""
    qmp = workdir / "qmp.sock"
    command = [str(BOOT), "--qmp", str(qmp), "--serial", str(workdir / "serial.log"), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BOOT_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"examples/linux/boot.sh failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return LinuxGuest(
        int(values["pid"]),
        Path(values["kernel"]),
        Path(values["vmlinuz"]),
        values["qmp"],
        values["serial"],
    )


@contextmanager
def running_linux(workdir: Path, *extra: str) -> Iterator[LinuxGuest]:
    """The Linux guest booted with boot.sh's `extra` arguments, stopped however the
    block ends."""
    guest = boot_linux(workdir, *extra)
    try:
        yield guest
    finally:
        subprocess.run([str(BOOT), "stop", str(guest.pid)], check=False, timeout=60)
