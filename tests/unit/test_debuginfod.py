"""qmpprof.symbols.debuginfod against a real HTTP server on 127.0.0.1 (http.server in a
thread) that serves real ELF files built by gcc: what is stored, where, what is
discarded, and that network trouble is a notice line and the next server, never an
exception. Their build-ids are read by readelf, not by the code under test."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from qmpprof.errors import UsageError
from qmpprof.symbols.debuginfod import (
    DEFAULT_TIMEOUT_S,
    MAX_FILE_BYTES,
    Debuginfod,
    cache_path,
    elf_mismatch,
)

SOURCE = "int answer(int x) { return x * %d; }\nint main(void) { return answer(%d); }\n"


PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers here are on 127.0.0.1: a proxy the host's environment names (urllib
    honours http_proxy as curl does) would answer instead."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@dataclass(frozen=True)
class Built:
    """A program gcc built, its separate debug file, and its build-id per readelf."""

    executable: Path
    debuginfo: Path
    build_id: bytes


def readelf_build_id(path: Path) -> bytes:
    notes = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True)
    found = re.search(r"Build ID: ([0-9a-f]+)", notes.stdout)
    assert found is not None, f"readelf finds no build-id in {path}"
    return bytes.fromhex(found.group(1))


def build_program(directory: Path, seed: int) -> Built:
    """A small C program built with -g and a build-id, split as distributions do: the
    stripped executable, and its debug file (objcopy --only-keep-debug)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build test ELF files (make test installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "prog.c"
    source.write_text(SOURCE % (seed, seed))
    executable, debuginfo = directory / "prog", directory / "prog.debug"
    subprocess.run(
        ["gcc", "-g", "-O1", "-Wl,--build-id", "-o", str(executable), str(source)], check=True
    )
    subprocess.run(["objcopy", "--only-keep-debug", str(executable), str(debuginfo)], check=True)
    subprocess.run(["strip", "--strip-debug", str(executable)], check=True)
    return Built(executable, debuginfo, readelf_build_id(executable))


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Built, Built]:
    """Two programs with different build-ids."""
    root = tmp_path_factory.mktemp("debuginfod-elf")
    first, second = build_program(root / "a", 3), build_program(root / "b", 5)
    assert first.build_id != second.build_id
    return first, second


@pytest.fixture
def program(programs: tuple[Built, Built]) -> Built:
    return programs[0]


@dataclass
class Route:
    """What the server answers one path with."""

    body: bytes = b""
    status: int = 200
    reason: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: Sent with no Content-Length: the body ends when the connection closes.
    no_length: bool = False
    #: Bytes the Content-Length promises beyond the body (a truncated transfer).
    missing: int = 0
    #: Send half the body, then reset the connection.
    reset: bool = False


