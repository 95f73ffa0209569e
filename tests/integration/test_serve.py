"""`qmpprof serve` against real example guests, fetched by real clients: `go tool pprof`,
Python's http.client and raw sockets (for what a client library would not send)."""

from __future__ import annotations

import gzip
import http.client
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.consumers.protobuf import decode_message, ints, messages, one
from tests.guest_vm import Guest, boot_guest, running_guest, stop_guest
from tests.integration.watcher import watching

_LISTENING = re.compile(r"on http://127\.0\.0\.1:(\d+)/")
#: Bounds on waits for something that happens within seconds (a loaded host is slow).
STARTUP_S = 60.0
POLL_S = 60.0


@dataclass
class Serve:
    """A running `qmpprof serve` process, the port it listens on, and the last lines of
    its stderr (read all along: a full pipe would stop the server)."""

    process: subprocess.Popen[str]
    port: int
    log: deque[str] = field(default_factory=lambda: deque(maxlen=1000))

    def get(self, path: str, timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
        """(status, headers in lower case, body) of GET `path`."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            headers = {name.lower(): value for name, value in response.getheaders()}
            return response.status, headers, response.read()
        finally:
            connection.close()

    def busy(self, vm: str) -> bool:
        """Whether the index says a scrape of `vm` is under way."""
        status, _, body = self.get("/")
        assert status == 200
        return f"{vm}</a> (profiling".encode() in body

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def rss_kib(self) -> int:
        """The server's resident memory (VmRSS, KiB)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None
        return int(found[1])


@contextmanager
def serving(vms: dict[str, str], kernel: Path | None, *extra: str) -> Iterator[Serve]:
    """`qmpprof serve` on a free port for `vms` (name → QMP socket), with `kernel` as
    --kernel (none given when None), stopped with SIGTERM when the block ends (and
    killed if that does not end it)."""
    specs = [arg for name, qmp in vms.items() for arg in ("--vm", f"{name}={qmp}")]
    given = ["--kernel", str(kernel)] if kernel is not None else []
    command = [sys.executable, "-m", "qmpprof", "serve", *specs, *given]
    process = subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        serve = Serve(process, _port(process))
        threading.Thread(target=_drain, args=(process, serve.log), daemon=True).start()
        yield serve
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _port(process: subprocess.Popen[str]) -> int:
    """The port from serve's first line on stderr."""
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], STARTUP_S)
    assert ready, "qmpprof serve did not start"
    line = process.stderr.readline()
    found = _LISTENING.search(line)
    assert found is not None, line + process.stderr.read()
    return int(found[1])


