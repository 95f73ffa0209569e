"""Debug files by GNU build-id from debuginfod servers, fetched as elfutils' client does.

A guest's kernel and libraries are often a distribution's, whose symbols and DWARF sit
on the distribution's debuginfod server. This client speaks the same protocol (GET
URL/buildid/HEX/debuginfo or /executable) with the standard library only, and follows
elfutils' conventions (debuginfod-client-config(7)) so that it shares their cache:

- DEBUGINFOD_URLS: server URLs separated by spaces, asked in order;
- DEBUGINFOD_CACHE_PATH: the cache; else ~/.debuginfod_client_cache if it exists, else
  $XDG_CACHE_HOME/debuginfod_client, else ~/.cache/debuginfod_client. Files are
  <cache>/<hex>/debuginfo and <cache>/<hex>/executable: what GDB or perf fetched is
  used here, and what this fetches is used by them;
- DEBUGINFOD_TIMEOUT: seconds to connect, or to wait for the next bytes (default 90;
  zero or negative: no limit);
- DEBUGINFOD_MAXSIZE: the largest file taken, in bytes (0: only our own bound).

A server is untrusted. A download streams to a temporary file beside its place in the
cache, and is renamed into place only when it is complete, an ELF file, and (when it has
a build-id note) the one asked for: a partial or wrong file is never used. Its size is
bounded (MAX_FILE_BYTES), and so are its headers (http.client reads at most 100 lines of
64 KiB); only http(s) redirects are followed (at most 10, as urllib does). Network
trouble never raises: the server gets one notice line and the next one is asked. A
server that cannot be connected to is not asked again by the same instance (each try
could cost the whole timeout), and neither is a build-id that no server gave (elfutils
keeps such misses in its cache for ten minutes; asking once a run is enough here).
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import struct
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import http.client
    import urllib.request

from qmpprof.errors import UsageError
from qmpprof.visible import visible

#: The default of DEBUGINFOD_TIMEOUT, as elfutils'.
DEFAULT_TIMEOUT_S = 90.0
#: The largest file taken whatever DEBUGINFOD_MAXSIZE says (Debian's vmlinux
#: debuginfo is about 600 MB).
MAX_FILE_BYTES = 4 << 30
#: The longest build-id asked for (qmpprof's bound elsewhere).
MAX_BUILD_ID = 64
#: At most one progress report per this many seconds (besides the first and the last).
PROGRESS_INTERVAL_S = 0.1
#: Bytes read from the server at a time (less when less has arrived).
_CHUNK = 256 * 1024
#: Longest text of a server's (or an exception's) shown in a notice.
_REASON_CHARS = 200
_HEADERS = {"User-Agent": "qmpprof-debuginfod", "Accept-Encoding": "identity"}

Progress = Callable[[int, int | None], None]
Notice = Callable[[str], None]


class _Answer(enum.Enum):
    """What asking one server for one file came to."""

    STORED = "stored"  # the file is in its place in the cache
    MISSING = "missing"  # the server does not have it (404)
    FAILED = "failed"  # the server, or what it sent, failed (a notice said so)
    UNWRITABLE = "unwritable"  # the cache cannot be written (a notice said so)


def _opener() -> urllib.request.OpenerDirector:
    """urllib's opener, following a server's redirect only to another http(s) URL
    (urllib would go to ftp). urllib.request and http.client (with email) are imported
    only here, when there is a server to ask: some 20 ms of every command's start-up
    otherwise, `qmpprof dump`'s included."""
    import urllib.request

    class HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: http.client.HTTPMessage,
            newurl: str,
        ) -> urllib.request.Request | None:
            if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
                return None  # urllib then raises HTTPError with the redirect's code
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    return urllib.request.build_opener(HttpOnlyRedirects)


