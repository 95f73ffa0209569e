"""qmpprof.symbols.debuginfod against the real elfutils server (Debian's `debuginfod`
package) serving a directory that holds a stripped program and its separate debug file;
and the cache shared both ways with elfutils' own client, debuginfod-find (what GDB and
perf use): each finds the files the other fetched, with no server to ask."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qmpprof.symbols.debuginfod import Debuginfod
from tests.unit.test_debuginfod import PROXY_VARIABLES, Built, build_program

pytestmark = pytest.mark.integration

#: How long the server may take to start and index two files (it takes well under a
#: second; a loaded host gets plenty more), and how often it is asked meanwhile.
INDEX_DEADLINE_S = 120.0
POLL_INTERVAL_S = 0.1
NOT_INSTALLED = "the elfutils debuginfod server is not installed (apt-get install -y debuginfod)"


@dataclass(frozen=True)
class Running:
    url: str
    built: Built


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server is on 127.0.0.1: no proxy from the environment must answer instead."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_url() -> str:
    """A URL nothing answers at (a port just free): a client that uses it must not
    need a server."""
    return f"http://127.0.0.1:{free_port()}"


def answers(url: str) -> bool:
    """Whether the server gives `url` (no proxy asked; 404 or no connection: not yet)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=10) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_indexed(process: subprocess.Popen[bytes], running: Running, log: Path) -> None:
    """Until the server gives both files: a bounded number of tries within a deadline."""
    hexadecimal = running.built.build_id.hex()
    urls = [f"{running.url}/buildid/{hexadecimal}/{kind}" for kind in ("debuginfo", "executable")]
    for _ in range(int(INDEX_DEADLINE_S / POLL_INTERVAL_S)):
        if process.poll() is not None:
            pytest.fail(f"debuginfod exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        if all(answers(url) for url in urls):
            return
        time.sleep(POLL_INTERVAL_S)
    pytest.fail(f"debuginfod did not index {hexadecimal} in time:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    debuginfod = shutil.which("debuginfod")
    if debuginfod is None:
        pytest.skip(NOT_INSTALLED)
    root = tmp_path_factory.mktemp("debuginfod-server")
    built = build_program(root / "files", 7)
    port = free_port()
    log = root / "debuginfod.log"
    command = [debuginfod, "-d", ":memory:", "-p", str(port), "-F", str(built.executable.parent)]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        running = Running(f"http://127.0.0.1:{port}", built)
        wait_indexed(process, running, log)
        yield running
    finally:
        process.kill()
        process.wait(timeout=60)


def test_both_files_from_the_elfutils_server(server: Running, tmp_path: Path) -> None:
    notices: list[str] = []
    progress: list[tuple[int, int | None]] = []
    client = Debuginfod(
        [server.url], tmp_path, 30.0, lambda *report: progress.append(report), notices.append
    )
    built = server.built
    debuginfo = client.debuginfo(built.build_id)
    executable = client.executable(built.build_id)
    assert debuginfo == tmp_path / built.build_id.hex() / "debuginfo"
    assert executable == tmp_path / built.build_id.hex() / "executable"
    assert debuginfo.read_bytes() == built.debuginfo.read_bytes()
    assert executable.read_bytes() == built.executable.read_bytes()
    sizes = {built.debuginfo.stat().st_size, built.executable.stat().st_size}
    assert {(size, size) for size in sizes} <= set(progress)  # the last report of each
    assert notices == []


def test_a_build_id_the_server_does_not_have(server: Running, tmp_path: Path) -> None:
    notices: list[str] = []
    client = Debuginfod([server.url], tmp_path, 30.0, notice=notices.append)
    assert client.debuginfo(bytes(range(20))) is None
    assert notices == [
        f"debuginfod: no debuginfo for build-id {bytes(range(20)).hex()} at {server.url}"
    ]


def debuginfod_find(kind: str, build_id: bytes, url: str, cache: Path) -> Path:
    """Where elfutils' client (debuginfod-find) finds the file, in `cache` or at `url`."""
    find = shutil.which("debuginfod-find")
    if find is None:
        pytest.skip(NOT_INSTALLED)
    environment = {"PATH": "/usr/bin:/bin", "DEBUGINFOD_URLS": url}
    environment["DEBUGINFOD_CACHE_PATH"] = str(cache)
    found = subprocess.run(
        [find, kind, build_id.hex()], env=environment, capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip())


def test_elfutils_uses_what_we_cached(server: Running, tmp_path: Path) -> None:
    built = server.built
    ours = Debuginfod([server.url], tmp_path, 30.0).debuginfo(built.build_id)
    assert debuginfod_find("debuginfo", built.build_id, closed_url(), tmp_path) == ours


def test_we_use_what_elfutils_cached(server: Running, tmp_path: Path) -> None:
    built = server.built
    theirs = debuginfod_find("executable", built.build_id, server.url, tmp_path)
    assert theirs.read_bytes() == built.executable.read_bytes()
    notices: list[str] = []
    client = Debuginfod([closed_url()], tmp_path, 30.0, notice=notices.append)
    assert client.executable(built.build_id) == theirs
    assert notices == []
