"""Boot the example guest in a real QEMU for each test that asks for one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guest_vm import Guest, running_guest, scratch_ram_file

__all__ = [
    "Guest",
    "dump_json",
    "record_args",
    "record_folded",
    "run_qmpprof",
    "running_guest",
    "scratch_ram_file",
]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory path: unix socket paths are limited to about 100 bytes."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="qmpprof-it-") as name:
        yield Path(name)


@pytest.fixture
def guest(workdir: Path) -> Iterator[Guest]:
    with running_guest(workdir, "--accel", os.environ.get("ACCEL", "tcg")) as booted:
        yield booted


def run_qmpprof(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """qmpprof as a user runs it: a separate process, its exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "qmpprof", *args], capture_output=True, text=True, timeout=timeout
    )


def record_args(qmp: str, kernel: Path, seconds: int, output: Path, *extra: str) -> list[str]:
    """qmpprof's arguments to record the QEMU at `qmp` for `seconds` into `output`."""
    return [
        "--qmp-socket",
        qmp,
        "--kernel",
        str(kernel),
        "--duration",
        str(seconds),
        "-o",
        str(output),
        *extra,
    ]


def dump_json(guest: Guest, *extra: str) -> list[dict[str, Any]]:
    """The vCPUs of `qmpprof dump --json` against `guest` (with its kernel)."""
    done = run_qmpprof(
        "dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel), *extra
    )
    assert done.returncode == 0, done.stderr
    vcpus: list[dict[str, Any]] = json.loads(done.stdout)["vcpus"]
    return vcpus


def record_folded(
    guest: Guest, output: Path, seconds: int, *extra: str
) -> tuple[str, list[tuple[list[str], int]]]:
    """Record `guest` into folded stacks: (qmpprof's stdout, [(frames root first, count)])."""
    done = run_qmpprof(*record_args(guest.qmp, guest.kernel, seconds, output, *extra))
    assert done.returncode == 0, done.stderr
    stacks = []
    for line in output.read_text().splitlines():
        frames, count = line.rsplit(" ", 1)
        stacks.append((frames.split(";"), int(count)))
    return done.stdout, stacks