def _drain(process: subprocess.Popen[str], log: deque[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        log.append(line)


def wait_for(condition: Callable[[], bool], what: str, bound_s: float = POLL_S) -> None:
    """Poll `condition` until it holds, failing after `bound_s`."""
    deadline = time.monotonic() + bound_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def samples_by_label(body: bytes, key: str) -> dict[str, int]:
    """Sample count per value of string label `key` in a gzipped pprof."""
    profile = decode_message(gzip.decompress(body))
    strings = [s.decode() for s in profile[6] if isinstance(s, bytes)]
    counts: dict[str, int] = {}
    for sample in messages(profile, 2):
        for label in messages(sample, 3):
            if strings[one(label, 1)] == key:
                value = strings[one(label, 2)]
                counts[value] = counts.get(value, 0) + ints(sample, 2)[0]
    return counts


@pytest.fixture
def second_guest(workdir: Path) -> Iterator[Guest]:
    directory = workdir / "second"
    directory.mkdir()
    with running_guest(directory, "--accel", os.environ.get("ACCEL", "tcg")) as booted:
        yield booted


def go_pprof(go: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [go, "tool", "pprof", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_go_tool_pprof_fetches_two_vms_at_once(
    guest: Guest, second_guest: Guest, workdir: Path
) -> None:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go (for `go tool pprof`) is not installed: bash tests/consumers/install.sh")
    env = {**os.environ, "PPROF_TMPDIR": str(workdir)}
    with serving({"a": guest.qmp, "b": second_guest.qmp}, guest.kernel) as serve:
        fetches = {
            "a": go_pprof(go, "-top", serve.url("/debug/pprof/profile?seconds=5&vm=a"), env=env),
            "b": go_pprof(go, "-tags", serve.url("/vm/b/debug/pprof/profile?seconds=5"), env=env),
        }
        outputs = {name: fetch.communicate(timeout=120) for name, fetch in fetches.items()}
        plain = go_pprof(go, "-top", serve.url("/debug/pprof/profile?seconds=1"), env=env)
        _, refusal = plain.communicate(timeout=60)
    for name, fetch in fetches.items():
        assert fetch.returncode == 0, outputs[name][1]
    top, tags = outputs["a"][0], outputs["b"][0]
    assert "Type: cpu" in top and "Duration: " in top
    assert re.search(r"\bphysics_leaf\b", top) and re.search(r"\bkernel_entry\b", top)
    assert re.search(r" vm: Total .*\n\s+\S+ \(\s*100%\): b\n", tags), tags
    assert "process:" in tags and "vcpu:" in tags
    assert "400 Bad Request - this server has several VMs (a, b)" in refusal
    assert guest.status() == second_guest.status() == "running"


def test_one_vm_answers_the_plain_go_path(guest: Guest) -> None:
    with serving({"only": guest.qmp}, guest.kernel) as serve:
        status, headers, body = serve.get("/debug/pprof/profile?seconds=1")
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    assert sum(samples_by_label(body, "vm").values()) > 0
    assert set(samples_by_label(body, "vm")) == {"only"}


def test_a_vm_killed_gets_503_and_is_profiled_again_once_back(guest: Guest, workdir: Path) -> None:
    with serving({"a": guest.qmp}, guest.kernel) as serve:
        assert serve.get("/debug/pprof/profile?seconds=1")[0] == 200
        stop_guest(guest)
        status, _, body = serve.get("/debug/pprof/profile?seconds=1")
        assert status == 503, body
        assert body.count(b"\n") == 1 and b"cannot use QMP socket" in body
        back = boot_guest(workdir, "--accel", os.environ.get("ACCEL", "tcg"))
        try:
            assert back.qmp == guest.qmp
            status, _, body = serve.get("/debug/pprof/profile?seconds=1")
            assert status == 200 and samples_by_label(body, "vm")["a"] > 0
            dying = _in_background(lambda: serve.get("/debug/pprof/profile?seconds=60"))
            wait_for(lambda: serve.busy("a"), "the scrape to start")
            stop_guest(back)
            status, _, body = dying.result()
            assert status == 503 and body.startswith(b"VM a: "), body
        finally:
            stop_guest(back)


def test_a_vm_paused_by_someone_else_throughout_gets_503(workdir: Path) -> None:
    """Nothing sampled: one line saying why, and the VM left paused."""
    other = str(workdir / "other.sock")
    accel = os.environ.get("ACCEL", "tcg")
    with running_guest(workdir, "--accel", accel, "--extra-qmp", other) as guest:
        with watching(other) as watcher, serving({"a": guest.qmp}, guest.kernel) as serve:
            assert watcher.stop_took_effect()
            status, _, body = serve.get("/debug/pprof/profile?seconds=1")
        assert status == 503, body
        assert body.startswith(
            b"VM a: no sample taken: the VM was paused by someone else throughout ("
        ), body
        assert body.count(b"\n") == 1
        assert guest.status() == "paused"


class _Background:
    def __init__(self, call: Callable[[], tuple[int, dict[str, str], bytes]]) -> None:
        self._result: list[tuple[int, dict[str, str], bytes]] = []
        self._thread = threading.Thread(target=lambda: self._result.append(call()), daemon=True)
        self._thread.start()

    def result(self) -> tuple[int, dict[str, str], bytes]:
        self._thread.join(timeout=120)
        assert self._result, "the request did not finish"
        return self._result[0]


def _in_background(call: Callable[[], tuple[int, dict[str, str], bytes]]) -> _Background:
    return _Background(call)


def _raw_request(port: int, path: str) -> socket.socket:
    """A connection that sent GET `path` and reads nothing yet."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=120)
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return connection


def test_one_scrape_per_vm_a_hangup_ends_it_and_sigterm_stops_cleanly(guest: Guest) -> None:
    with serving({"a": guest.qmp}, guest.kernel) as serve:
        first = _raw_request(serve.port, "/debug/pprof/profile?seconds=60")
        wait_for(lambda: serve.busy("a"), "the first scrape")
        status, headers, body = serve.get("/debug/pprof/profile?seconds=1")
        assert status == 429 and 1 <= int(headers["retry-after"]) <= 60, body
        assert body.count(b"\n") == 1
        first.close()  # the client gives up: the sampling ends at its next tick
        wait_for(lambda: not serve.busy("a"), "the VM freed")
        assert guest.status() == "running"
        assert serve.get("/debug/pprof/profile?seconds=1")[0] == 200
        running = _raw_request(serve.port, "/debug/pprof/profile?seconds=60")
        wait_for(lambda: serve.busy("a"), "the next scrape")
        serve.process.send_signal(signal.SIGTERM)
        assert serve.process.wait(timeout=60) == 0
        answer = running.recv(65536)
        running.close()
    assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(b"stopping\n"), answer
    wait_for(lambda: any("stopping" in line for line in serve.log), "the log's last lines")
    assert not any("Traceback" in line for line in serve.log), "".join(serve.log)
    assert guest.status() == "running"


#: Requests refused before any VM is asked: (raw request line, status, part of the line).
REFUSED = [
    ("GET /debug/pprof/profile?seconds=abc HTTP/1.1", 400, b"seconds must be a whole number"),
    ("GET /debug/pprof/profile?seconds=0 HTTP/1.1", 400, b"from 1 to 60"),
    ("GET /debug/pprof/profile?seconds=1.5 HTTP/1.1", 400, b"not '1.5'"),
    ("GET /debug/pprof/profile?seconds=61 HTTP/1.1", 400, b"over this server's maximum of 60"),
    ("GET /debug/pprof/profile?seconds=1&seconds=2 HTTP/1.1", 400, b"given twice"),
    ("GET /debug/pprof/profile?seconds=%zz HTTP/1.1", 400, b"malformed %-escape"),
    ("GET /debug/pprof/profile?vm=nope HTTP/1.1", 404, b"no VM named 'nope'"),
    ("GET /debug/pprof/heap HTTP/1.1", 404, b"'profile' (CPU) only"),
    ("POST /debug/pprof/profile HTTP/1.1", 405, b"POST is not allowed"),
    ("GET /debug/pprof/profile HTTP/2.0", 505, b"HTTP/2.0"),
    ("GET  /debug/pprof/profile HTTP/1.1", 400, b"malformed request line"),
    ("GET /debug/pprof/\x01 HTTP/1.1", 400, b"malformed request target"),
]


@pytest.mark.parametrize(("line", "status", "says"), REFUSED)
def test_bad_requests_get_a_status_and_one_line(
    missing_vm_serve: Serve, line: str, status: int, says: bytes
) -> None:
    connection = socket.create_connection(("127.0.0.1", missing_vm_serve.port), timeout=30)
    connection.sendall(line.encode("latin-1") + b"\r\nHost: test\r\n\r\n")
    answer = _read_all(connection)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer
    assert body.count(b"\n") == 1 and says in body, body


def test_a_missing_vm_is_503_and_huge_heads_431(missing_vm_serve: Serve) -> None:
    status, _, body = missing_vm_serve.get("/debug/pprof/profile?seconds=1")
    assert status == 503 and b"cannot use QMP socket" in body
    connection = socket.create_connection(("127.0.0.1", missing_vm_serve.port), timeout=30)
    header = b"X-Filler: " + b"y" * 1000 + b"\r\n"
    connection.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n" + header * 40 + b"\r\n")
    assert _read_all(connection).startswith(b"HTTP/1.1 431 ")
    index = missing_vm_serve.get("/debug/pprof/")
    assert index[0] == 200 and b"profile" in index[2]


@pytest.fixture(scope="module")
def missing_vm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """A server whose one VM's socket does not exist (no QEMU is needed to refuse)."""
    directory = tmp_path_factory.mktemp("serve")
    kernel = Path(__file__).resolve().parents[2] / "examples/guest/build/fp/kernel.elf"
    with serving({"gone": str(directory / "no.sock")}, kernel, "--max-seconds", "60") as serve:
        yield serve


def _read_all(connection: socket.socket) -> bytes:
    chunks = []
    while chunk := connection.recv(65536):
        chunks.append(chunk)
    connection.close()
    return b"".join(chunks)
