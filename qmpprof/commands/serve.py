"""`qmpprof serve`: profiles of one or many VMs over HTTP, for scrapers (Parca, Grafana
Alloy's pyroscope.scrape) and `go tool pprof http://HOST:PORT/debug/pprof/profile`.

Each scrape is a short `record`: it connects to its VM's QMP socket, or to a libvirt
domain as `--libvirt` does (commands/connect),
samples for the seconds asked (record/sampler.sample_loop, analysed by a Collector in the
sampler's idle time, as `record` does), disconnects, and answers with the pprof that
`record -o x.pb.gz` writes, every sample labelled with its VM. Nothing is kept between
scrapes (the binaries are loaded again, the VM's kernel found again), so memory does not
grow with the scrapes, the QMP socket is free between them, and a VM that went away and
came back (or was replaced) is simply found on the next scrape.

One scrape per VM at a time: QMP serves one client per socket, so a second request for
a VM being profiled is answered 429 with Retry-After. A client that hangs up, and
SIGINT/SIGTERM, end the sampling at the next tick boundary, never mid-tick: the VM is
resumed as after any tick (target/pause.py).
"""

from __future__ import annotations

import asyncio
import gzip
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from qmpprof.commands.collect import Collector
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import choose_nonblocking, connected
from qmpprof.commands.record import stop_on_signals
from qmpprof.console import Console, say
from qmpprof.defaults import DEFAULT_RATE_HZ
from qmpprof.errors import (
    BadQmpMessage,
    BadRequest,
    CommandFailed,
    ConnectionFailed,
    MonitorStuck,
    QmpprofError,
    TargetGone,
    UsageError,
)
from qmpprof.model import CapturedSample, Recording, RecordStats
from qmpprof.output.pprof import pprof_bytes
from qmpprof.profile import Grouping, Profile, Scope
from qmpprof.record.backlog import Backlog
from qmpprof.record.sampler import LoopConfig, sample_loop, why_nothing_sampled
from qmpprof.serve.addresses import DEFAULT_MAX_SECONDS, VM_NAME
from qmpprof.serve.http import PPROF, Request, Response, refused, text_response
from qmpprof.serve.routes import ProfileAsk, Site, route
from qmpprof.serve.server import HttpServer

#: The distinct connection notices remembered per VM (each logged once).
MAX_NOTICES = 64
#: On SIGINT/SIGTERM, how long answers under way may take before their connections are
#: cut (the sampling itself stops at its next tick).
SHUTDOWN_GRACE_S = 10.0
#: What a VM that cannot be reached (or went away) is answered with: it may come back.
_UNREACHABLE = (ConnectionFailed, TargetGone, BadQmpMessage, CommandFailed, MonitorStuck)


@dataclass(frozen=True)
class ServeOptions:
    #: (name, QMP socket) of each VM, in the order given.
    vms: tuple[tuple[str, str], ...]
    #: Everything but the socket, for every VM (the binaries, the unwinder, memory).
    target: TargetOptions
    listen: tuple[str, int] = ("127.0.0.1", 6060)
    period_s: float = 1 / DEFAULT_RATE_HZ
    max_seconds: int = DEFAULT_MAX_SECONDS
    include_idle: bool = False
    nonblocking: bool = False
    #: --stop: stop mode even where it is chosen against by default (through libvirt).
    force_stop: bool = False
    #: libvirt domains (`target.libvirt_uri`'s), each served under its name.
    domains: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every VM's name, in the order served: the --vm ones, then the domains."""
        return tuple(name for name, _ in self.vms) + self.domains


async def run_serve(options: ServeOptions, err: Console) -> None:
    """Serve until SIGINT or SIGTERM. Raises BadElf for binaries that do not load
    (checked once, before listening), UsageError, ListenFailed."""
    _check_vms(options)
    build_analyzer(options.target)  # a bad --kernel is one line now, not a 500 per scrape
    shutdown = asyncio.Event()
    with stop_on_signals(shutdown):
        service = Service(options, shutdown, lambda line: _say(err, line))
        server = HttpServer(service.handle, service.log)
        host, port = await server.start(*options.listen)
        _say(err, _listening_line(options, host, port))
        await shutdown.wait()
        _say(err, "stopping: answers under way end at their next tick")
        await server.close(SHUTDOWN_GRACE_S)