class Debuginfod:
    """A client of one list of servers and one cache directory; not thread-safe.

    `progress(bytes so far, total or None)` is called while a file downloads (at most
    about ten times a second, always at its start and its end) so a caller can draw a
    bar; `notice(line)` gets one line for each thing the user should know (a miss, a
    server in trouble, a file discarded), its server-provided text made visible().
    """

    def __init__(
        self,
        urls: Sequence[str],
        cache: Path,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        progress: Progress | None = None,
        notice: Notice | None = None,
        *,
        max_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        """Raises UsageError for a URL that is not http(s) (the user typed it)."""
        self.urls = tuple(_server_url(url) for url in urls)
        self.cache = cache
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._progress = progress
        self._notice = notice
        self._missed: set[tuple[str, bytes]] = set()
        self._down: set[str] = set()
        self._opener = _opener()

    @classmethod
    def from_environment(
        cls,
        explicit: Sequence[str] = (),
        *,
        progress: Progress | None = None,
        notice: Notice | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Debuginfod | None:
        """A client of `explicit` URLs, else of DEBUGINFOD_URLS' (those that are not
        http(s) skipped with a notice), with the cache, timeout and size limit the
        environment sets; None when there is no server to ask."""
        env = os.environ if environ is None else environ
        urls = list(explicit) or _environment_urls(env.get("DEBUGINFOD_URLS", ""), notice)
        if not urls:
            return None
        return cls(
            urls,
            cache_path(env),
            _timeout(env.get("DEBUGINFOD_TIMEOUT"), notice),
            progress,
            notice,
            max_bytes=_max_bytes(env.get("DEBUGINFOD_MAXSIZE"), notice),
        )

    def debuginfo(self, build_id: bytes) -> Path | None:
        """The separate debug file (symbols, DWARF) of the ELF file with `build_id`, from
        the cache or a server; None when there is none to be had."""
        return self._fetch(build_id, "debuginfo")

    def executable(self, build_id: bytes) -> Path | None:
        """The ELF file with `build_id` itself (a kernel's vmlinux, a library), from the
        cache or a server; None when there is none to be had."""
        return self._fetch(build_id, "executable")

    def _fetch(self, build_id: bytes, kind: str) -> Path | None:
        if not 0 < len(build_id) <= MAX_BUILD_ID or (kind, build_id) in self._missed:
            return None
        target = self.cache / build_id.hex() / kind
        if _cached(target, build_id):
            return target
        found = self._ask_servers(build_id, kind, target)
        if found is None:
            self._missed.add((kind, build_id))
        return found

    def _ask_servers(self, build_id: bytes, kind: str, target: Path) -> Path | None:
        """The first server's good answer; one notice for all the servers that had none."""
        missing: list[str] = []
        for url in self.urls:
            if url in self._down:
                continue
            answer = self._ask(url, build_id, kind, target)
            if answer is _Answer.STORED:
                return target
            if answer is _Answer.UNWRITABLE:
                return None  # no server can help
            if answer is _Answer.MISSING:
                missing.append(url)
        if missing:
            where = ", ".join(visible(url) for url in missing)
            self._say(f"no {kind} for build-id {build_id.hex()} at {where}")
        return None

    def _ask(self, url: str, build_id: bytes, kind: str, target: Path) -> _Answer:
        """Asks the server at `url`; its file, when good, is stored at `target`."""
        import http.client  # imported by _opener() already
        import urllib.error
        import urllib.request

        address = f"{url}/buildid/{build_id.hex()}/{kind}"
        request = urllib.request.Request(address, headers=_HEADERS)
        try:
            response = self._opener.open(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                return _Answer.MISSING
            return self._failed(address, f"HTTP {error.code} {_reason(error.reason)}")
        except urllib.error.URLError as error:
            self._down.add(url)  # connecting failed: not asked again by this instance
            self._say(f"cannot reach {visible(url)}: {_reason(error.reason)}; not asked again")
            return _Answer.FAILED
        except (OSError, http.client.HTTPException, ValueError) as error:
            return self._failed(address, _reason(error))  # it connected, then failed
        with response:
            return self._receive(response, address, build_id, target)

    def _receive(self, response: object, address: str, build_id: bytes, target: Path) -> _Answer:
        """Checks the response's headers, then stores its body at `target`."""
        import http.client  # imported by _opener() already

        if not isinstance(response, http.client.HTTPResponse) or response.status != 200:
            return self._failed(address, f"unexpected answer {getattr(response, 'status', '?')}")
        encoding = response.getheader("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            return self._failed(address, f"unasked-for encoding {_reason(encoding)}")
        total = response.length
        if total is None:
            total = _decimal(response.getheader("X-Debuginfod-Size"))
        if total is not None and total > self.max_bytes:
            return self._failed(address, f"{total} bytes, over the limit of {self.max_bytes}")
        return self._store(response, total, address, build_id, target)

    def _store(
        self,
        response: http.client.HTTPResponse,
        total: int | None,
        address: str,
        build_id: bytes,
        target: Path,
    ) -> _Answer:
        """Downloads to a temporary file beside `target`, renamed to it only when the file
        is complete and checks; the temporary file never outlives the call."""
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(
                dir=target.parent, prefix=f".{target.name}.", suffix=".part"
            )
        except OSError as error:
            return self._unwritable(target.parent, error)
        temporary = Path(name)
        try:
            with os.fdopen(handle, "wb") as file:
                problem = self._copy(response, file, total)
                if problem is None:
                    file.flush()
                    os.fsync(file.fileno())  # complete on disk before it has its name
            problem = problem or elf_mismatch(temporary, build_id)
            if problem is not None:
                return self._failed(address, problem)
            os.replace(temporary, target)
            return _Answer.STORED
        except OSError as error:
            return self._unwritable(target.parent, error)
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()

    def _copy(
        self, response: http.client.HTTPResponse, file: BinaryIO, total: int | None
    ) -> str | None:
        """Streams the body into `file` (whose OSErrors propagate); why the body is
        incomplete or too large, or None."""
        import http.client  # imported by _opener() already

        meter = _Meter(self._progress, total)
        received = 0
        while True:
            try:
                chunk = response.read1(_CHUNK)
            except (OSError, http.client.HTTPException, ValueError) as error:
                return f"broken after {received} bytes: {_reason(error)}"
            if not chunk:
                break
            received += len(chunk)
            if received > self.max_bytes:
                return f"more than the limit of {self.max_bytes} bytes"
            file.write(chunk)
            meter.report(received)
        meter.report(received, last=True)
        if total is not None and received != total:
            return f"ended after {received} of {total} bytes"
        return None

    def _failed(self, address: str, reason: str) -> _Answer:
        self._say(f"cannot use {visible(address)}: {reason}")
        return _Answer.FAILED

    def _unwritable(self, directory: Path, error: OSError) -> _Answer:
        self._say(f"cannot write to the cache {visible(str(directory))}: {_reason(error)}")
        return _Answer.UNWRITABLE

    def _say(self, line: str) -> None:
        if self._notice is not None:
            self._notice(f"debuginfod: {line}")


class _Meter:
    """Progress reports of one download: the first, the last, and at most one per
    PROGRESS_INTERVAL_S between (a 600 MB file arrives in thousands of chunks)."""

    def __init__(self, progress: Progress | None, total: int | None) -> None:
        self._progress = progress
        self._total = total
        self._last = -math.inf
        self.report(0)

    def report(self, done: int, last: bool = False) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if last or now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self._progress(done, self._total)


def _cached(target: Path, build_id: bytes) -> bool:
    """Whether the cache already holds a good file at `target` (elfutils marks a miss with
    an empty file there: that one, or any other junk, is fetched again and replaced)."""
    try:
        regular = target.is_file()  # not a FIFO that open() would wait on forever
    except OSError:  # a directory on the way that cannot be searched, ...
        return False
    return regular and elf_mismatch(target, build_id) is None


def cache_path(environ: Mapping[str, str]) -> Path:
    """The cache directory elfutils' client would use with this environment."""
    explicit = environ.get("DEBUGINFOD_CACHE_PATH")
    if explicit:
        return Path(explicit)
    home = Path(environ.get("HOME") or "/")
    legacy = home / ".debuginfod_client_cache"
    if legacy.exists():
        return legacy
    base = environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else home / ".cache") / "debuginfod_client"


def _server_url(url: str) -> str:
    """`url` without its trailing slashes, as elfutils appends the path to it."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, an unbalanced bracket, ...
        usable = False
    if not usable:
        raise UsageError(f"not a debuginfod server URL (http:// or https://): {visible(url)}")
    return url.strip().rstrip("/")


def _environment_urls(value: str, notice: Notice | None) -> list[str]:
    """DEBUGINFOD_URLS' usable URLs; its "ima:" policy words are for elfutils only."""
    urls = []
    for word in value.split():
        if word.startswith("ima:"):
            continue
        try:
            urls.append(_server_url(word))
        except UsageError as error:
            if notice is not None:
                notice(f"debuginfod: DEBUGINFOD_URLS: {error}")
    return urls


def _timeout(value: str | None, notice: Notice | None) -> float | None:
    """DEBUGINFOD_TIMEOUT in seconds; None (no limit) for zero or negative, as elfutils."""
    if value is None or not value.strip():
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if math.isnan(seconds):
        if notice is not None:
            notice(f"debuginfod: DEBUGINFOD_TIMEOUT={visible(value)} is not a number of seconds")
        return DEFAULT_TIMEOUT_S
    return seconds if 0 < seconds < math.inf else None


def _max_bytes(value: str | None, notice: Notice | None) -> int:
    """DEBUGINFOD_MAXSIZE, within MAX_FILE_BYTES; 0 or unset: MAX_FILE_BYTES."""
    if value is None or not value.strip():
        return MAX_FILE_BYTES
    size = _decimal(value)
    if size is None:
        if notice is not None:
            notice(f"debuginfod: DEBUGINFOD_MAXSIZE={visible(value)} is not a number of bytes")
        return MAX_FILE_BYTES
    return min(size, MAX_FILE_BYTES) or MAX_FILE_BYTES


def _decimal(value: str | None) -> int | None:
    """A size written in decimal (a header's or a variable's value), or None."""
    if value is None:
        return None
    value = value.strip()
    if not (0 < len(value) <= 20 and value.isascii() and value.isdigit()):
        return None
    return int(value)


def _reason(reason: object) -> str:
    """An exception's (or a server's) words, short and safe to print."""
    text = str(reason) or type(reason).__name__
    if len(text) > _REASON_CHARS:
        text = text[:_REASON_CHARS] + "..."
    return visible(text)


# ---- checking a downloaded file: ELF, and its GNU build-id note ------------------------

_ELF_MAGIC = b"\x7fELF"
_SHT_NOTE = 7
_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3
#: Bytes of one note section or segment read at most (a build-id's is 36).
MAX_NOTES_BYTES = 64 * 1024


@dataclass(frozen=True)
class _Shape:
    """struct codes of an ELF class's header (after e_ident), section header and program
    header, and where (type, offset, size, alignment) sit in the latter two."""

    header: str
    section: str
    section_fields: tuple[int, int, int, int]
    segment: str
    segment_fields: tuple[int, int, int, int]


_SHAPES = {
    1: _Shape("HHIIIIIHHHHHH", "10I", (1, 4, 5, 8), "8I", (0, 1, 4, 7)),
    2: _Shape("HHIQQQIHHHHHH", "IIQQQQIIQQ", (1, 4, 5, 8), "IIQQQQQQ", (0, 2, 5, 7)),
}
_ORDERS = {1: "<", 2: ">"}


@dataclass(frozen=True)
class _Table:
    """A section or program header table, and how to read one of its entries."""

    offset: int
    entry_size: int
    count: int
    entry: str
    fields: tuple[int, int, int, int]
    note_type: int


def elf_mismatch(path: Path, build_id: bytes) -> str | None:
    """Why the file at `path` is not the ELF file with `build_id` (unreadable, not ELF,
    another build-id), or None when it is, or has no build-id note to tell (the file
    comes from an untrusted server, or from a cache others write)."""
    try:
        with path.open("rb") as file:
            head = file.read(64)
            form = _form(head)
            if form is None:
                return "not an ELF file"
            found = _build_id(file, head, *form)
    except OSError as error:
        return f"cannot be read: {_reason(error)}"
    if found is None or found == build_id:
        return None
    shown = found[:MAX_BUILD_ID].hex() + ("..." if len(found) > MAX_BUILD_ID else "")
    return f"its build-id is {shown}, not {build_id.hex()}"


def _form(head: bytes) -> tuple[_Shape, str] | None:
    """The shape and byte order of the ELF file that starts with `head`, or None when
    it is not one (ELF of any class and byte order)."""
    if len(head) < 16 or not head.startswith(_ELF_MAGIC):
        return None
    shape, order = _SHAPES.get(head[4]), _ORDERS.get(head[5])
    if shape is None or order is None or len(head) < 16 + struct.calcsize(order + shape.header):
        return None
    return shape, order


def _build_id(file: BinaryIO, head: bytes, shape: _Shape, order: str) -> bytes | None:
    """The GNU build-id of the ELF `file`, None when it has none. Every offset and size
    is checked against the file's size before it is read."""
    fields = struct.unpack_from(order + shape.header, head, 16)
    size = os.fstat(file.fileno()).st_size
    phoff, shoff, phentsize, phnum, shentsize, shnum = (fields[i] for i in (4, 5, 8, 9, 10, 11))
    sections = _Table(shoff, shentsize, shnum, shape.section, shape.section_fields, _SHT_NOTE)
    segments = _Table(phoff, phentsize, phnum, shape.segment, shape.segment_fields, _PT_NOTE)
    for table in (sections, segments):  # a debug file's segments may point at nothing
        for offset, length, align in _note_regions(file, size, order, table):
            found = _note_build_id(_read_at(file, size, offset, length), order, align)
            if found is not None:
                return found
    return None


def _note_regions(
    file: BinaryIO, size: int, order: str, table: _Table
) -> Iterator[tuple[int, int, int]]:
    """(offset, size, alignment) of each note section or segment the table lists."""
    entry = order + table.entry
    if table.entry_size != struct.calcsize(entry):
        return
    data = _read_at(file, size, table.offset, table.entry_size * table.count)
    for at in range(0, len(data) - table.entry_size + 1, table.entry_size):
        values = struct.unpack_from(entry, data, at)
        kind, offset, length, align = (values[i] for i in table.fields)
        if kind == table.note_type and 0 < length <= MAX_NOTES_BYTES:
            yield offset, length, 8 if align == 8 else 4


def _read_at(file: BinaryIO, size: int, offset: int, length: int) -> bytes:
    """`length` bytes at `offset`, or none when they are not all inside the file."""
    if offset + length > size:
        return b""
    file.seek(offset)
    return file.read(length)


def _note_build_id(notes: bytes, order: str, align: int) -> bytes | None:
    """The descriptor of the NT_GNU_BUILD_ID note named "GNU" among `notes`."""
    at = 0
    while at + 12 <= len(notes):
        name_size, desc_size, kind = struct.unpack_from(order + "III", notes, at)
        desc_at = at + 12 + -(-name_size // align) * align
        desc_end = desc_at + desc_size
        if desc_end > len(notes):
            return None
        if kind == _NT_GNU_BUILD_ID and notes[at + 12 : at + 12 + name_size] == b"GNU\0":
            return notes[desc_at:desc_end]
        at = desc_at + -(-desc_size // align) * align
    return None
