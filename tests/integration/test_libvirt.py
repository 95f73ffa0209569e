"""A TCG domain in a real libvirt (a private session libvirtd, tests/libvirt_vm.py),
profiled as the README says: `qmpprof --libvirt DOMAIN`, and through a proxy the user
started (`virt-qemu-qmp-proxy DOMAIN SOCKET` with `--pid`). One boot of the example
guest for the whole file."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import interrupted_when, run_qmpprof
from tests.libvirt_vm import USER, Libvirt, build_guest, example_domain, missing, private_libvirtd

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

DOMAIN = "qmpprof-test"
LEAVES = ("physics_leaf", "render_leaf", "audio_leaf")
PROXY_START_S = 15.0


@pytest.fixture(scope="module")
def libvirt() -> Iterator[Libvirt]:
    with private_libvirtd() as daemon, example_domain(daemon, DOMAIN):
        yield daemon
        # libvirt still manages the domain, and nobody left it paused
        assert daemon.domstate(DOMAIN) == "running"


@pytest.fixture(scope="module")
def kernel() -> Path:
    return build_guest()


def qemu_pid(libvirt: Libvirt) -> int:
    return int((libvirt.root / "run" / "libvirt" / "qemu" / "run" / f"{DOMAIN}.pid").read_text())


def test_record_a_libvirt_domain_with_direct_memory(
    libvirt: Libvirt, kernel: Path, tmp_path: Path
) -> None:
    out = tmp_path / "profile.folded"
    done = run_qmpprof(*_libvirt_args(libvirt, kernel), "--duration", "3", "-o", str(out))
    assert done.returncode == 0, done.stderr
    pid = qemu_pid(libvirt)
    line = next(x for x in done.stderr.splitlines() if "libvirt domain" in x)
    assert f"QEMU pid {pid} (user {USER}, from libvirt's pid file" in line
    assert line.endswith(f"memory backend: direct (/proc/{pid}/mem)")
    stacks = out.read_text()
    assert any(leaf in stacks for leaf in LEAVES) and "kernel_main" in stacks
    assert libvirt.domstate(DOMAIN) == "running"
    proxy_socket = re.search(r"recording (\S+) at", done.stderr + done.stdout)
    assert proxy_socket and not Path(proxy_socket.group(1)).exists()  # the proxy is gone


def _libvirt_args(libvirt: Libvirt, kernel: Path, command: str = "record") -> list[str]:
    return [command, "--libvirt", DOMAIN, "--libvirt-uri", libvirt.uri, "--kernel", str(kernel)]


def test_ctrl_c_leaves_the_domain_running(libvirt: Libvirt, kernel: Path, tmp_path: Path) -> None:
    """A Ctrl-C signals the terminal's whole process group: the bridge, in a session of
    its own, lives on to carry the commands qmpprof sends before it closes the bridge."""
    args = [*_libvirt_args(libvirt, kernel), "--duration", "60", "-o", str(tmp_path / "p.folded")]
    status, rest = interrupted_when(args, recording_began, on_stderr=True, group=True)
    assert status in (0, 130), rest
    assert libvirt.domstate(DOMAIN) == "running"


def recording_began(line: str) -> bool:
    return line.startswith("recording ")


def test_a_proxy_started_by_hand_needs_the_qemu_pid(libvirt: Libvirt, kernel: Path) -> None:
    socket_path = libvirt.root / "proxy.qmp"
    script = str(shutil.which("virt-qemu-qmp-proxy"))
    proxy = subprocess.Popen(
        ["/usr/bin/python3", script, "-c", libvirt.uri, DOMAIN, str(socket_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_socket(socket_path, proxy)
        # The proxy greets after about 4 s, near a QMP socket's default wait of 5: what
        # is judged here is the pid check, not the proxy's speed on a busy host.
        dump = (
            "dump",
            "--qmp-socket",
            str(socket_path),
            "--kernel",
            str(kernel),
            "--connect-timeout",
            "60",
        )
        refused = run_qmpprof(*dump, "--memory", "direct")
        assert_one_line_error(refused, "is not the QEMU behind it")
        assert "--pid" in refused.stderr
        wrong = run_qmpprof(*dump, "--pid", str(proxy.pid))
        assert_one_line_error(wrong, f"--pid names pid {proxy.pid}, which is not the QEMU")
        done = run_qmpprof(*dump, "--pid", str(qemu_pid(libvirt)), "--memory", "direct")
        assert done.returncode == 0, done.stderr
        assert "kernel_main" in done.stdout
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    assert libvirt.domstate(DOMAIN) == "running"


def test_memsave_refused_by_a_qemu_of_another_user(libvirt: Libvirt, kernel: Path) -> None:
    done = run_qmpprof(*_libvirt_args(libvirt, kernel, "dump"), "--memory", "memsave")
    assert_one_line_error(done, f"QEMU runs as {USER}")
    assert "--memory direct or hmp" in done.stderr
    assert libvirt.domstate(DOMAIN) == "running"


def test_a_domain_libvirt_does_not_have(libvirt: Libvirt, kernel: Path) -> None:
    done = run_qmpprof(
        "dump", "--libvirt", "no-such-domain", "--libvirt-uri", libvirt.uri, "--kernel", str(kernel)
    )
    assert_one_line_error(done, "no-such-domain")


def assert_one_line_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith("qmpprof: error:") and expected in lines[0], lines[0]


def _wait_for_socket(path: Path, proxy: subprocess.Popen[bytes]) -> None:
    """Until the proxy listens (a bounded poll), or it exits."""
    end = time.monotonic() + PROXY_START_S
    while not path.is_socket():
        assert proxy.poll() is None, proxy.stdout.read() if proxy.stdout else b""
        assert time.monotonic() < end, "the proxy did not listen"
        time.sleep(0.02)
