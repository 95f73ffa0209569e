"""A libvirt domain's QMP monitor on a socket qmpprof hands over, through libvirt's own
Python binding: `python3 libvirt_bridge.py URI DOMAIN FD`.

Run by qmpprof (target/libvirt.py) as a process of its own under a Python that has the
binding (Debian's python3-libvirt is the system python3's), so this file imports
nothing of qmpprof's. Each command read from the socket FD goes to
`libvirt_qemu.qemuMonitorCommand` (libvirt marks the domain tainted, custom-monitor),
its reply comes back as QEMU would send it, and QEMU's events come from
`qemuMonitorEventRegister` on the same connection. What libvirt's own
virt-qemu-qmp-proxy does, without its cost on a host where libvirt re-probes QEMU on
every version query (its `getVersion` before each client's greeting took ~4 s here):
the greeting is QEMU's `query-version`, one passthrough round trip.

The greeting also names the domain's own QMP socket, when its XML gives QEMU one
(`<qemu:commandline>` with `-qmp unix:PATH,server=on,...`): qmpprof then talks to QEMU
there instead. The socket closing (qmpprof done) or SIGTERM ends it, closing the
libvirt connection properly, so libvirtd logs nothing. A failure before the greeting
is one line on stderr and exit status 1.
"""

from __future__ import annotations

import gc
import itertools
import json
import re
import signal
import socket
import sys
import xml.etree.ElementTree as ElementTree
from typing import Any

_QEMU_NS = "{http://libvirt.org/schemas/domain/qemu/1.0}"
#: How often the event loop wakes to notice SIGTERM (libvirt retries an interrupted poll).
_WAKE_MS = 200
_decoder = json.JSONDecoder()


