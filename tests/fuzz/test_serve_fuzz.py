"""Hostile HTTP request heads for `serve`: in any bytes, cut into any chunks, the reader
holds no more than its bound, and parsing and routing end in a Request and an answer or
a BadRequest with an HTTP status and one line, never anything else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import BadRequest
from qmpprof.serve.http import MAX_HEAD_BYTES, REASONS, HeadReader, Request, Response
from qmpprof.serve.routes import ProfileAsk, Site, route
from tests.fuzz.budget import cases, counted

SITE = Site(("a", "web-1"), max_seconds=60)
VALID = (
    b"GET /vm/a/debug/pprof/profile?seconds=5&vm=a HTTP/1.1\r\n"
    b"Host: 127.0.0.1:6060\r\nUser-Agent: Go-http-client/1.1\r\n"
    b"Accept-Encoding: gzip\r\nContent-Length: 0\r\n\r\n"
)
#: Bytes that mean something to the parser, so that random heads get past its first checks.
MEANINGFUL = b"GET HEAD /?&=%:; \t\r\n HTTP/1.1 Host vm seconds debug pprof profile 0aZ\x00\xff"


def read_or_refuse(data: bytes, cuts: list[int]) -> None:
    """Feed `data` in chunks cut at `cuts`; check what comes out."""
    reader = HeadReader()
    start = 0
    try:
        for end in [*sorted(cuts), len(data)]:
            request = reader.feed(data[start:end])
            start = end
            if request is not None:
                _check_routed(request)
                return
    except BadRequest as error:
        assert error.status in REASONS and 400 <= error.status < 600
        assert str(error) and "\n" not in str(error)
        return
    # no head yet: the reader may hold only what its bounds let through
    assert len(data) <= MAX_HEAD_BYTES + 4096


def _check_routed(request: Request) -> None:
    try:
        answer = route(request, SITE, {"a": "idle"})
    except BadRequest as error:
        assert error.status in REASONS and "\n" not in str(error)
        return
    if isinstance(answer, ProfileAsk):
        assert answer.vm in SITE.vms and 1 <= answer.seconds <= SITE.max_seconds
    else:
        assert isinstance(answer, Response) and answer.status in REASONS
        assert answer.encode().startswith(f"HTTP/1.1 {answer.status} ".encode())


@settings(max_examples=cases(300))
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=6))
@counted
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    read_or_refuse(data, [c for c in cuts if c <= len(data)])


@settings(max_examples=cases(400))
@given(
    at=st.integers(0, len(VALID)),
    removed=st.integers(0, 8),
    inserted=st.lists(st.sampled_from(list(MEANINGFUL)), max_size=16).map(bytes),
    cuts=st.lists(st.integers(0, len(VALID) + 16), max_size=4),
)
@counted
def test_spliced_valid_request(at: int, removed: int, inserted: bytes, cuts: list[int]) -> None:
    data = VALID[:at] + inserted + VALID[at + removed :]
    read_or_refuse(data, [c for c in cuts if c <= len(data)])


@settings(max_examples=cases(150))
@given(
    target=st.lists(st.sampled_from(list(MEANINGFUL[:40])), max_size=80).map(bytes),
    headers=st.integers(0, 80),
    width=st.sampled_from([1, 100, 9000]),
)
@counted
def test_targets_and_header_floods(target: bytes, headers: int, width: int) -> None:
    head = b"GET /" + target + b" HTTP/1.1\r\nHost: h\r\n"
    head += (b"X-F: " + b"f" * width + b"\r\n") * headers + b"\r\n"
    read_or_refuse(head, [len(head) // 2])
