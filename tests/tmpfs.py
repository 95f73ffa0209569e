"""A small tmpfs mounted for one test: a real file system that fills up, or is read-only."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(directory: Path, options: str) -> Iterator[Path]:
    """`directory` with a tmpfs mounted on it (`mount -o options`), unmounted after.
    Skips the test when not root: mounting needs it (make test and CI run as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a disk that really fills up) needs root")
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        check=True,
        capture_output=True,
    )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False, capture_output=True)
