"""Boot the example guest in a real QEMU for each test that asks for one."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guest_vm import Guest, running_guest, scratch_ram_file

__all__ = [
    "Guest",
    "dump_json",
    "record_args",
    "record_folded",
    "run_cached",
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


#: The derived cache the Linux tests' qmpprof processes share for this session: Debian's
#: vmlinux is read once, not once per dump (8-15 s each on a busy host). Deleted at exit.
SESSION_CACHE = tempfile.mkdtemp(prefix="qmpprof-test-cache-")
atexit.register(shutil.rmtree, SESSION_CACHE, ignore_errors=True)


def run_qmpprof(
    *args: str, timeout: float = 120, cached: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """qmpprof as a user runs it: a separate process, its exit code, stdout and stderr.
    `cached`: with this session's derived cache (for ELF files no test changes), else
    none (tests/conftest.py). `env`: more environment variables."""
    environment = {**os.environ, **(env or {})}
    if cached:
        environment["QMPPROF_DERIVED_CACHE"] = SESSION_CACHE
    return subprocess.run(
        [sys.executable, "-m", "qmpprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def run_cached(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """run_qmpprof with this session's derived cache (the Linux guests' files)."""
    return run_qmpprof(*args, timeout=timeout, cached=True, env=env)


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


def interrupted_when(
    args: list[str], seen: Callable[[str], bool], on_stderr: bool = False, group: bool = False
) -> tuple[int, str]:
    """qmpprof with `args` sent SIGINT once a line of its stdout (stderr with
    `on_stderr`) is `seen`; its exit status and stderr after. `group`: it runs in a
    process group of its own, signalled whole, as a shell job's Ctrl-C is."""
    with subprocess.Popen(
        [sys.executable, "-m", "qmpprof", *args],
        stdout=subprocess.DEVNULL if on_stderr else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    ) as process:
        stream = process.stderr if on_stderr else process.stdout
        assert stream is not None
        for line in stream:
            if seen(line):
                break
        if group:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=60)[1]
    return process.returncode, rest