def _check_vms(options: ServeOptions) -> None:
    if not options.vms and not options.domains:
        raise UsageError("serve needs at least one --vm NAME=SOCKET or --libvirt DOMAIN")
    for domain in options.domains:
        if not VM_NAME.fullmatch(domain):
            raise UsageError(
                f"--libvirt {domain!r}: serve names a domain's profiles after it, and a VM "
                "name is 1 to 64 letters, digits, '.', '_' or '-' (use --vm NAME=SOCKET "
                "with the domain's own QMP socket)"
            )
    names = list(options.names)
    sockets = [socket for _, socket in options.vms]
    for kind, values in (("name", names), ("socket", sockets)):
        twice = sorted({value for value in values if values.count(value) > 1})
        if twice:
            raise UsageError(f"--vm, --libvirt: the same {kind} given twice: {', '.join(twice)}")


def vm_targets(options: ServeOptions) -> dict[str, TargetOptions]:
    """Each VM's name and how to reach it: its socket, or its libvirt domain."""
    from qmpprof.target.libvirt import proxy_socket

    targets = {name: replace(options.target, qmp_socket=socket) for name, socket in options.vms}
    uri = options.target.libvirt_uri
    for domain in options.domains:
        targets[domain] = replace(
            options.target, libvirt=domain, qmp_socket=proxy_socket(domain, uri)
        )
    return targets


