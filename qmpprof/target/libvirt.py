"""A libvirt domain as a QMP target (--libvirt DOMAIN): libvirt's QMP proxy on a socket
of ours, and the QEMU process behind it.

libvirt owns the domain's only QMP monitor. `virt-qemu-qmp-proxy DOMAIN SOCKET`
(Debian: libvirt-clients-qemu) serves a QMP socket whose commands go through
libvirt's passthrough (virDomainQemuMonitorCommand; libvirt marks the domain tainted,
`custom-monitor`) and whose events libvirt forwards. The socket's peer is then the
proxy, so QEMU's pid comes from libvirt: the domain's pid file (system mode
/run/libvirt/qemu/NAME.pid, session mode $XDG_RUNTIME_DIR/libvirt/qemu/run/NAME.pid),
else the process that owns the vCPU threads QEMU reports. Either way its command line
must name the domain (libvirt runs QEMU with `-name guest=NAME,...`), and
target/direct.py identify_qemu checks that the vCPU threads are its.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from qmpprof.errors import UsageError
from qmpprof.target.direct import thread_group, vcpu_threads
from qmpprof.target.qmp import QmpSession

PROXY = "virt-qemu-qmp-proxy"
#: The proxy imports python3-libvirt and connects to libvirt: well under a second here.
PROXY_START_S = 15.0
PROXY_STOP_S = 5.0
#: How often a starting proxy is looked at (its socket, or its exit).
_POLL_S = 0.02
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class LibvirtQemu:
    """The QEMU process of a domain as libvirt knows it: its pid, and where that came
    from (for messages); pid None when not found (`how` says why)."""

    pid: int | None
    how: str


def proxy_socket(domain: str, uri: str | None) -> str:
    """Where the proxy of `domain` listens: one path per URI and domain, in a private
    directory, so that a second qmpprof on the same domain finds the first's proxy and
    the socket's pause marker (target/marker.py) outlives a qmpprof that was killed."""
    key = hashlib.sha256(f"{uri or ''}\0{domain}".encode()).hexdigest()[:12]
    return str(_private_dir() / f"libvirt-{_SAFE.sub('_', domain)[:40]}-{key}.qmp")


def _private_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "qmpprof" if runtime else Path(f"/tmp/qmpprof-{os.getuid()}")


@contextlib.asynccontextmanager
async def proxied(domain: str, uri: str | None, path: str) -> AsyncIterator[None]:
    """virt-qemu-qmp-proxy serving `domain` on `path` for the block, stopped after it.

    The proxy runs in a session of its own, so a Ctrl-C meant for qmpprof leaves it to
    carry the `cont` that resumes the VM, and dies with qmpprof (setpriv --pdeathsig)
    if qmpprof is killed. Raises UsageError when it cannot be run, another qmpprof's
    proxy serves the domain, or the proxy exits (its own line says why: no such
    domain, not running, no libvirt)."""
    command = _proxy_command(domain, uri, path)
    _claim(path, domain)
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        await _until_listening(process, path, domain)
        yield
    finally:
        await _stop(process)
        with contextlib.suppress(OSError):
            os.unlink(path)


def _proxy_command(domain: str, uri: str | None, path: str) -> list[str]:
    script = shutil.which(PROXY)
    if script is None:
        raise UsageError(f"--libvirt needs {PROXY} (Debian: apt-get install libvirt-clients-qemu)")
    connect = ["--connect", uri] if uri else []
    command = [*_interpreter(script), script, *connect, "--", domain, path]
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *command] if setpriv else command


def _interpreter(script: str) -> list[str]:
    """The system's python3 for a proxy that asks for `env python3`: python3-libvirt is
    installed for it, and the python3 first on PATH may be a virtualenv's or pyenv's,
    which has no libvirt module."""
    try:
        with open(script, "rb") as stream:
            first = stream.readline()
    except OSError:
        return []
    system = "/usr/bin/python3"
    return [system] if first.strip() == b"#!/usr/bin/env python3" and os.path.exists(system) else []


def _claim(path: str, domain: str) -> None:
    """Make way for our proxy at `path`: refuse when one listens there (another
    qmpprof on this domain), remove a stale socket a killed one left."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.lstat(directory)
    except OSError as err:
        raise UsageError(f"--libvirt: cannot make {directory}: {err.strerror}") from err
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UsageError(f"--libvirt: {directory} is not private to this user")
    if _listening(path):
        raise UsageError(
            f"libvirt domain {domain} is being profiled already (another qmpprof's proxy "
            f"listens on {path})"
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _listening(path: str) -> bool:
    """Whether something accepts connections on the unix socket `path`."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
        with socket.socket(socket.AF_UNIX) as probe:
            probe.setblocking(False)
            probe.connect(path)
        return True
    except BlockingIOError:
        return True  # its queue is full: someone is there
    except OSError:
        return False


async def _until_listening(process: asyncio.subprocess.Process, path: str, domain: str) -> None:
    """Wait, at most PROXY_START_S, until the proxy accepts on `path`; its own last
    line, as UsageError, if it exits first."""
    loop = asyncio.get_running_loop()
    end = loop.time() + PROXY_START_S
    while not _listening(path):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), _POLL_S)
        if process.returncode is not None:
            raise UsageError(f"{PROXY} for libvirt domain {domain}: {await _last_line(process)}")
        if loop.time() >= end:
            raise UsageError(f"{PROXY} did not listen on {path} within {PROXY_START_S:g} s")


async def _last_line(process: asyncio.subprocess.Process) -> str:
    """What the proxy said last (its error), without its own path in front."""
    output = await process.stdout.read() if process.stdout is not None else b""
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    last = next((line for line in reversed(lines) if line), f"exit status {process.returncode}")
    last = re.sub(r"^\S*virt-qemu-qmp-proxy: ", "", last)
    if "No module named 'libvirt'" in last:
        last += " (Debian: apt-get install python3-libvirt)"
    return last


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), PROXY_STOP_S)
        except TimeoutError:
            process.kill()
            await process.wait()


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
