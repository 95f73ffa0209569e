"""debuginfod for a Linux guest: a real elfutils server (Debian's `debuginfod`) indexing
the .deb files the example guest's libc comes from (`libc6` with `libc6-dbg`) and the
kernel's debug vmlinux as the file its `linux-image-ABI-dbg` .deb holds (fetch.sh
unpacked it; the server given the 850 MB .deb itself spends minutes of this 2-core
host unpacking its xz, to index it and again to send the file, where qmpprof asks the
same URL and reads the same bytes), and the example guest on bookworm's 6.1, KASLR on.

- With DEBUGINFOD_URLS at that server and no kernel file, `dump` of a paused guest
  fetches the kernel's debug vmlinux by the build-id VMCOREINFO names, and its frames are
  `dump --kernel VMLINUX`'s, inlined calls included; libc's are named from its fetched
  debug file with no --sysroot.
- The server gone: one line, and the kernel read from memory names the frames.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guest_vm import qmp_call
from tests.integration.conftest import run_cached
from tests.linux_vm import (
    LinuxGuest,
    guest_sysroot,
    kernel_abis,
    libc_versions,
    running_linux,
)

pytestmark = pytest.mark.integration

#: A guard against a hang: the server indexes a few files in seconds.
INDEX_DEADLINE_S = 900.0
#: The guest's C library, in its sysroot.
LIBC = Path("lib/x86_64-linux-gnu/libc.so.6")
DEBS = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof")) / "debian"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def build_id(path: Path) -> str:
    notes = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    return notes.split("Build ID: ", 1)[1].split()[0]


def serves(url: str, build_id: str) -> bool:
    """Whether the server answers for `build_id`'s debug file (not while it starts, nor
    while it still reads the file: its scan counters move before the file is indexed)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/buildid/{build_id}/debuginfo", timeout=10) as answer:
            return bool(answer.status == 200 and answer.read(4) == b"\x7fELF")
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    workdir = tmp_path_factory.mktemp("linux-debuginfod")
    with running_linux(workdir, "--workloads", "sysloop,dynwork", abi=kernel_abis()[0]) as booted:
        yield booted


@pytest.fixture(scope="module")
def server(guest: LinuxGuest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's URL once it serves the guest kernel's debug file (bounded wait)."""
    if shutil.which("debuginfod") is None or shutil.which("bsdtar") is None:
        pytest.fail("make test installs Debian's debuginfod and libarchive-tools (bsdtar)")
    folder = tmp_path_factory.mktemp("debs")
    version = libc_versions(guest)[0]
    wanted = [f"libc6_{version}_*.deb", f"libc6-dbg_{version}_*.deb"]
    for pattern in wanted:
        (found,) = DEBS.glob(pattern)
        (folder / found.name).symlink_to(found)
    (folder / f"vmlinux-{guest.abi}").symlink_to(guest.kernel)
    port = free_port()
    command = ["debuginfod", "-d", ":memory:", "-p", str(port), "-L", "-F", "-U", str(folder)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + INDEX_DEADLINE_S
        wanted_ids = [build_id(guest.kernel), build_id(guest_sysroot(guest) / LIBC)]
        while not all(serves(url, wanted_id) for wanted_id in wanted_ids):
            assert time.monotonic() < deadline, "debuginfod did not index the vmlinux and .debs"
            assert process.poll() is None, "debuginfod exited"
            time.sleep(1)  # polls a server that indexes in the background
        yield url
    finally:
        process.kill()
        process.wait()


def frames(done: subprocess.CompletedProcess[str]) -> list[list[tuple[int, Any, Any]]]:
    """Each vCPU's frames: (address, function, module)."""
    assert done.returncode == 0, done.stderr
    return [
        [(int(f["address"], 16), f["function"], f["module"]) for f in vcpu["frames"]]
        for vcpu in json.loads(done.stdout)["vcpus"]
    ]


@pytest.fixture
def paused(guest: LinuxGuest) -> Iterator[None]:
    qmp_call(guest.qmp, "stop")
    try:
        yield
    finally:
        qmp_call(guest.qmp, "cont")


#: A guard against a hang, not a time limit: qmpprof reads the 600 MB vmlinux as it
#: comes, on the same 2 cores as the server (and, served from its .deb, make test
#: 2026-11-27 took more than the 120 s other commands get).
FETCH_TIMEOUT_S = 900


def dump(guest: LinuxGuest, *extra: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = ("dump", "--json", "--qmp-socket", guest.qmp, *extra)
    return run_cached(*command, env=env, timeout=FETCH_TIMEOUT_S)


def test_the_fetched_vmlinux_gives_what_kernel_gives(
    guest: LinuxGuest, server: str, paused: None, tmp_path: Path
) -> None:
    env = {"DEBUGINFOD_URLS": server, "DEBUGINFOD_CACHE_PATH": str(tmp_path / "cache")}
    fetched = dump(guest, env=env)
    given = dump(guest, "--kernel", str(guest.kernel), env={"DEBUGINFOD_URLS": ""})
    # inlined calls included
    assert kernel_frames(fetched) == kernel_frames(given), fetched.stderr
    assert (tmp_path / "cache" / build_id(guest.kernel) / "debuginfo").is_file()
    assert "from debuginfod" in fetched.stderr or not kernel_frames(fetched)
    libc = [name for vcpu in frames(fetched) for _, name, module in vcpu if module == "libc.so.6"]
    assert all(libc), frames(fetched)  # its static functions too, from libc6-dbg


def kernel_frames(done: subprocess.CompletedProcess[str]) -> list[list[tuple[int, Any, Any]]]:
    return [[f for f in vcpu if f[0] >= 1 << 63] for vcpu in frames(done)]


def test_a_server_gone_costs_one_line(guest: LinuxGuest, paused: None, tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    env = {"DEBUGINFOD_URLS": gone, "DEBUGINFOD_CACHE_PATH": str(tmp_path / "cache")}
    done = dump(guest, env=env)
    ours = frames(done)
    lines = [line for line in done.stderr.splitlines() if "debuginfod" in line]
    assert len(lines) == 1, done.stderr
    kernel = [name for vcpu in ours for address, name, _ in vcpu if address >= 1 << 63]
    assert all(kernel), ours  # every kernel frame named, from the guest's memory
