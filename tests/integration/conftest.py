"""Boot the example guest in a real QEMU for each test that asks for one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest_vm import Guest, boot_guest, stop_guest

__all__ = ["Guest", "boot_guest", "run_qmpprof", "stop_guest"]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory path: unix socket paths are limited to about 100 bytes."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="qmpprof-it-") as name:
        yield Path(name)


@pytest.fixture
def guest(workdir: Path) -> Iterator[Guest]:
    booted = boot_guest(workdir, "--accel", os.environ.get("ACCEL", "tcg"))
    try:
        yield booted
    finally:
        stop_guest(booted)


def run_qmpprof(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """qmpprof as a user runs it: a separate process, its exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "qmpprof", *args], capture_output=True, text=True, timeout=timeout
    )
