"""A real system-mode libvirt for tests: Debian's libvirtd and virtlogd run by hand as
root, with pid files of ours (no init system involved), serving qemu:///system, and the
Linux example guest defined in it as a TCG domain (`<domain type='qemu'>`).

What a user's host has: QEMU runs as `libvirt-qemu`, its pid file is
/run/libvirt/qemu/NAME.pid, its monitor /var/lib/libvirt/qemu/domain-N-NAME/
monitor.sock. Needs Debian's libvirt-daemon-system (the libvirt-qemu user, qemu.conf;
with libvirt-daemon-system-sysv it installs without systemd as init) and python3-libvirt
(make system-deps). A system libvirtd already running here is left alone: the tests
then skip, saying so, rather than share it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.libvirt_vm import Libvirt, tcg_domain_xml, terminate, until
from tests.linux_vm import FETCH, INITRAMFS

URI = "qemu:///system"
SOCKET = Path("/run/libvirt/libvirt-sock")
VIRTLOGD_SOCKET = Path("/run/libvirt/virtlogd-sock")
PID_DIR = Path("/run/libvirt/qemu")
TOOLS = ("libvirtd", "virtlogd", "virsh", "qemu-system-x86_64")
QEMU_USER = "libvirt-qemu"
READY_LINE = "qmpprof-linux: ready"
START_S = 60.0
#: Debian's kernel booting under TCG on a busy 2-core host.
BOOT_S = 300.0
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"


def missing() -> str | None:
    """Why a system-mode libvirtd cannot be started here, or None."""
    if os.geteuid() != 0:
        return "a system-mode libvirtd is started as root: not root"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"libvirt is not installed ({', '.join(absent)} missing: make system-deps)"
    try:
        pwd.getpwnam(QEMU_USER)
    except KeyError:
        return f"no {QEMU_USER} user (Debian: libvirt-daemon-system-sysv; make system-deps)"
    binding = subprocess.run(["/usr/bin/python3", "-c", "import libvirt"], capture_output=True)
    if binding.returncode != 0:
        return "no libvirt binding for /usr/bin/python3 (Debian: python3-libvirt)"
    if not INITRAMFS.is_file():
        return f"no Linux example guest ({INITRAMFS}: make linux-guest)"
    if SOCKET.is_socket() and _answers():
        return f"a system libvirtd already serves {SOCKET}: the tests start their own"
    return None


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


@contextmanager
def system_libvirtd() -> Iterator[Libvirt]:
    """virtlogd and libvirtd started as root daemons with our pid files, serving
    qemu:///system, each logging to ROOT/NAME.log; both stopped (SIGTERM, waited for)
    when the block ends."""
    root = Path(tempfile.mkdtemp(prefix="qmpprof-sysvirt-"))
    root.chmod(0o755)
    try:
        virtlogd = _daemon(
            "virtlogd", root / "virtlogd.pid", lambda: _listening(VIRTLOGD_SOCKET), root
        )
        try:
            libvirtd = _daemon("libvirtd", root / "libvirtd.pid", _answers, root)
            try:
                yield Libvirt(root, URI, libvirtd)
            finally:
                terminate(libvirtd)
        finally:
            terminate(virtlogd)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _answers() -> bool:
    """Whether libvirtd answers on qemu:///system (a client that says goodbye: a bare
    connect would leave an end of file in its log)."""
    done = subprocess.run(["virsh", "-c", URI, "uri"], capture_output=True, timeout=60)
    return SOCKET.is_socket() and done.returncode == 0


def _daemon(name: str, pidfile: Path, up: Callable[[], bool], root: Path) -> int:
    """Start daemon `name`, its warnings and errors logged to ROOT/NAME.log, and wait
    until it is `up`."""
    env = {**os.environ, "LIBVIRT_LOG_OUTPUTS": f"3:file:{root / name}.log"}
    done = subprocess.run(
        [name, "--daemon", "--pid-file", str(pidfile)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} --daemon failed: {done.stderr.strip()}")
    until(lambda: pidfile.is_file() and up(), START_S, f"{name} up")
    return int(pidfile.read_text().strip())


def linux_domain_xml(name: str, files: Path, own_monitor: Path | None = None) -> str:
    """The Linux example guest as boot.sh runs it (256 MiB, Debian's kernel and the
    example initramfs, serial to a file), one vCPU under TCG; with `own_monitor`, a QMP
    socket of its own there (`<qemu:commandline>`)."""
    extra = ""
    if own_monitor is not None:
        extra = (
            f"<qemu:commandline xmlns:qemu='{QEMU_NS}'><qemu:arg value='-qmp'/>"
            f"<qemu:arg value='unix:{own_monitor},server=on,wait=off'/></qemu:commandline>"
        )
    boot = (
        f"<kernel>{files}/vmlinuz</kernel><initrd>{files}/initramfs.cpio</initrd>"
        "<cmdline>console=ttyS0 quiet panic=-1</cmdline>"
    )
    return tcg_domain_xml(name, 256, boot, files / f"{name}-serial.log", extra)


@dataclass(frozen=True)
class LinuxDomain:
    """A running domain of the Linux guest: its name, serial log, the debug vmlinux of
    its kernel, and its own QMP socket if it has one."""

    name: str
    serial: Path
    vmlinux: Path
    own_monitor: Path | None

    def qemu_pid(self) -> int:
        return int((PID_DIR / f"{self.name}.pid").read_text().strip())


@contextmanager
def linux_domain(libvirt: Libvirt, name: str, own_monitor: bool = False) -> Iterator[LinuxDomain]:
    """The Linux guest defined and started as domain `name`, ready (its serial log says
    so); destroyed and undefined when the block ends."""
    kernel = dict(
        line.split("=", 1)
        for line in subprocess.run(
            [str(FETCH)], capture_output=True, text=True, check=True, timeout=600
        ).stdout.splitlines()
        if "=" in line
    )
    files = libvirt.root / name  # QEMU runs as libvirt-qemu: copies it can read, a dir it writes
    files.mkdir()
    shutil.copyfile(kernel["vmlinuz"], files / "vmlinuz")
    shutil.copyfile(INITRAMFS, files / "initramfs.cpio")
    user = pwd.getpwnam(QEMU_USER)
    os.chown(files, user.pw_uid, user.pw_gid)
    monitor = files / "qmp.sock" if own_monitor else None
    xml = libvirt.root / f"{name}.xml"
    xml.write_text(linux_domain_xml(name, files, monitor))
    libvirt.virsh("define", str(xml))
    try:
        libvirt.virsh("start", name)
        serial = files / f"{name}-serial.log"
        until(lambda: _ready(serial), BOOT_S, f"domain {name} ready ({serial})")
        yield LinuxDomain(name, serial, Path(kernel["vmlinux"]), monitor)
    finally:
        libvirt.virsh("destroy", name, check=False)
        libvirt.virsh("undefine", name, check=False)


def _ready(serial: Path) -> bool:
    with suppress(OSError):
        return READY_LINE in serial.read_text(errors="replace")
    return False


def bridges() -> list[int]:
    """The pids of qmpprof's libvirt bridges still running."""
    found = []
    for entry in Path("/proc").iterdir():
        with suppress(OSError):
            if entry.name.isdigit() and b"libvirt_bridge.py" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found