def _listening_line(options: ServeOptions, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(options.names)
    line = f"serving {names} on http://{shown}:{port}/debug/pprof/ (Ctrl-C stops)"
    if host not in ("127.0.0.1", "::1", "localhost"):
        line += "; not loopback: whoever reaches this port can pause-sample these VMs"
    return line


def _say(err: Console, line: str) -> None:
    say(err, f"qmpprof serve: {line}")


@dataclass
class _Vm:
    name: str
    target: TargetOptions
    #: When the scrape under way ends (time.monotonic); None when idle.
    busy_until: float | None = None
    #: What this VM's log has said: each is said once, not at every scrape (a scraper
    #: asks every few seconds), keyed by the line or by what it is about.
    noticed: set[str] = field(default_factory=set)

    def notice_once(
        self, log: Callable[[str], None], about: str | None = None
    ) -> Callable[[str], None]:
        """`log`, prefixed with the VM's name, for lines this VM has not logged yet
        (which kernel it runs, that it gives none: they hold until it reboots); with
        `about`, for the first line about that only (its figures change each time)."""

        def notice(line: str) -> None:
            key = line if about is None else f"\0{about}"
            if key in self.noticed:
                return
            if len(self.noticed) >= MAX_NOTICES:  # a guest rebooting all day: start over
                self.noticed.clear()
            self.noticed.add(key)
            log(f"VM {self.name}: {line}")

        return notice

    def state(self) -> str:
        if self.busy_until is None:
            return "idle"
        return f"profiling, {max(0, math.ceil(self.busy_until - time.monotonic()))} s left"


class Service:
    """The answers: index pages and refusals from serve/routes.py, profiles from here."""

    def __init__(
        self, options: ServeOptions, shutdown: asyncio.Event, log: Callable[[str], None]
    ) -> None:
        self.options = options
        self.shutdown = shutdown
        self.log = log
        targets = vm_targets(options)
        self.site = Site(tuple(targets), options.max_seconds)
        self._vms = {name: _Vm(name, target) for name, target in targets.items()}

    async def handle(self, request: Request, gone: asyncio.Event) -> Response | None:
        try:
            routed = route(request, self.site, {vm.name: vm.state() for vm in self._vms.values()})
        except BadRequest as error:
            return refused(error)
        if isinstance(routed, Response):
            return routed
        return await self._profile(routed, gone)

    async def _profile(self, ask: ProfileAsk, gone: asyncio.Event) -> Response | None:
        vm = self._vms[ask.vm]
        if self.shutdown.is_set():
            return text_response(503, "qmpprof serve is stopping")
        if vm.busy_until is not None:
            left = max(1, math.ceil(vm.busy_until - time.monotonic()))
            return text_response(
                429,
                f"VM {vm.name} is being profiled for another request (QMP serves one "
                f"client); its profile ends in about {left} s",
                (("Retry-After", str(left)),),
            )
        vm.busy_until = time.monotonic() + ask.seconds
        try:
            return await self._sampled(vm, ask.seconds, gone)
        finally:
            vm.busy_until = None

    async def _sampled(self, vm: _Vm, seconds: int, gone: asyncio.Event) -> Response | None:
        stop = asyncio.Event()
        relay = asyncio.create_task(_first_of((gone, self.shutdown), stop))
        try:
            scraped = await scrape(vm, seconds, self.options, stop, self.log)
        except _UNREACHABLE as error:
            return text_response(503, f"VM {vm.name}: {error}")
        except QmpprofError as error:
            return text_response(500, f"VM {vm.name}: {error}")
        finally:
            relay.cancel()
        if gone.is_set():
            return None
        if self.shutdown.is_set():
            return text_response(503, "qmpprof serve is stopping")
        return scraped.response(vm.name)


async def _first_of(events: tuple[asyncio.Event, ...], then: asyncio.Event) -> None:
    """Set `then` once any of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        then.set()
    finally:
        for wait in waits:
            wait.cancel()


@dataclass
class Scraped:
    """One scrape's samples and how the sampling went."""

    collector: Collector
    stats: RecordStats
    recording: Recording
    mismatch: str | None = None

    def response(self, vm: str) -> Response:
        """The gzipped pprof, labelled vm=`vm`; 503 when the VM went away (or stopped
        answering) during the scrape, 500 when --kernel does not name its PCs."""
        ended = self.stats.ended_by
        if ended is not None:
            return text_response(
                503, f"VM {vm}: {ended} after {self.stats.elapsed_s:.1f} s; no profile"
            )
        if self.mismatch is not None:
            return text_response(500, f"VM {vm}: {self.mismatch}")
        if (why := why_nothing_sampled(self.stats)) is not None:
            return text_response(503, f"VM {vm}: {why}; no profile")
        profile = self.collector.profile
        raw = pprof_bytes(
            self.collector.samples,
            self.recording,
            profile.scope,
            profile.include_idle,
            labels=(("vm", vm),),
        )
        body = gzip.compress(raw, compresslevel=6)
        disposition = f'attachment; filename="{vm}.pb.gz"'
        return Response(200, body, PPROF, (("Content-Disposition", disposition),))


async def scrape(
    vm: _Vm, seconds: int, options: ServeOptions, stop: asyncio.Event, log: Callable[[str], None]
) -> Scraped:
    """Sample `vm` for `seconds` (less if `stop` is set) as `record` does. Raises what
    connecting raises (ConnectionFailed for a VM that is not there)."""
    analyzer = build_analyzer(vm.target)
    collector = Collector(analyzer, Profile(options.include_idle, Scope.ALL, Grouping.THREAD))

    def analyse(captured: CapturedSample) -> None:
        collector.add_captured(captured)
        if collector.coverage.mismatched:  # only a --kernel given: answered 500
            stop.set()

    backlog = Backlog(analyse)
    started = time.time()
    notice = vm.notice_once(log)
    async with connected(vm.target, analyzer, notice) as (session, _, capturer):
        nonblocking = await choose_nonblocking(
            session,
            options.nonblocking,
            options.force_stop,
            options.period_s,
            vm.notice_once(log, about="sampling mode"),
        )
        config = LoopConfig(options.period_s, float(seconds), nonblocking=nonblocking)
        stats = await sample_loop(
            session, capturer, config, stop, backlog.add, None, backlog.work_until
        )
        backlog.work_until(None)
    for line in collector.symbol_problems():
        vm.notice_once(log, about="unnamed")(f"{line} (said at its first scrape only)")
    kernel = vm.target.kernel
    recording = Recording(
        started=started,
        duration_s=stats.elapsed_s,
        period_s=options.period_s,
        qmp_socket=vm.target.qmp_socket,
        kernel=str(kernel.resolve()) if kernel is not None else None,
        command_line=f"qmpprof serve: VM {vm.name}, {seconds} s",
        kernel_bias=analyzer.kernel_bias,
        kernel_modules=analyzer.kernel_modules,
        kernel_release=analyzer.kernel_release,
    )
    mismatch = None
    if collector.coverage.mismatched:
        mismatch = collector.coverage.describe(str(kernel))
    return Scraped(collector, stats, recording, mismatch)
