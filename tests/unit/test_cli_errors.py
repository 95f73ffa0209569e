"""Bad input gets one line on stderr and a non-zero exit, never a traceback.

Most cases run `cli.main` in this process (an escaping exception fails the test as a
traceback would); a few run `python -m qmpprof` for real, to check the whole way out of
the interpreter. A fresh interpreter costs half a second, so only those few do.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qmpprof.cli import main
from qmpprof.errors import ConnectionFailed
from qmpprof.target.qmp import QmpSession


def qmpprof_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qmpprof", *args], capture_output=True, text=True, timeout=60
    )


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def qmpprof(capsys: pytest.CaptureFixture[str]) -> Run:
    """`cli.main` run here, its exit status and output as a finished process's."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            status = main(list(args))
        except SystemExit as exit_:  # argparse's way out
            status = exit_.code if isinstance(exit_.code, int) else 1
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["qmpprof", *args], status, out, err)

    return run


def assert_one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("qmpprof: error:")
    assert expected in lines[0]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="qmpprof-") as name:
        yield Path(name)


def serve_once(path: Path, greeting: bytes | None) -> threading.Thread:
    """A unix socket that is not QMP: it sends `greeting` (or nothing) and hangs up."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def handle() -> None:
        with server:
            connection, _ = server.accept()
            with connection:
                if greeting is not None:
                    connection.sendall(greeting)
                    return
                connection.recv(1)  # hold the connection open until the client gives up

    thread = threading.Thread(target=handle, daemon=True)
    thread.start()
    return thread


def test_missing_socket_in_a_real_process(short_dir: Path) -> None:
    done = qmpprof_process("--qmp-socket", str(short_dir / "nope"))
    assert_one_line_error(done, "no such file")


def test_a_bad_command_line_in_a_real_process() -> None:
    done = qmpprof_process("--rate", "inf", "--qmp-socket", "/nonexistent/qmp")
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done, "--rate: must be a number from 0.01 to 10000 Hz")


def test_regular_file_is_not_a_socket(qmpprof: Run, short_dir: Path) -> None:
    path = short_dir / "file"
    path.write_text("x")
    assert_one_line_error(qmpprof("dump", "--qmp-socket", str(path)), "not a socket")


def test_socket_that_speaks_something_else(qmpprof: Run, short_dir: Path) -> None:
    path = short_dir / "http.sock"
    serve_once(path, b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert_one_line_error(qmpprof("dump", "--qmp-socket", str(path)), "not a QMP socket")


def test_socket_that_never_greets(short_dir: Path) -> None:
    """The session, not the CLI: the CLI would wait out its 5 s default; the message is
    the same ConnectionFailed the CLI prints as one line (test_missing_socket)."""
    path = short_dir / "silent.sock"
    serve_once(path, None)
    with pytest.raises(ConnectionFailed, match=r"no QMP greeting within 0\.05 s"):
        asyncio.run(QmpSession.connect(str(path), timeout=0.05))


def test_connect_timeout_is_the_greeting_limit(qmpprof: Run, short_dir: Path) -> None:
    path = short_dir / "silent.sock"
    serve_once(path, None)
    done = qmpprof("dump", "--qmp-socket", str(path), "--connect-timeout", "0.2")
    assert_one_line_error(done, "no QMP greeting within 0.2 s")


def _no_libvirt_binding() -> bool:
    from qmpprof.target.libvirt import bridge_python

    found = subprocess.run([bridge_python(), "-c", "import libvirt"], capture_output=True)
    return found.returncode != 0


@pytest.mark.skipif(_no_libvirt_binding(), reason="no libvirt Python binding (python3-libvirt)")
@pytest.mark.parametrize(
    ("uri", "domain", "expected"),
    [
        ("test:///default", "no-such", "libvirt domain no-such: Domain not found"),
        # libvirt's test driver has a running domain, but no QEMU monitor to pass to
        ("test:///default", "test", "not supported by the connection driver"),
        (
            "qemu+unix:///system?socket=/nonexistent/libvirt-sock",
            "vm",
            "cannot connect to libvirt (qemu+unix:///system?socket=/nonexistent/libvirt-sock): "
            "Failed to connect socket",
        ),
    ],
)
def test_what_libvirt_says_is_one_line(qmpprof: Run, uri: str, domain: str, expected: str) -> None:
    """libvirt's own test driver (in libvirt, no daemon) and a libvirtd not there."""
    done = qmpprof("dump", "--libvirt", domain, "--libvirt-uri", uri)
    assert_one_line_error(done, expected)


