"""A libvirt domain as a QMP target (--libvirt DOMAIN): its monitor through libvirt's
Python binding (target/libvirt_bridge.py), or its own QMP socket, and the QEMU process
behind it.

libvirt owns the domain's QMP monitor. The bridge passes each command through libvirt
(virDomainQemuMonitorCommand; libvirt marks the domain tainted, `custom-monitor`) and
forwards QEMU's events from the same connection. It replaces libvirt's
virt-qemu-qmp-proxy, which asks libvirtd for its version before it greets a client
(~4 s on a host where libvirt re-probes QEMU each time) and leaves libvirtd logging an
end of file when it is stopped (bench/libvirt_paths.py measures both). The socket's
peer is then the bridge, so QEMU's pid comes from libvirt: the domain's pid file
(system mode /run/libvirt/qemu/NAME.pid, session mode
$XDG_RUNTIME_DIR/libvirt/qemu/run/NAME.pid), else the process that owns the vCPU
threads QEMU reports. Either way its command line must name the domain (libvirt runs
QEMU with `-name guest=NAME,...`), and target/direct.py identify_qemu checks that the
vCPU threads are its. A domain whose XML gives QEMU a QMP socket of its own
(`<qemu:commandline>`, `-qmp unix:PATH,server=on,wait=off`) is reached there, as plain
QEMU is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import itertools
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from qmpprof.errors import UsageError
from qmpprof.target.direct import thread_group, vcpu_threads
from qmpprof.target.qmp import QmpSession

#: The bridge's own file, run as a script under a Python that has libvirt's binding.
BRIDGE = Path(__file__).with_name("libvirt_bridge.py")
#: Connecting to libvirtd and one passthrough command (`query-version`): a fraction of a
#: second on an idle host, seconds when libvirtd is busy (--connect-timeout).
LIBVIRT_CONNECT_S = 30.0
#: How long the bridge may take to close its libvirt connection once told to.
BRIDGE_STOP_S = 5.0
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class LibvirtQemu:
    """The QEMU process of a domain as libvirt knows it: its pid, and where that came
    from (for messages); pid None when not found (`how` says why)."""

    pid: int | None
    how: str


def proxy_socket(domain: str, uri: str | None) -> str:
    """The name qmpprof's session with `domain` goes by (one per URI and domain, in a
    private directory; nothing listens there): the key of its pause marker
    (target/marker.py), so that a qmpprof killed mid-pause is resumed by the next."""
    key = hashlib.sha256(f"{uri or ''}\0{domain}".encode()).hexdigest()[:12]
    return str(_private_dir() / f"libvirt-{_SAFE.sub('_', domain)[:40]}-{key}.qmp")


def _private_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "qmpprof" if runtime else Path(f"/tmp/qmpprof-{os.getuid()}")


@contextlib.asynccontextmanager
async def bridged(domain: str, uri: str | None, timeout: float) -> AsyncIterator[socket.socket]:
    """A socket on which `domain`'s QMP monitor answers through libvirt's binding
    (target/libvirt_bridge.py, a process of its own), greeting waiting, for the block.

    The bridge runs in a session of its own, so a Ctrl-C meant for qmpprof leaves it to
    carry the `cont` that resumes the VM, and dies with qmpprof (setpriv --pdeathsig)
    if qmpprof is killed. Closing the socket ends it, its libvirt connection closed.
    Raises UsageError when it cannot run, says why it failed (no such domain, not
    running, no libvirtd), or libvirt gives no greeting within `timeout` seconds."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await asyncio.create_subprocess_exec(
            *_bridge_command(domain, uri, theirs.fileno()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )
    except OSError as err:
        ours.close()
        raise UsageError(f"--libvirt: cannot run {bridge_python()}: {err.strerror}") from err
    finally:
        theirs.close()
    greeted = False
    try:
        await _until_greeting(process, ours, domain, timeout)
        greeted = True
        yield ours
    finally:
        ours.close()
        await _stop(process, greeted)


def _bridge_command(domain: str, uri: str | None, fd: int) -> list[str]:
    # -I: isolated, so the script's own directory (where target/libvirt.py is) does not
    # shadow the binding's `libvirt` module, nor do PYTHON* variables change anything.
    command = [bridge_python(), "-I", str(BRIDGE), uri or "", domain, str(fd)]
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *command] if setpriv else command


def bridge_python() -> str:
    """Ours when it has libvirt's binding (pip's libvirt-python), else the system's
    python3, for which Debian's python3-libvirt is installed."""
    if importlib.util.find_spec("libvirt") is not None or not os.path.exists(_SYSTEM_PYTHON):
        return sys.executable
    return _SYSTEM_PYTHON


