"""A hostile debuginfod server: the build-id reader over damaged ELF files (real ones
from gcc, and small ones of every class and byte order), and the whole client over raw
HTTP answers (status lines, sizes that lie, chunked framing, encodings, bodies that are
damaged ELF files or noise). Nothing raises; a file is stored only when it checks, and
no temporary file is left; every notice is one printable line."""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qmpprof.symbols.debuginfod import Debuginfod, elf_mismatch
from tests.fuzz.budget import cases, counted
from tests.fuzz.file_budget import file_cases
from tests.unit.test_debuginfod import PROXY_VARIABLES, Built, build_program, tiny_elf

BUILD_ID = bytes(range(1, 21))
TINY = [
    tiny_elf(BUILD_ID, elf_class, order, in_segment)
    for elf_class in (1, 2)
    for order in "<>"
    for in_segment in (False, True)
]
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_program(tmp_path_factory.mktemp("debuginfod-fuzz"), 11)


def damaged(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    changed = bytearray(data)
    for where, value in edits:
        changed[where % len(changed)] = value
    return bytes(changed)


#: Bytes changed: anywhere, or in the ELF header and the first tables (the small files
#: are all header and tables).
edits = st.lists(
    st.tuples(st.one_of(st.integers(0, 1 << 20), st.integers(0, 127)), st.integers(0, 255)),
    min_size=1,
    max_size=6,
)


def check_file(path: Path, build_id: bytes) -> None:
    reason = elf_mismatch(path, build_id)
    assert reason is None or (reason.isprintable() and reason)


@settings(max_examples=cases(300), suppress_health_check=SLOW)
@given(which=st.integers(0, len(TINY) - 1), changes=edits, cut=st.integers(0, 400))
@counted
def test_small_elf_files_damaged(
    which: int, changes: list[tuple[int, int]], cut: int, tmp_path: Path
) -> None:
    data = damaged(TINY[which], changes)
    path = tmp_path / "tiny.elf"
    path.write_bytes(data[: len(data) - cut % len(data)] if cut % 3 == 0 else data)
    check_file(path, BUILD_ID)


@settings(max_examples=file_cases(40), suppress_health_check=SLOW)
@given(debug=st.booleans(), changes=edits)
@counted
def test_gcc_elf_files_damaged(
    built: Built, debug: bool, changes: list[tuple[int, int]], tmp_path: Path
) -> None:
    source = built.debuginfo if debug else built.executable
    path = tmp_path / "damaged.elf"
    path.write_bytes(damaged(source.read_bytes(), changes))
    check_file(path, built.build_id)


class RawServer:
    """A loopback server that answers every connection with `self.answer` verbatim and
    closes it."""

    def __init__(self) -> None:
        self.answer = b""
        self.stopping = False
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.address = self.listening.getsockname()
        self.url = f"http://127.0.0.1:{self.address[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            connection, _ = self.listening.accept()
            with connection:
                if self.stopping:
                    return
                self.reply(connection)

    def reply(self, connection: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            received = connection.recv(4096)
            if not received:
                return
            request += received
        with contextlib.suppress(OSError):  # the client gave up first (over the limit, ...)
            connection.sendall(self.answer)

    def close(self) -> None:
        """Ends the serving thread (closing the socket would not wake its accept())."""
        self.stopping = True
        socket.create_connection(self.address).close()
        self.thread.join()
        self.listening.close()


@pytest.fixture(scope="module")
def raw_server() -> Iterator[RawServer]:
    with pytest.MonkeyPatch.context() as patch:
        for name in PROXY_VARIABLES:
            patch.delenv(name, raising=False)
            patch.delenv(name.upper(), raising=False)
        server = RawServer()
        yield server
        server.close()


STATUS = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.0 200 \x1b[2J",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 206 Partial",
        b"HTTP/1.1 302 Found\r\nLocation: ftp://x/",
        b"HTTP/1.1 500 " + bytes(range(1, 32)),
        b"garbage",
        b"HTTP/1.1 200",
        b"HTTP/9.9 200 OK",
        b"",
    ]
)
NUMBERS = st.one_of(
    st.integers(0, 1 << 70).map(lambda n: str(n).encode()),
    st.sampled_from([b"-1", b"", b" 12 ", b"0x10", b"1e3", b"\xff", b"9" * 30]),
)
HEADER = st.one_of(
    NUMBERS.map(lambda n: b"Content-Length: " + n),
    NUMBERS.map(lambda n: b"X-Debuginfod-Size: " + n),
    st.sampled_from(
        [b"Transfer-Encoding: chunked", b"Content-Encoding: gzip", b"Content-Encoding: \x1b"]
    ),
    st.binary(max_size=40).filter(lambda b: b"\r\n" not in b),
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    elf = TINY[draw(st.integers(0, len(TINY) - 1))]
    body = draw(
        st.one_of(st.just(elf), st.binary(max_size=200), edits.map(lambda e: damaged(elf, e)))
    )
    if draw(st.booleans()):  # chunked framing, honest or not
        size = draw(st.one_of(st.just(len(body)), st.integers(0, 1 << 20)))
        body = f"{size:x}".encode() + draw(st.sampled_from([b"", b";x=1", b"zz"])) + b"\r\n" + body
        body += draw(st.sampled_from([b"\r\n0\r\n\r\n", b"", b"\r\n"]))
    return body


@settings(max_examples=cases(200), suppress_health_check=SLOW)
@given(
    status=STATUS,
    headers=st.lists(HEADER, max_size=4),
    body=bodies(),
    limit=st.sampled_from([1 << 30, 100]),
)
@counted
def test_raw_http_answers(
    raw_server: RawServer,
    status: bytes,
    headers: list[bytes],
    body: bytes,
    limit: int,
    tmp_path: Path,
) -> None:
    raw_server.answer = b"\r\n".join([status, *headers]) + b"\r\n\r\n" + body
    notices: list[str] = []
    with tempfile.TemporaryDirectory() as name:  # a cache per case: none answers from the last
        cache = Path(name)
        client = Debuginfod([raw_server.url], cache, 10.0, notice=notices.append, max_bytes=limit)
        found = client.debuginfo(BUILD_ID)
        event("stored" if found else " ".join(notices[0].split()[1:3]) if notices else "silent")
        if found is not None:
            assert elf_mismatch(found, BUILD_ID) is None
        stored = sorted(path.name for path in cache.rglob("*") if path.is_file())
        assert stored == (["debuginfo"] if found else [])
    assert all(line.isprintable() and line.startswith("debuginfod: ") for line in notices)
