"""`serve`'s URLs: which VM, how long, and what is refused; and the `vm` label it adds."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from qmpprof.errors import BadRequest
from qmpprof.output.pprof import pprof_bytes
from qmpprof.profile import Scope
from qmpprof.serve.addresses import listen_address, vm_spec
from qmpprof.serve.http import Response, parse_head
from qmpprof.serve.routes import ProfileAsk, Site, parse_query, route
from tests.consumers.protobuf import Fields, decode_message, ints, messages, one
from tests.consumers.samples import RECORDING, realistic_samples

ONE = Site(("web",), max_seconds=60)
TWO = Site(("a", "b"), max_seconds=60)


def routed(site: Site, target: str, method: str = "GET") -> ProfileAsk | Response:
    head = f"{method} {target} HTTP/1.1\r\nHost: h\r\n\r\n".encode()
    return route(parse_head(head), site)


def refused(site: Site, target: str, method: str = "GET") -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        routed(site, target, method)
    assert "\n" not in str(caught.value)
    return caught.value


def test_profile_paths() -> None:
    assert routed(ONE, "/debug/pprof/profile") == ProfileAsk("web", 30)
    assert routed(ONE, "/debug/pprof/profile?seconds=5") == ProfileAsk("web", 5)
    assert routed(TWO, "/debug/pprof/profile?vm=b&seconds=60") == ProfileAsk("b", 60)
    assert routed(TWO, "/vm/a/debug/pprof/profile?seconds=7") == ProfileAsk("a", 7)
    assert routed(TWO, "/vm/%61/debug/pprof/profile?vm=a") == ProfileAsk("a", 30)
    # fields a scraper adds are ignored, as Go's handler ignores them; empty ones too
    assert routed(ONE, "/debug/pprof/profile?seconds=3&&job=x&debug=1") == ProfileAsk("web", 3)


def test_default_is_capped_by_the_maximum() -> None:
    assert routed(Site(("x",), max_seconds=10), "/debug/pprof/profile") == ProfileAsk("x", 10)


@pytest.mark.parametrize(
    ("site", "target", "status", "says"),
    [
        (TWO, "/debug/pprof/profile", 400, "several VMs (a, b)"),
        (TWO, "/debug/pprof/profile?vm=c", 404, "no VM named 'c'"),
        (TWO, "/vm/c/debug/pprof/profile", 404, "no VM named 'c'"),
        (TWO, "/vm/a/debug/pprof/profile?vm=b", 400, "the path names VM a"),
        (ONE, "/debug/pprof/profile?seconds=", 400, "whole number"),
        (ONE, "/debug/pprof/profile?seconds=-1", 400, "whole number"),
        (ONE, "/debug/pprof/profile?seconds=%C2%B2", 400, "whole number"),  # a superscript 2
        (ONE, "/debug/pprof/profile?seconds=99999999999999", 400, "whole number"),
        (ONE, "/debug/pprof/profile?seconds=61", 400, "maximum of 60"),
        (ONE, "/debug/pprof/profile?seconds=5&seconds=5", 400, "given twice"),
        (ONE, "/debug/pprof/profile?seconds=%4", 400, "malformed %-escape"),
        (ONE, "/debug/pprof/profile?vm=%ff", 400, "not UTF-8"),
        (ONE, "/debug/pprof/profile?" + "&".join(f"k{i}=1" for i in range(40)), 400, "fields"),
        (ONE, "/debug/pprof/goroutine", 404, "'profile' (CPU) only"),
        (ONE, "/metrics", 404, "not found"),
        (ONE, "/%ff/", 400, "not UTF-8"),
    ],
)
def test_refused(site: Site, target: str, status: int, says: str) -> None:
    error = refused(site, target)
    assert error.status == status and says in str(error)


def test_methods() -> None:
    error = refused(ONE, "/debug/pprof/profile", "HEAD")
    assert error.status == 405 and error.headers == (("Allow", "GET"),)
    assert refused(ONE, "/", "DELETE").headers == (("Allow", "GET, HEAD"),)
    page = routed(ONE, "/", "HEAD")
    assert isinstance(page, Response) and page.status == 200


def test_pages() -> None:
    index = routed(TWO, "/")
    assert isinstance(index, Response) and index.content_type.startswith("text/html")
    assert b"vm/a/debug/pprof/profile?seconds=30" in index.body
    pprof_index = routed(TWO, "/debug/pprof/")
    assert isinstance(pprof_index, Response)
    assert b"profile?vm=b&amp;seconds=30" in pprof_index.body
    redirect = routed(TWO, "/vm/a/debug/pprof?x=1")
    assert isinstance(redirect, Response) and redirect.status == 301
    assert redirect.headers == (("Location", "/vm/a/debug/pprof/?x=1"),)
    states = route(parse_head(b"GET / HTTP/1.0\r\n\r\n"), TWO, {"a": "profiling, 3 s left"})
    assert isinstance(states, Response) and b"a</a> (profiling, 3 s left)" in states.body
    assert b"b</a> (idle)" in states.body


def test_query_fields() -> None:
    assert parse_query("a=1+2&b=%2F&c") == {"a": "1 2", "b": "/", "c": ""}


def strings(message: Fields) -> list[str]:
    return [s.decode() for s in message[6] if isinstance(s, bytes)]


def resolved(message: Fields, number: int, texts: tuple[int, ...]) -> list[dict[int, Any]]:
    """Each repeated field `number` of a profile, its string-table fields `texts` read as
    the strings they index (the tables of two profiles may order them differently)."""
    table = strings(message)
    return [
        {k: [table[i] for i in ints(m, k)] if k in texts else v for k, v in m.items()}
        for m in messages(message, number)
    ]


def sample_labels(message: Fields) -> list[list[tuple[str, str]]]:
    table = strings(message)
    return [
        [(table[one(label, 1)], table[one(label, 2)]) for label in messages(sample, 3)]
        for sample in messages(message, 2)
    ]


def test_every_sample_gets_the_vm_label_and_nothing_else_changes() -> None:
    raw = pprof_bytes(realistic_samples(), RECORDING, Scope.ALL, False)
    labelled = decode_message(
        pprof_bytes(realistic_samples(), RECORDING, Scope.ALL, False, labels=[("vm", "web-1")])
    )
    plain = decode_message(raw)
    samples = messages(labelled, 2)
    assert len(samples) == len(messages(plain, 2)) > 0
    for tags, tags_before in zip(sample_labels(labelled), sample_labels(plain), strict=True):
        assert tags == [*tags_before, ("vm", "web-1")]
    for sample, before in zip(samples, messages(plain, 2), strict=True):
        assert ints(sample, 1) == ints(before, 1) and ints(sample, 2) == ints(before, 2)
    # mappings (file names), locations, functions (names, files): as written
    for number, texts in ((3, (5, 6)), (4, ()), (5, (2, 3, 4))):
        assert resolved(labelled, number, texts) == resolved(plain, number, texts)
    assert pprof_bytes(realistic_samples(), RECORDING, Scope.ALL, False, labels=()) == raw


def test_command_line_values() -> None:
    assert vm_spec("web-1=/run/vm/web.qmp") == ("web-1", "/run/vm/web.qmp")
    assert listen_address("[::1]:0") == ("::1", 0)
    assert listen_address("0.0.0.0:6060") == ("0.0.0.0", 6060)
    for bad in ("nosocket", "=x", "-a=x", "a/b=x", "é=x"):
        with pytest.raises(argparse.ArgumentTypeError):
            vm_spec(bad)
    for bad in ("6060", ":6060", "h:65536", "h:x", "h:٣"):
        with pytest.raises(argparse.ArgumentTypeError):
            listen_address(bad)