def test_kernel_that_is_not_an_elf(qmpprof: Run, short_dir: Path) -> None:
    kernel = short_dir / "kernel"
    kernel.write_text("not an elf\n")
    done = qmpprof("dump", "--qmp-socket", str(short_dir / "x"), "--kernel", str(kernel))
    assert_one_line_error(done, "not a readable ELF")


BAD_COMMAND_LINES = [
    (["--rate", "inf"], "--rate: must be a number from 0.01 to 10000 Hz"),
    (["--rate", "nan"], "--rate: must be"),
    (["--rate", "-5"], "--rate: must be"),
    (["--rate", "0"], "--rate: must be"),
    (["--rate", "1e7"], "--rate: must be"),
    (["--rate", "1e400"], "--rate: must be"),
    (["--rate", "fast"], "--rate: must be"),
    (["top", "--rate", "inf"], "--rate: must be"),
    (["--interval", "0"], "--interval: must be a number from 0.1 to 100000 ms"),
    (["--interval", "1e-9"], "--interval: must be"),
    (["--interval=-inf"], "--interval: must be"),
    (["--rate", "99", "--interval", "10"], "not allowed with argument"),
    (["--duration", "inf"], "--duration: must be a number from 0.001 to 604800 seconds"),
    (["--duration", "0"], "--duration: must be"),
    (["--duration", "nan"], "--duration: must be"),
    (["--stack-bytes", "100000000"], "--stack-bytes: must be a number from 1 to 1048576"),
    (["dump", "--stack-bytes", "0"], "--stack-bytes: must be"),
    (["--stack-bytes", "1.5"], "--stack-bytes: must be"),
    (["--max-depth", "0"], "--max-depth: must be a number from 1 to 4096 frames"),
    (["report", "x.qmpcap", "--max-depth", "99999999"], "--max-depth: must be"),
    (["--max-depth", "1" * 5000], "--max-depth: must be"),
    (["top", "--refresh", "0"], "--refresh: must be a number from 0.1 to 3600 seconds"),
    (["top", "--refresh", "inf"], "--refresh: must be"),
    (["--cpus", "-1"], "--cpus: expected vCPU numbers"),
    (["--cpus", "a,b"], "--cpus: expected vCPU numbers"),
    (["--cpus", ","], "--cpus: expected vCPU numbers"),
    (["--format", "png"], "--format: invalid choice"),
    (["--stop", "--nonblocking"], "not allowed with argument"),
    (["top", "--nonblocking", "--stop"], "not allowed with argument"),
    (["--connect-timeout", "0"], "--connect-timeout: must be a number from 0.1 to 3600 seconds"),
    (["dump", "--connect-timeout", "nan"], "--connect-timeout: must be"),
    (["--no-such-flag"], "unrecognized arguments"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_COMMAND_LINES)
def test_a_bad_command_line_is_one_line_and_exit_2(
    qmpprof: Run, args: list[str], expected: str
) -> None:
    """Refused while parsing, before any connection: the socket does not exist and the
    message is about the flag."""
    done = qmpprof(*args, "--qmp-socket", "/nonexistent/qmp")
    assert done.returncode == 2, done.stderr
    assert_one_line_error(done, expected)
    assert "--help)" in done.stderr


def test_one_shot_is_dump_and_fails_cleanly(qmpprof: Run, short_dir: Path) -> None:
    done = qmpprof("--one-shot", "--json", "--qmp-socket", str(short_dir / "nope"))
    assert_one_line_error(done, "no such file")


def test_an_output_that_cannot_be_written_fails_before_recording(
    qmpprof: Run, short_dir: Path
) -> None:
    done = qmpprof("--qmp-socket", str(short_dir / "nope"), "-o", str(short_dir / "no" / "x.svg"))
    assert_one_line_error(done, "no directory")
