"""A real libvirt for tests: a private session-mode libvirtd run as an unprivileged user,
and the example guest defined in it as a TCG domain (`<domain type='qemu'>`).

Why session mode as `nobody` here: a system-mode libvirtd (tests/libvirt_system.py,
Debian's libvirt-daemon-system with libvirt-daemon-system-sysv: no systemd as init)
shares /run/libvirt and /var/lib/libvirt with any libvirt of the host, so it runs only
where none does. A session daemon keeps all its state under XDG directories we choose,
so nothing outside a scratch directory is touched, and its QEMU runs as that user (not ours), in
libvirt's seccomp sandbox, as a real libvirt QEMU does (system mode: libvirt-qemu).
Facts checked here (2026-11, Debian 12, libvirt 9.0, QEMU 7.2): the pid file is
RUNTIME/libvirt/qemu/run/NAME.pid, the monitor CONFIG/libvirt/qemu/lib/domain-N-NAME/
monitor.sock, QEMU runs with `-name guest=NAME,debug-threads=on` (vCPU thread `CPU 0/TCG`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUEST_BUILD = ROOT / "examples" / "guest" / "build" / "fp"
READY_LINE = "qmpprof-guest: ready"
TOOLS = ("libvirtd", "virsh", "virt-qemu-qmp-proxy")
#: The unprivileged user the private libvirtd (and so its QEMU) runs as.
USER = "nobody"
START_S = 30.0
BOOT_S = 60.0
STOP_S = 10.0
_POLL_S = 0.05


def missing() -> str | None:
    """Why libvirt cannot be tested here (not installed), or None."""
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"libvirt is not installed ({', '.join(absent)} missing: make system-deps)"
    return None


@dataclass(frozen=True)
class Libvirt:
    """A running private libvirtd: its scratch directory, URI and pid."""

    root: Path
    uri: str
    pid: int

    def virsh(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["virsh", "-c", self.uri, *args], capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"virsh {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def domstate(self, name: str) -> str:
        return self.virsh("domstate", name)


def until(condition: object, seconds: float, what: str) -> None:
    """Poll `condition()` until true, at most `seconds`; RuntimeError naming `what`."""
    assert callable(condition)
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise RuntimeError(f"{what} within {seconds:g} s")
        time.sleep(_POLL_S)


@contextmanager
def private_libvirtd() -> Iterator[Libvirt]:
    """A session libvirtd of USER in a scratch directory, stopped (with the virtlogd
    it starts) and removed when the block ends."""
    user = pwd.getpwnam(USER)
    root = Path(tempfile.mkdtemp(prefix="qmpprof-libvirt-"))  # short: socket paths
    try:
        for sub in ("home", "run"):
            (root / sub).mkdir()
        root.chmod(0o755)
        for path in (root, root / "home", root / "run"):
            os.chown(path, user.pw_uid, user.pw_gid)
        (root / "run").chmod(0o700)
        pid = _start_libvirtd(root, user)
        try:
            yield Libvirt(root, f"qemu+unix:///session?socket={root}/run/libvirt/libvirt-sock", pid)
        finally:
            _stop_daemons(root, pid)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _start_libvirtd(root: Path, user: pwd.struct_passwd) -> int:
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root / "home"),
        "XDG_RUNTIME_DIR": str(root / "run"),
        "XDG_CONFIG_HOME": str(root / "home" / "config"),
        "XDG_CACHE_HOME": str(root / "home" / "cache"),
        "XDG_DATA_HOME": str(root / "home" / "data"),
    }
    pidfile = root / "libvirtd.pid"
    done = subprocess.run(
        ["libvirtd", "--daemon", "--pid-file", str(pidfile)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"libvirtd --daemon failed: {done.stderr.strip()}")
    socket_path = root / "run" / "libvirt" / "libvirt-sock"
    until(lambda: socket_path.is_socket() and pidfile.is_file(), START_S, "libvirtd up")
    return int(pidfile.read_text().strip())


def _stop_daemons(root: Path, libvirtd: int) -> None:
    """SIGTERM libvirtd and the virtlogd it started, each waited for (then SIGKILL)."""
    virtlogd = _pid_in(root / "run" / "libvirt" / "virtlogd.pid")
    for pid in (libvirtd, virtlogd):
        if pid is not None:
            terminate(pid)


def _pid_in(path: Path) -> int | None:
    with suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def terminate(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.kill(pid, sig)
        with suppress(RuntimeError):
            until(lambda: not _alive(pid), STOP_S, f"pid {pid} gone")
            return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def domain_xml(name: str, kernel: Path, serial: Path, workload: str = "kernel") -> str:
    """The example guest as boot.sh runs it (128 MiB, one vCPU, the multiboot kernel,
    the workload on its command line, serial to a file), under TCG."""
    boot = f"<kernel>{kernel}</kernel><cmdline>workload={workload}</cmdline>"
    return tcg_domain_xml(name, 128, boot, serial)


def tcg_domain_xml(name: str, mib: int, boot: str, serial: Path, extra: str = "") -> str:
    """A one-vCPU `<domain type='qemu'>` (TCG) of `mib` MiB booting what `boot` says
    (`<kernel>` and the like), serial to a file, destroyed when it reboots or crashes;
    `extra` elements inside `<domain>`."""
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{mib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>{boot}</os>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  {devices_xml(serial)}
  {extra}
</domain>
"""


def devices_xml(serial: Path) -> str:
    """A TCG domain's devices: QEMU, the serial port to a file, no USB, no balloon."""
    return f"""<devices>
    <emulator>{shutil.which("qemu-system-x86_64")}</emulator>
    <serial type='file'><source path='{serial}'/><target port='0'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>"""


@contextmanager
def example_domain(libvirt: Libvirt, name: str) -> Iterator[Path]:
    """The example guest defined and started as domain `name`, ready (its serial log,
    which it yields, says so); destroyed and undefined when the block ends."""
    build_guest()
    kernel = libvirt.root / "kernel.boot"  # QEMU runs as USER: a copy it can read
    shutil.copyfile(GUEST_BUILD / "kernel.boot", kernel)
    kernel.chmod(0o644)
    serial = libvirt.root / f"{name}-serial.log"
    xml = libvirt.root / f"{name}.xml"
    xml.write_text(domain_xml(name, kernel, serial))
    libvirt.virsh("define", str(xml))
    try:
        libvirt.virsh("start", name)
        until(lambda: _ready(serial), BOOT_S, f"domain {name} ready ({serial})")
        yield serial
    finally:
        libvirt.virsh("destroy", name, check=False)
        libvirt.virsh("undefine", name, check=False)


def build_guest() -> Path:
    """The example guest built as boot.sh builds it (serialized: tests run in parallel
    with other boots); its kernel.elf."""
    guest = ROOT / "examples" / "guest"
    (guest / "build").mkdir(exist_ok=True)
    lock = str(guest / "build" / ".make.lock")
    subprocess.run(
        ["flock", lock, "make", "-s", "-C", str(guest), "VARIANT=fp"], check=True, timeout=600
    )
    return GUEST_BUILD / "kernel.elf"


def _ready(serial: Path) -> bool:
    with suppress(OSError):
        return READY_LINE in serial.read_text(errors="replace").splitlines()
    return False