class Server:
    """An HTTP/1.0 server on 127.0.0.1 answering GETs from `routes` (404 otherwise),
    recording each path asked for."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append(self.path)
                owner.answer(self, owner.routes.get(self.path, Route(status=404)))

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        # shutdown() waits for the serving loop's next poll: a short one ends tests sooner.
        serve = functools.partial(self.http.serve_forever, poll_interval=0.02)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def answer(self, handler: http.server.BaseHTTPRequestHandler, route: Route) -> None:
        handler.send_response(route.status, route.reason)
        if not route.no_length:
            handler.send_header("Content-Length", str(len(route.body) + route.missing))
        for name, value in route.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        if route.reset:
            handler.wfile.write(route.body[: len(route.body) // 2])
            linger = struct.pack("ii", 1, 0)  # close() then sends RST, not FIN
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            handler.connection.close()
            return
        handler.wfile.write(route.body)

    def serve(self, build_id: bytes, kind: str, route: Route) -> None:
        self.routes[f"/buildid/{build_id.hex()}/{kind}"] = route

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join()


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


@pytest.fixture
def second_server() -> Iterator[Server]:
    running = Server()
    yield running
    running.close()


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A loopback port that refuses connections: bound (so nobody else takes it) but
    not listening."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A loopback port that accepts connections (the kernel's backlog does) and never
    answers a request."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


class Client:
    """A Debuginfod with its notices and progress reports kept."""

    def __init__(self, urls: list[str], cache: Path, **options: object) -> None:
        self.notices: list[str] = []
        self.progress: list[tuple[int, int | None]] = []
        self.debuginfod = Debuginfod(
            urls,
            cache,
            progress=lambda done, total: self.progress.append((done, total)),
            notice=self.notices.append,
            **options,  # type: ignore[arg-type]
        )


def files_under(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


def test_debuginfo_is_stored_where_elfutils_keeps_it(
    server: Server, program: Built, tmp_path: Path
) -> None:
    server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    client = Client([server.url], tmp_path)
    found = client.debuginfod.debuginfo(program.build_id)
    assert found == tmp_path / program.build_id.hex() / "debuginfo"
    assert found.read_bytes() == program.debuginfo.read_bytes()
    assert files_under(tmp_path) == [found]  # no temporary file left beside it
    assert client.notices == []


def test_executable(server: Server, program: Built, tmp_path: Path) -> None:
    server.serve(program.build_id, "executable", Route(program.executable.read_bytes()))
    client = Client([server.url + "/"], tmp_path)  # a trailing slash is dropped
    found = client.debuginfod.executable(program.build_id)
    assert found == tmp_path / program.build_id.hex() / "executable"
    assert found.read_bytes() == program.executable.read_bytes()
    assert server.requests == [f"/buildid/{program.build_id.hex()}/executable"]


def test_a_miss_everywhere_is_one_notice_and_asked_once(
    server: Server, second_server: Server, program: Built, tmp_path: Path
) -> None:
    client = Client([server.url, second_server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is None
    assert len(server.requests) == len(second_server.requests) == 1
    [notice] = client.notices
    assert program.build_id.hex() in notice
    assert server.url in notice and second_server.url in notice
    assert client.debuginfod.debuginfo(program.build_id) is None
    assert len(server.requests) == len(second_server.requests) == 1
    assert len(client.notices) == 1
    assert files_under(tmp_path) == []


def test_the_next_server_answers_a_miss(
    server: Server, second_server: Server, program: Built, tmp_path: Path
) -> None:
    second_server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    client = Client([server.url, second_server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    assert client.notices == []


def test_a_file_of_another_build_id_is_discarded(
    server: Server, programs: tuple[Built, Built], tmp_path: Path
) -> None:
    wanted, other = programs
    server.serve(wanted.build_id, "debuginfo", Route(other.debuginfo.read_bytes()))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(wanted.build_id) is None
    [notice] = client.notices
    assert other.build_id.hex() in notice and "build-id" in notice
    assert files_under(tmp_path) == []


def test_a_file_that_is_not_elf_is_discarded(
    server: Server, program: Built, tmp_path: Path
) -> None:
    server.serve(program.build_id, "debuginfo", Route(b"<html>a captive portal</html>"))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is None
    [notice] = client.notices
    assert "not an ELF file" in notice
    assert files_under(tmp_path) == []


def test_a_truncated_transfer_leaves_nothing(
    server: Server, program: Built, tmp_path: Path
) -> None:
    body = program.debuginfo.read_bytes()
    server.serve(program.build_id, "debuginfo", Route(body, missing=1000))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is None
    [notice] = client.notices
    assert f"ended after {len(body)} of {len(body) + 1000} bytes" in notice
    assert files_under(tmp_path) == []


def test_a_transfer_reset_midway_leaves_nothing_and_the_next_server_answers(
    server: Server, second_server: Server, program: Built, tmp_path: Path
) -> None:
    body = program.debuginfo.read_bytes()
    server.serve(program.build_id, "debuginfo", Route(body, reset=True))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is None
    assert len(client.notices) == 1
    assert files_under(tmp_path) == []
    second_server.serve(program.build_id, "debuginfo", Route(body))
    client = Client([server.url, second_server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    assert len(client.notices) == 1


def test_an_unreachable_server_is_one_notice_then_the_next(
    closed_url: str, server: Server, programs: tuple[Built, Built], tmp_path: Path
) -> None:
    for built in programs:
        server.serve(built.build_id, "debuginfo", Route(built.debuginfo.read_bytes()))
    client = Client([closed_url, server.url], tmp_path)
    assert client.debuginfod.debuginfo(programs[0].build_id) is not None
    [notice] = client.notices
    assert notice.startswith(f"debuginfod: cannot reach {closed_url}")
    assert client.debuginfod.debuginfo(programs[1].build_id) is not None
    assert len(client.notices) == 1  # not tried again


def test_a_silent_server_times_out_then_the_next(
    silent_url: str, server: Server, program: Built, tmp_path: Path
) -> None:
    server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    client = Client([silent_url, server.url], tmp_path, timeout_s=0.5)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    [notice] = client.notices
    assert silent_url in notice and "timed out" in notice


def test_a_server_error_is_a_notice_with_its_words_escaped(
    server: Server, program: Built, tmp_path: Path
) -> None:
    server.serve(program.build_id, "debuginfo", Route(status=503, reason="busy\x1b[2J"))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is None
    [notice] = client.notices
    assert "HTTP 503 busy\\x1b[2J" in notice
    assert "\x1b" not in notice


def test_a_redirect_is_followed_to_http_only(
    server: Server, program: Built, tmp_path: Path
) -> None:
    server.routes["/elsewhere"] = Route(program.debuginfo.read_bytes())
    server.serve(
        program.build_id, "debuginfo", Route(status=302, headers={"Location": "/elsewhere"})
    )
    server.serve(
        program.build_id, "executable", Route(status=302, headers={"Location": "ftp://x/"})
    )
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    assert client.debuginfod.executable(program.build_id) is None
    [notice] = client.notices
    assert "HTTP 302" in notice


def test_a_cached_file_is_used_without_asking(
    server: Server, program: Built, tmp_path: Path
) -> None:
    server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    first = Client([server.url], tmp_path).debuginfod.debuginfo(program.build_id)
    assert len(server.requests) == 1
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) == first
    assert client.debuginfod.debuginfo(program.build_id) == first
    assert len(server.requests) == 1
    assert client.progress == []


def test_a_file_another_client_cached_is_used(
    server: Server, program: Built, tmp_path: Path
) -> None:
    """What GDB or perf (elfutils' client) left in the cache."""
    target = tmp_path / program.build_id.hex() / "executable"
    target.parent.mkdir()
    shutil.copy(program.executable, target)
    target.chmod(0o400)  # as elfutils leaves it
    client = Client([server.url], tmp_path)
    assert client.debuginfod.executable(program.build_id) == target
    assert server.requests == []


def test_an_empty_or_wrong_cached_file_is_fetched_again(
    server: Server, programs: tuple[Built, Built], tmp_path: Path
) -> None:
    """elfutils marks a miss with an empty file: it is no debug file. Nor is another
    build-id's."""
    wanted, other = programs
    server.serve(wanted.build_id, "debuginfo", Route(wanted.debuginfo.read_bytes()))
    target = tmp_path / wanted.build_id.hex() / "debuginfo"
    target.parent.mkdir()
    for stale in (b"", other.debuginfo.read_bytes()):
        target.write_bytes(stale)
        assert Client([server.url], tmp_path).debuginfod.debuginfo(wanted.build_id) == target
        assert target.read_bytes() == wanted.debuginfo.read_bytes()
    assert len(server.requests) == 2


def test_progress_reports_content_length(server: Server, program: Built, tmp_path: Path) -> None:
    body = program.debuginfo.read_bytes()
    server.serve(program.build_id, "debuginfo", Route(body))
    client = Client([server.url], tmp_path)
    client.debuginfod.debuginfo(program.build_id)
    assert client.progress[0] == (0, len(body))
    assert client.progress[-1] == (len(body), len(body))
    done = [done for done, _ in client.progress]
    assert done == sorted(done)
    assert {total for _, total in client.progress} == {len(body)}


def test_progress_reports_x_debuginfod_size_without_content_length(
    server: Server, program: Built, tmp_path: Path
) -> None:
    body = program.debuginfo.read_bytes()
    size = {"X-Debuginfod-Size": str(len(body))}
    server.serve(program.build_id, "debuginfo", Route(body, no_length=True, headers=size))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    assert client.progress[0] == (0, len(body))
    assert client.progress[-1] == (len(body), len(body))


def test_progress_without_any_size(server: Server, program: Built, tmp_path: Path) -> None:
    body = program.debuginfo.read_bytes()
    server.serve(program.build_id, "debuginfo", Route(body, no_length=True))
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(program.build_id) is not None
    assert client.progress[0] == (0, None)
    assert client.progress[-1] == (len(body), None)


def test_a_file_over_the_limit_is_refused(server: Server, program: Built, tmp_path: Path) -> None:
    body = program.debuginfo.read_bytes()
    server.serve(program.build_id, "debuginfo", Route(body))
    server.serve(program.build_id, "executable", Route(body, no_length=True))
    client = Client([server.url], tmp_path, max_bytes=len(body) - 1)
    assert client.debuginfod.debuginfo(program.build_id) is None  # by its Content-Length
    assert client.debuginfod.executable(program.build_id) is None  # by counting
    assert len(client.notices) == 2
    assert all("limit" in notice for notice in client.notices)
    assert files_under(tmp_path) == []


def test_an_unwritable_cache_is_a_notice(server: Server, program: Built, tmp_path: Path) -> None:
    server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    client = Client([server.url], not_a_directory)
    assert client.debuginfod.debuginfo(program.build_id) is None
    [notice] = client.notices
    assert "cannot write to the cache" in notice


def test_an_unusable_build_id_is_not_asked_for(server: Server, tmp_path: Path) -> None:
    client = Client([server.url], tmp_path)
    assert client.debuginfod.debuginfo(b"") is None
    assert client.debuginfod.debuginfo(bytes(65)) is None
    assert server.requests == []


# ---- the environment ---------------------------------------------------------------


def test_debuginfod_cache_path_is_honoured(server: Server, program: Built, tmp_path: Path) -> None:
    server.serve(program.build_id, "debuginfo", Route(program.debuginfo.read_bytes()))
    cache = tmp_path / "chosen"
    environ = {"DEBUGINFOD_URLS": server.url, "DEBUGINFOD_CACHE_PATH": str(cache)}
    debuginfod = Debuginfod.from_environment(environ=environ)
    assert debuginfod is not None
    assert debuginfod.debuginfo(program.build_id) == cache / program.build_id.hex() / "debuginfo"


def test_default_cache_paths(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert cache_path({"HOME": home}) == tmp_path / ".cache/debuginfod_client"
    assert cache_path({"HOME": home, "XDG_CACHE_HOME": "/x"}) == Path("/x/debuginfod_client")
    assert cache_path(
        {"HOME": home, "DEBUGINFOD_CACHE_PATH": "/c", "XDG_CACHE_HOME": "/x"}
    ) == Path("/c")
    (tmp_path / ".debuginfod_client_cache").mkdir()  # elfutils' old place, used if there
    assert (
        cache_path({"HOME": home, "XDG_CACHE_HOME": "/x"}) == tmp_path / ".debuginfod_client_cache"
    )


def test_no_url_is_no_client() -> None:
    assert Debuginfod.from_environment(environ={}) is None
    assert Debuginfod.from_environment(environ={"DEBUGINFOD_URLS": "  "}) is None


def test_urls_from_the_environment() -> None:
    notices: list[str] = []
    environ = {
        "DEBUGINFOD_URLS": "https://a.example/ ima:permissive ftp://b\x1b http://c.example:8002"
    }
    debuginfod = Debuginfod.from_environment(environ=environ, notice=notices.append)
    assert debuginfod is not None
    assert debuginfod.urls == ("https://a.example", "http://c.example:8002")
    [notice] = notices
    assert "ftp://b\\x1b" in notice


def test_explicit_urls_replace_the_environment_and_must_be_usable() -> None:
    environ = {"DEBUGINFOD_URLS": "http://a.example"}
    debuginfod = Debuginfod.from_environment(["http://b.example"], environ=environ)
    assert debuginfod is not None and debuginfod.urls == ("http://b.example",)
    for bad in ("b.example", "file:///srv", "http://b.example:port", "http://"):
        with pytest.raises(UsageError):
            Debuginfod.from_environment([bad], environ=environ)


@pytest.mark.parametrize(
    ("value", "timeout", "notices"),
    [
        (None, DEFAULT_TIMEOUT_S, 0),
        ("5", 5.0, 0),
        ("0", None, 0),
        ("-1", None, 0),
        ("soon", DEFAULT_TIMEOUT_S, 1),
    ],
)
def test_debuginfod_timeout(value: str | None, timeout: float | None, notices: int) -> None:
    said: list[str] = []
    environ = {"DEBUGINFOD_URLS": "http://a.example"}
    if value is not None:
        environ["DEBUGINFOD_TIMEOUT"] = value
    debuginfod = Debuginfod.from_environment(environ=environ, notice=said.append)
    assert debuginfod is not None and debuginfod.timeout_s == timeout
    assert len(said) == notices


@pytest.mark.parametrize(
    ("value", "limit"),
    [(None, MAX_FILE_BYTES), ("0", MAX_FILE_BYTES), ("1000", 1000), ("1e99", MAX_FILE_BYTES)],
)
def test_debuginfod_maxsize(value: str | None, limit: int) -> None:
    environ = {"DEBUGINFOD_URLS": "http://a.example"}
    if value is not None:
        environ["DEBUGINFOD_MAXSIZE"] = value
    debuginfod = Debuginfod.from_environment(environ=environ)
    assert debuginfod is not None and debuginfod.max_bytes == limit


# ---- reading a build-id ------------------------------------------------------------


def tiny_elf(
    build_id: bytes, elf_class: int = 2, order: str = "<", in_segment: bool = False
) -> bytes:
    """An ELF file of `elf_class` (1: 32-bit, 2: 64-bit) and byte order with nothing but
    a note section (or PT_NOTE segment) holding an NT_GNU_BUILD_ID note."""
    note = struct.pack(order + "III", 4, len(build_id), 3) + b"GNU\0" + build_id
    note += bytes(-len(note) % 4)
    header_size, entry_size = (52, 40) if elf_class == 1 else (64, 64)
    address = "I" if elf_class == 1 else "Q"
    table = header_size + len(note)
    ident = b"\x7fELF" + bytes([elf_class, 1 if order == "<" else 2, 1]) + bytes(9)
    phnum, shnum = (1, 0) if in_segment else (0, 2)
    phentsize = 32 if elf_class == 1 else 56
    header = ident + struct.pack(
        order + "HHI" + address * 3 + "IHHHHHH",
        2, 62, 1, 0, table if in_segment else 0, 0 if in_segment else table,
        0, header_size, phentsize, phnum, entry_size, shnum, 0,
    )  # fmt: skip
    if in_segment:
        if elf_class == 1:
            entries = struct.pack(order + "8I", 4, header_size, 0, 0, len(note), len(note), 4, 4)
        else:
            entries = struct.pack(
                order + "IIQQQQQQ", 4, 4, header_size, 0, 0, len(note), len(note), 4
            )
    else:
        fields = (1, 7, 2, 0, header_size, len(note), 0, 0, 4, 0)
        code = "10I" if elf_class == 1 else "IIQQQQIIQQ"
        entries = bytes(entry_size) + struct.pack(order + code, *fields)
    return header + note + entries


@pytest.mark.parametrize("elf_class", [1, 2])
@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("in_segment", [False, True])
def test_build_id_of_every_elf_form(
    elf_class: int, order: str, in_segment: bool, tmp_path: Path
) -> None:
    path = tmp_path / "tiny.elf"
    path.write_bytes(tiny_elf(bytes(range(20)), elf_class, order, in_segment))
    assert elf_mismatch(path, bytes(range(20))) is None
    assert "its build-id is 000102" in (elf_mismatch(path, bytes(20)) or "")


def test_build_id_agrees_with_readelf(programs: tuple[Built, Built]) -> None:
    built = programs[0]
    assert elf_mismatch(built.executable, built.build_id) is None
    assert elf_mismatch(built.debuginfo, built.build_id) is None
    assert elf_mismatch(built.debuginfo, programs[1].build_id) is not None
    system = Path("/bin/true").resolve()
    if b"Build ID" in subprocess.run(["readelf", "-n", str(system)], capture_output=True).stdout:
        assert elf_mismatch(system, readelf_build_id(system)) is None


def test_an_elf_without_a_build_id_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "plain.elf"
    path.write_bytes(tiny_elf(bytes(range(20)))[:64])  # the header only: no notes
    assert elf_mismatch(path, bytes(20)) is None
    path.write_bytes(b"\x7fELF")
    assert elf_mismatch(path, bytes(20)) == "not an ELF file"
    assert elf_mismatch(tmp_path / "missing", bytes(20)) is not None