async def _until_greeting(
    process: asyncio.subprocess.Process, sock: socket.socket, domain: str, timeout: float
) -> None:
    """Wait until the bridge's greeting can be read from `sock`; UsageError with its own
    line if it exits first, or when `timeout` seconds pass."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[int] = loop.create_future()

    def greeted() -> None:
        if not readable.done():
            readable.set_result(0)

    loop.add_reader(sock.fileno(), greeted)
    exited: asyncio.Future[int] = asyncio.ensure_future(process.wait())
    try:
        await asyncio.wait({readable, exited}, timeout=timeout, return_when="FIRST_COMPLETED")
    finally:
        loop.remove_reader(sock.fileno())
        exited.cancel()
    if readable.done() and _has_data(sock):
        return
    if readable.done() or exited.done():
        await process.wait()
        raise UsageError(f"libvirt domain {domain}: {await _last_line(process)}")
    raise UsageError(
        f"libvirt domain {domain}: libvirt did not answer within {timeout:g} s (connecting "
        f"to libvirtd and one QMP command through it; --connect-timeout waits longer)"
    )


def _has_data(sock: socket.socket) -> bool:
    """Whether `sock` has bytes to read (not an end of file, nor an error)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False


async def _last_line(process: asyncio.subprocess.Process) -> str:
    """What the bridge said last (its error)."""
    output = await process.stderr.read() if process.stderr is not None else b""
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"exit status {process.returncode}")


async def _stop(process: asyncio.subprocess.Process, patient: bool) -> None:
    """Wait for the bridge, which ends once its socket closes, closing its libvirt
    connection; SIGTERM, then SIGKILL, one that does not. Not `patient` (it never
    greeted: stuck in libvirt, where no signal handler of Python's runs), SIGKILL."""
    ends = (None, process.terminate, process.kill) if patient else (process.kill,)
    for end in ends:
        if end is not None and process.returncode is None:
            end()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), BRIDGE_STOP_S)
            return


def dedicated_monitor(greeting: dict[str, object]) -> str | None:
    """The domain's own QMP socket, which the bridge's greeting names when the domain's
    XML gives QEMU one (target/libvirt_bridge.py), or None."""
    ours = greeting.get("qmpprof")
    monitor = ours.get("monitor") if isinstance(ours, dict) else None
    return monitor if isinstance(monitor, str) and monitor else None


async def find_qemu(session: QmpSession, uri: str | None) -> LibvirtQemu:
    """The QEMU process of the domain behind `session` (a proxy's socket), as libvirt
    knows it. Raises UsageError when libvirt's pid file names a process that is not
    the domain's QEMU; a QEMU not found here (a remote URI) is LibvirtQemu(None, why)."""
    name = str((await session.execute("query-name")).get("name", ""))
    for path in pid_files(name, uri):
        pid = _read_pid(path)
        if pid is None:
            continue
        if not names_domain(pid, name):
            raise UsageError(
                f"libvirt's pid file {path} names pid {pid}, which is not domain {name}'s QEMU"
            )
        return LibvirtQemu(pid, f"libvirt's pid file {path}")
    threads = await vcpu_threads(session)
    pid = thread_group(threads[0]) if threads else None
    if pid is not None and names_domain(pid, name):
        return LibvirtQemu(pid, f"the owner of vCPU thread {threads[0]}")
    return LibvirtQemu(None, f"domain {name}'s QEMU is not a process on this host")


def pid_files(name: str, uri: str | None) -> list[Path]:
    """Where libvirt keeps the pid file of domain `name` for connection `uri` (None:
    libvirt's default, LIBVIRT_DEFAULT_URI or by user); none for another host."""
    parts = urlsplit(uri or os.environ.get("LIBVIRT_DEFAULT_URI") or _default_uri())
    if not parts.scheme.startswith("qemu") or parts.hostname not in (None, "", "localhost"):
        return []
    if parts.path.rstrip("/") == "/system":
        return [Path("/run/libvirt/qemu") / f"{name}.pid"]
    socket_path = parse_qs(parts.query).get("socket", [""])[0]
    if socket_path:  # the session daemon's socket: RUNTIME/libvirt/libvirt-sock
        return [Path(socket_path).parent / "qemu" / "run" / f"{name}.pid"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "libvirt" if runtime else Path.home() / ".cache" / "libvirt"
    return [base / "qemu" / "run" / f"{name}.pid"]


def _default_uri() -> str:
    return "qemu:///system" if os.getuid() == 0 else "qemu:///session"


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def names_domain(pid: int, name: str) -> bool:
    """Whether process `pid` is a QEMU libvirt started for domain `name`: its command
    line has `-name guest=NAME[,...]` (libvirt doubles a comma in a name)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            arguments = stream.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    wanted = "guest=" + name.replace(",", ",,")
    return any(
        flag == "-name" and (value == wanted or value.startswith(wanted + ","))
        for flag, value in itertools.pairwise(arguments)
    )


def describe_owner(pid: int) -> str:
    """`user NAME` of process `pid` (who QEMU runs as), or an empty string."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        return f"user {pwd.getpwuid(uid).pw_name}"
    except (OSError, KeyError):
        return ""
