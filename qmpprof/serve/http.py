"""HTTP/1.1 request heads as `qmpprof serve` reads them, and the responses it writes.

Everything a client sends is attacker-facing: the head is collected within bounds
(MAX_HEAD_BYTES in all, MAX_LINE_BYTES a line, MAX_HEADERS lines) and parsed strictly
(RFC 9112: one space between the request line's parts, no space before a header's
colon, no line folding, no control characters). A request that breaks a rule raises
BadRequest with the status to answer. No body is read: every answer closes the
connection, and a request that announces a body is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from qmpprof.errors import BadRequest
from qmpprof.visible import visible

#: A request line or header line longer than this is refused (Go's and nginx's are 8 KiB
#: too): the URLs served here are short.
MAX_LINE_BYTES = 8 * 1024
#: The whole head: request line, headers and the blank line.
MAX_HEAD_BYTES = 32 * 1024
MAX_HEADERS = 64

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
#: A request target: visible ASCII only (RFC 3986 characters; others must be escaped).
_TARGET = re.compile(rb"[\x21-\x7e]+")
#: Header values: anything but control characters (HTAB allowed), obs-text included.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_ABSOLUTE = re.compile(rb"https?://[^/?#]*", re.IGNORECASE)

REASONS = {
    200: "OK",
    301: "Moved Permanently",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
PPROF = "application/octet-stream"


@dataclass(frozen=True)
class Request:
    """One request head: the path and query as sent (escapes kept), header names in
    lower case."""

    method: str
    path: str
    query: str
    version: tuple[int, int]
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        """The value of header `name` (lower case), the first if repeated."""
        return next((value for key, value in self.headers if key == name), None)


class HeadReader:
    """Bytes of a connection in, a Request out once its blank line has come.

    Raises BadRequest as soon as the bytes so far break a bound, so a client cannot make
    it hold more than MAX_HEAD_BYTES."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._searched = 0

    def feed(self, data: bytes) -> Request | None:
        """The request, when `data` completes its head (bytes after it are left: no
        body is read); None while more is needed."""
        self._buffer += data
        end = _head_end(self._buffer, self._searched)
        if end is None:
            self._searched = max(0, len(self._buffer) - 2)
            _check_partial(self._buffer)
            return None
        return parse_head(bytes(self._buffer[:end]))

    @property
    def started(self) -> bool:
        return bool(self._buffer)


def _head_end(buffer: bytearray, start: int) -> int | None:
    """Where the head ends (just past its blank line), or None; `start` skips bytes
    already searched."""
    ends = [
        found + len(mark)
        for mark in (b"\n\n", b"\n\r\n")
        if (found := buffer.find(mark, start)) >= 0
    ]
    return min(ends) if ends else None


