"""`serve`'s request heads, read from the bytes real clients send, and its answers."""

from __future__ import annotations

import pytest

from qmpprof.errors import BadRequest
from qmpprof.serve.http import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LINE_BYTES,
    HeadReader,
    Request,
    Response,
    parse_head,
    text_response,
)

#: What `go tool pprof http://127.0.0.1:6060/debug/pprof/profile?seconds=5` sends (Go 1.19).
GO_PPROF = (
    b"GET /debug/pprof/profile?seconds=5 HTTP/1.1\r\n"
    b"Host: 127.0.0.1:6060\r\n"
    b"User-Agent: Go-http-client/1.1\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"\r\n"
)
#: curl 7.88's, through a proxy (absolute form), and a hand-typed HTTP/1.0 one (LF only).
CURL_PROXY = (
    b"GET http://127.0.0.1:6060/vm/a/debug/pprof/profile HTTP/1.1\r\n"
    b"Host: 127.0.0.1:6060\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n"
    b"Proxy-Connection: Keep-Alive\r\n\r\n"
)
NETCAT = b"GET / HTTP/1.0\n\n"


def test_go_pprof_request() -> None:
    request = parse_head(GO_PPROF)
    assert (request.method, request.path, request.query) == (
        "GET",
        "/debug/pprof/profile",
        "seconds=5",
    )
    assert request.version == (1, 1)
    assert request.header("user-agent") == "Go-http-client/1.1"
    assert request.header("host") == "127.0.0.1:6060"


def test_absolute_form_and_bare_lf() -> None:
    assert parse_head(CURL_PROXY).path == "/vm/a/debug/pprof/profile"
    assert parse_head(b"GET http://h?x=1 HTTP/1.1\r\nHost: h\r\n\r\n").query == "x=1"
    request = parse_head(NETCAT)
    assert request == Request("GET", "/", "", (1, 0), ())


def test_head_reader_takes_bytes_one_at_a_time() -> None:
    reader = HeadReader()
    found = [reader.feed(GO_PPROF[i : i + 1]) for i in range(len(GO_PPROF))]
    assert found[:-1] == [None] * (len(GO_PPROF) - 1)
    assert found[-1] == parse_head(GO_PPROF)


def test_head_reader_leaves_what_follows_the_head() -> None:
    reader = HeadReader()
    assert reader.feed(GO_PPROF + b"GET / HTTP/1.1\r\n") == parse_head(GO_PPROF)


def refusal(head: bytes) -> tuple[int, str]:
    with pytest.raises(BadRequest) as caught:
        parse_head(head)
    return caught.value.status, str(caught.value)


@pytest.mark.parametrize(
    ("head", "status", "says"),
    [
        (b"GET /  HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b"GET / HTTP/1.1 x\r\nHost: h\r\n\r\n", 400, "malformed request line"),
        (b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed method"),
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505, "HTTP/2.0"),
        (b"GET / HTTPS/1.1\r\nHost: h\r\n\r\n", 400, "malformed HTTP version"),
        (b"GET relative HTTP/1.1\r\nHost: h\r\n\r\n", 400, "must be a path"),
        (b"GET /\xff HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request target"),
        (b"GET /#frag HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request target"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "exactly one Host"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "exactly one Host"),
        (b"GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400, "malformed header line"),
        (b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", 400, "line folding"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n", 400, "control character"),
        (b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n", 400, "bare CR"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n", 413, "bodies"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length"),
        (b"GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "bodies"),
        (b"\r\n\r\n", 400, "malformed request line"),
    ],
)
def test_refused_heads(head: bytes, status: int, says: str) -> None:
    got_status, line = refusal(head)
    assert got_status == status and says in line and "\n" not in line


def test_content_length_zero_is_no_body() -> None:
    assert parse_head(b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n").path == "/"


def test_bounds_refuse_before_the_end_comes() -> None:
    reader = HeadReader()
    with pytest.raises(BadRequest) as caught:
        reader.feed(b"GET /" + b"a" * MAX_LINE_BYTES)
    assert caught.value.status == 414
    reader = HeadReader()
    reader.feed(b"GET / HTTP/1.1\r\nHost: h\r\n")
    with pytest.raises(BadRequest) as caught:
        reader.feed(b"X-Long: " + b"b" * MAX_LINE_BYTES)
    assert caught.value.status == 431
    reader = HeadReader()
    with pytest.raises(BadRequest) as caught:
        reader.feed(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1))
    assert caught.value.status == 431
    reader = HeadReader()
    with pytest.raises(BadRequest) as caught:
        for _ in range(MAX_HEADERS):
            reader.feed(b"X-Wide: " + b"c" * (MAX_HEAD_BYTES // MAX_HEADERS) + b"\r\n")
    assert caught.value.status == 431


def test_response_bytes() -> None:
    wire = text_response(429, "busy\nnow", (("Retry-After", "3"),)).encode()
    assert wire == (
        b"HTTP/1.1 429 Too Many Requests\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 9\r\n"
        b"Connection: close\r\nX-Content-Type-Options: nosniff\r\n"
        b"X-Go-Pprof: 1\r\nRetry-After: 3\r\n\r\nbusy now\n"
    )
    head_only = Response(200, b"abc").encode(head_only=True)
    assert head_only.endswith(
        b"Content-Length: 3\r\nConnection: close\r\nX-Content-Type-Options: nosniff\r\n\r\n"
    )
