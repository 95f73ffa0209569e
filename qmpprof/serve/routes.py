"""The URLs `qmpprof serve` answers, after Go's net/http/pprof.

    /                                   an index of the VMs (HTML)
    /debug/pprof/                       Go's index page: the profile of each VM
    /debug/pprof/profile?seconds=N      the CPU profile of the only VM, or of ?vm=NAME
    /vm/NAME/debug/pprof/               the index of one VM
    /vm/NAME/debug/pprof/profile        the profile of VM NAME (a scraper's path prefix)

`route` turns a Request into a ProfileAsk (sampling to do) or a finished Response, and
raises BadRequest for what it refuses: an unknown VM, a query it cannot read,
`seconds` that is not a whole number from 1 to the server's maximum.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, unquote_plus

from qmpprof.errors import BadRequest
from qmpprof.serve.http import HTML, Request, Response

#: Go's default (net/http/pprof): a scraper that sends no `seconds` gets this.
DEFAULT_SECONDS = 30
#: Query fields read at most; a longer query is refused, not searched.
MAX_QUERY_FIELDS = 32
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PROFILE = "profile"
_PAGES = ("GET", "HEAD")
_PROFILE_METHODS = ("GET",)


@dataclass(frozen=True)
class Site:
    """What is served: the VMs by name, in the order given, and the bound on `seconds`."""

    vms: tuple[str, ...]
    max_seconds: int
    default_seconds: int = DEFAULT_SECONDS


@dataclass(frozen=True)
class ProfileAsk:
    """A profile to take: `seconds` of VM `vm`."""

    vm: str
    seconds: int


def route(
    request: Request, site: Site, states: Mapping[str, str] | None = None
) -> ProfileAsk | Response:
    """What to answer `request` with; raises BadRequest. `states` says what each VM is
    doing (`idle`, `profiling, 12 s left`) for the index."""
    segments = _segments(request.path)
    vm: str | None = None
    if segments[:1] == ["vm"] and len(segments) >= 2:
        vm = _known(site, segments[1])
        segments = segments[2:]
    if vm is None and segments in ([], [""]):
        return _page(request, _root_index(site, states or {}))
    if segments == ["debug", "pprof"]:
        return _redirect(request, request.path + "/")
    if segments[:2] != ["debug", "pprof"] or len(segments) != 3:
        raise BadRequest(404, f"not found: {request.path[:200]}")
    if segments[2] == "":
        return _page(request, _pprof_index(site, vm))
    if segments[2] != _PROFILE:
        raise BadRequest(
            404, f"no profile {segments[2][:100]!r} here: qmpprof serve has 'profile' (CPU) only"
        )
    _allow(request, _PROFILE_METHODS)
    return _profile(site, vm, parse_query(request.query))


def _segments(path: str) -> list[str]:
    """The path's segments after its leading slash, each unescaped."""
    try:
        return [unquote(part, errors="strict") for part in path[1:].split("/")]
    except UnicodeDecodeError:
        raise BadRequest(400, "the path escapes bytes that are not UTF-8") from None


def _known(site: Site, name: str) -> str:
    if name not in site.vms:
        raise BadRequest(404, f"no VM named {name[:100]!r} (this server has {_names(site)})")
    return name


def _names(site: Site) -> str:
    return ", ".join(site.vms)


def _allow(request: Request, methods: tuple[str, ...]) -> None:
    if request.method not in methods:
        allowed = ", ".join(methods)
        raise BadRequest(
            405, f"{request.method} is not allowed here ({allowed})", (("Allow", allowed),)
        )


def _page(request: Request, body: str) -> Response:
    _allow(request, _PAGES)
    return Response(200, body.encode("utf-8"), HTML)


def _redirect(request: Request, location: str) -> Response:
    _allow(request, _PAGES)
    query = f"?{request.query}" if request.query else ""
    return Response(301, b"", headers=(("Location", location + query),))