def dedicated_monitor(xml: str) -> str | None:
    """The path of the QMP unix socket a domain's XML gives QEMU beside libvirt's own
    (`-qmp unix:PATH,server=on,...` in `<qemu:commandline>`), or None."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return None
    values = [arg.get("value", "") for arg in root.iter(f"{_QEMU_NS}arg")]
    for flag, value in itertools.pairwise(values):
        if flag in ("-qmp", "--qmp") and value.startswith("unix:"):
            path, _, options = value[len("unix:") :].partition(",")
            server = re.search(r"(^|,)server(=on|=yes)?(,|$)", options)
            if path and server:
                return path
    return None


class Bridge:
    """Commands from the socket to libvirt, replies and events back."""

    def __init__(self, libvirt: Any, libvirt_qemu: Any, dom: Any, sock: socket.socket) -> None:
        self.libvirt, self.libvirt_qemu, self.dom, self.sock = libvirt, libvirt_qemu, dom, sock
        self.done = False
        self._buffer = b""
        self._events = libvirt_qemu.qemuMonitorEventRegister(
            dom.connect(), dom, None, self._event, None
        )
        self._watch = libvirt.virEventAddHandle(
            sock.fileno(), libvirt.VIR_EVENT_HANDLE_READABLE, self._readable, None
        )

    def greet(self, version: dict[str, Any], monitor: str | None) -> None:
        greeting: dict[str, Any] = {"QMP": {"version": version, "capabilities": []}}
        if monitor is not None:
            greeting["qmpprof"] = {"monitor": monitor}
        self._send(greeting)

    def close(self) -> None:
        """Stop watching and forwarding; let go of the domain, which holds the connection
        (libvirt frees a removed handle's callback, this object's method, only later)."""
        self.libvirt.virEventRemoveHandle(self._watch)
        self.libvirt_qemu.qemuMonitorEventDeregister(self.dom.connect(), self._events)
        self.dom = None

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\r\n")
        except OSError:
            self.done = True

    def _event(
        self, _c: Any, _d: Any, event: str, secs: int, usecs: int, details: Any, _o: Any
    ) -> None:
        message: dict[str, Any] = {
            "event": event,
            "timestamp": {"seconds": secs, "microseconds": usecs},
        }
        if details is not None:
            message["data"] = details
        self._send(message)

    def _readable(self, _watch: int, _fd: int, _events: int, _opaque: Any) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.done = True
            return
        self._buffer += data
        while not self.done:
            text = self._buffer.decode(errors="replace").lstrip()
            try:
                command, end = _decoder.raw_decode(text)
            except ValueError:
                return  # not whole yet
            self._buffer = text[end:].encode()
            self._send(self._run(command))

    def _run(self, command: Any) -> dict[str, Any]:
        if not isinstance(command, dict):
            return {"error": {"class": "GenericError", "desc": "QMP input must be a JSON object"}}
        ident = command.pop("id", None)
        if command.get("execute") == "qmp_capabilities":
            reply: dict[str, Any] = {"return": {}}
        else:
            try:
                reply = json.loads(
                    self.libvirt_qemu.qemuMonitorCommand(self.dom, json.dumps(command), 0)
                )
            except self.libvirt.libvirtError as err:
                reply = {"error": {"class": "GenericError", "desc": err.get_error_message()}}
            reply.pop("id", None)
        if ident is not None:
            reply["id"] = ident
        return reply


def _lookup(libvirt: Any, conn: Any, name: str) -> Any:
    """The domain by id, UUID or name, as virsh takes it."""
    if name.isdigit():
        try:
            return conn.lookupByID(int(name))
        except libvirt.libvirtError:
            pass
    if re.fullmatch(r"[0-9a-fA-F-]{32,36}", name):
        try:
            return conn.lookupByUUIDString(name)
        except libvirt.libvirtError:
            pass
    return conn.lookupByName(name)


def _fail(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(1)


def main(argv: list[str]) -> None:
    uri, name, fd = argv
    sock = socket.socket(fileno=int(fd))
    try:
        import libvirt  # type: ignore[import-not-found,unused-ignore]
        import libvirt_qemu  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        _fail(f"{sys.executable} has no libvirt binding (Debian: apt-get install python3-libvirt)")
    libvirt.registerErrorHandler(lambda _opaque, _error: None, None)
    libvirt.virEventRegisterDefaultImpl()
    try:
        conn = libvirt.open(uri or None)
    except libvirt.libvirtError as err:
        said = err.get_error_message()
        _fail(f"cannot connect to libvirt ({uri or 'default URI'}): {said} (is libvirtd running?)")
    try:
        failed = _serve(libvirt, libvirt_qemu, conn, name, sock)
    finally:
        # Every domain object holds the connection: only once they are freed does
        # close() end it with libvirt's own goodbye (else libvirtd logs an end of file).
        gc.collect()
        conn.close()
    if failed is not None:
        _fail(failed)


def _serve(
    libvirt: Any, libvirt_qemu: Any, conn: Any, name: str, sock: socket.socket
) -> str | None:
    """Look the domain up, greet, then bridge until the socket closes or SIGTERM; the
    line saying why it could not start, or None."""
    try:
        dom = _lookup(libvirt, conn, name)
        if not dom.isActive():
            return f"domain {name} is not running (virsh start {name})"
        command = '{"execute":"query-version"}'
        version = json.loads(libvirt_qemu.qemuMonitorCommand(dom, command, 0))["return"]
        monitor = dedicated_monitor(dom.XMLDesc(0))
    except libvirt.libvirtError as err:
        return str(err.get_error_message())
    bridge = Bridge(libvirt, libvirt_qemu, dom, sock)

    def finish(_signum: int, _frame: object) -> None:
        bridge.done = True

    signal.signal(signal.SIGTERM, finish)
    timer = libvirt.virEventAddTimeout(_WAKE_MS, lambda _timer, _opaque: None, None)
    bridge.greet(version, monitor)
    while not bridge.done:
        libvirt.virEventRunDefaultImpl()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    bridge.close()
    # One more turn (the timer ends it) lets libvirt finish the deregistration before
    # close(): closed straight after it, libvirtd logged an end of file all the same.
    libvirt.virEventRunDefaultImpl()
    libvirt.virEventRemoveTimeout(timer)
    sock.close()
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