def _check_partial(buffer: bytearray) -> None:
    """Refuse a head that already breaks a bound before its end has come."""
    line_start = buffer.rfind(b"\n") + 1
    if len(buffer) - line_start > MAX_LINE_BYTES:
        if line_start == 0:
            raise BadRequest(414, f"request line longer than {MAX_LINE_BYTES} bytes")
        raise BadRequest(431, f"header line longer than {MAX_LINE_BYTES} bytes")
    if len(buffer) > MAX_HEAD_BYTES:
        raise BadRequest(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
    if buffer.count(b"\n") > MAX_HEADERS + 1:
        raise BadRequest(431, f"more than {MAX_HEADERS} header lines")


def parse_head(head: bytes) -> Request:
    """A whole request head (ending with its blank line) as a Request; raises BadRequest."""
    if len(head) > MAX_HEAD_BYTES:
        raise BadRequest(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
    lines = _lines(head)
    if len(lines) > MAX_HEADERS + 1:
        raise BadRequest(431, f"more than {MAX_HEADERS} header lines")
    method, path, query, version = _request_line(lines[0])
    headers = tuple(_header(line) for line in lines[1:])
    request = Request(method, path, query, version, headers)
    _check_headers(request)
    return request


def _lines(head: bytes) -> list[bytes]:
    """The head's lines without their endings (CRLF, or LF alone) and without the blank
    line that ends it; a CR anywhere else is refused."""
    lines = head.split(b"\n")
    if len(lines) < 3 or lines[-1] != b"" or lines[-2] not in (b"", b"\r"):
        raise BadRequest(400, "malformed request head")
    kept = [line[:-1] if line.endswith(b"\r") else line for line in lines[:-2]]
    for line in kept:
        if len(line) > MAX_LINE_BYTES:
            raise BadRequest(431, f"a line longer than {MAX_LINE_BYTES} bytes")
        if b"\r" in line:
            raise BadRequest(400, "a bare CR in the request head")
    return kept


def _request_line(line: bytes) -> tuple[str, str, str, tuple[int, int]]:
    parts = line.split(b" ")
    if len(parts) != 3 or not all(parts):
        raise BadRequest(400, "malformed request line (expected METHOD TARGET HTTP/1.1)")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise BadRequest(400, "malformed method")
    matched = _VERSION.fullmatch(version)
    if matched is None:
        raise BadRequest(400, "malformed HTTP version")
    major, minor = int(matched[1]), int(matched[2])
    if (major, minor) not in ((1, 0), (1, 1)):
        raise BadRequest(505, f"HTTP/{major}.{minor} is not served here (HTTP/1.1 is)")
    path, query = _target(target)
    return method.decode("ascii"), path, query, (major, minor)


def _target(target: bytes) -> tuple[str, str]:
    """The path and query of a request target in origin form (`/path?query`) or
    absolute form (`http://host/path?query`, as proxies send it)."""
    if not _TARGET.fullmatch(target) or b"#" in target:
        raise BadRequest(400, "malformed request target")
    absolute = _ABSOLUTE.match(target)
    if absolute is not None:
        target = target[absolute.end() :] or b"/"
        if target.startswith(b"?"):
            target = b"/" + target
    if not target.startswith(b"/"):
        raise BadRequest(400, "request target must be a path (/debug/pprof/profile)")
    path, _, query = target.decode("ascii").partition("?")
    return path, query


def _header(line: bytes) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise BadRequest(400, "obsolete header line folding")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        raise BadRequest(400, "malformed header line")
    value = value.strip(b" \t")
    if _BAD_VALUE.search(value):
        raise BadRequest(400, "a control character in a header value")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _check_headers(request: Request) -> None:
    names = [name for name, _ in request.headers]
    hosts = names.count("host")
    if hosts > 1 or (hosts == 0 and request.version == (1, 1)):
        raise BadRequest(400, "an HTTP/1.1 request needs exactly one Host header")
    if "transfer-encoding" in names:
        raise BadRequest(400, "request bodies are not accepted (Transfer-Encoding)")
    lengths = {value for name, value in request.headers if name == "content-length"}
    if not lengths:
        return
    if len(lengths) > 1 or not all(length.isdigit() and length.isascii() for length in lengths):
        raise BadRequest(400, "malformed Content-Length")
    if int(lengths.pop()) != 0:
        raise BadRequest(413, "request bodies are not accepted")


@dataclass(frozen=True)
class Response:
    """One answer; the connection is closed after it."""

    status: int
    body: bytes = b""
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self, head_only: bool = False) -> bytes:
        """The bytes on the wire: status line, headers, blank line and (not for HEAD) body."""
        reason = REASONS.get(self.status, "")
        lines = [
            f"HTTP/1.1 {self.status} {reason}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            "X-Content-Type-Options: nosniff",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def text_response(status: int, line: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """A one-line plain-text answer (an error's): `go tool pprof` prints the line when
    X-Go-Pprof is set, as Go's own handlers do."""
    body = (visible(" ".join(line.split())) + "\n").encode("utf-8", "replace")
    return Response(status, body, TEXT, (("X-Go-Pprof", "1"), *headers))


def refused(error: BadRequest) -> Response:
    return text_response(error.status, str(error), error.headers)