def parse_query(query: str) -> dict[str, str]:
    """The query's fields (`+` and %XX unescaped); raises BadRequest for a bad escape, a
    field named twice, or too many fields. Empty fields (`a=1&&b=2`) are skipped."""
    fields: dict[str, str] = {}
    parts = [part for part in query.split("&") if part]
    if len(parts) > MAX_QUERY_FIELDS:
        raise BadRequest(400, f"more than {MAX_QUERY_FIELDS} query fields")
    for part in parts:
        if _BAD_ESCAPE.search(part):
            raise BadRequest(400, "a malformed %-escape in the query")
        key, _, value = part.partition("=")
        try:
            key, value = unquote_plus(key, errors="strict"), unquote_plus(value, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest(400, "the query escapes bytes that are not UTF-8") from None
        if key in fields:
            raise BadRequest(400, f"query field {key[:40]!r} given twice")
        fields[key] = value
    return fields


def _profile(site: Site, path_vm: str | None, query: dict[str, str]) -> ProfileAsk:
    """Which VM and how long. Fields other than `seconds` and `vm` are ignored, as Go's
    handler ignores what it does not read (scrapers add their own)."""
    vm = path_vm
    if "vm" in query:
        asked = _known(site, query["vm"])
        if vm is not None and asked != vm:
            raise BadRequest(400, f"the path names VM {vm}, the query VM {asked}")
        vm = asked
    if vm is None:
        if len(site.vms) != 1:
            raise BadRequest(
                400,
                f"this server has several VMs ({_names(site)}): choose one with ?vm=NAME "
                "or /vm/NAME/debug/pprof/profile",
            )
        vm = site.vms[0]
    return ProfileAsk(vm, _seconds(site, query.get("seconds")))


def _seconds(site: Site, text: str | None) -> int:
    if text is None:
        return min(site.default_seconds, site.max_seconds)
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < 1:
        raise BadRequest(
            400, f"seconds must be a whole number from 1 to {site.max_seconds}, not {text[:40]!r}"
        )
    if int(text) > site.max_seconds:
        raise BadRequest(
            400,
            f"seconds={int(text)} is over this server's maximum of {site.max_seconds} "
            "(qmpprof serve --max-seconds)",
        )
    return int(text)


# --- the index pages ---------------------------------------------------------------------


def _root_index(site: Site, states: Mapping[str, str]) -> str:
    rows = "".join(
        f"<li><a href='vm/{name}/debug/pprof/'>{html.escape(name)}</a> "
        f"({html.escape(states.get(name, 'idle'))}): "
        f"<a href='vm/{name}/debug/pprof/profile?seconds={site.default_seconds}'>"
        f"profile ({site.default_seconds} s)</a></li>\n"
        for name in site.vms
    )
    return _document(
        "qmpprof serve",
        f"<p>{len(site.vms)} VM(s), profiled from outside over QMP. "
        f"<a href='debug/pprof/'>/debug/pprof/</a></p>\n<ul>\n{rows}</ul>\n",
    )


def _pprof_index(site: Site, vm: str | None) -> str:
    """Go's index page: the profiles, each with a link; here one per VM."""
    names = (vm,) if vm is not None else site.vms
    query = "" if vm is not None or len(site.vms) == 1 else "vm={}&amp;"
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        f"<td><a href='profile?{query.format(name)}seconds={site.default_seconds}'>"
        f"profile</a></td></tr>\n"
        for name in names
    )
    prefix = f"/vm/{vm}" if vm is not None else ""
    return _document(
        f"{prefix}/debug/pprof/",
        f"<p>{prefix}/debug/pprof/</p>\n"
        "<table>\n<thead><td>VM</td><td>Profile</td></thead>\n"
        f"{rows}</table>\n<p>Profile Descriptions:</p>\n<ul>\n"
        "<li><div class=profile-name>profile: </div> CPU profile of the guest, sampled "
        "from outside over QMP. You can specify the duration in the seconds GET parameter "
        f"(default {site.default_seconds}, at most {site.max_seconds}). After you get the "
        "profile file, use the go tool pprof command to investigate the profile.</li>\n</ul>\n",
    )


def _document(title: str, body: str) -> str:
    return (
        f"<html>\n<head>\n<title>{html.escape(title)}</title>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )
