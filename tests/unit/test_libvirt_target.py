"""Where --libvirt looks for libvirt's pid file, what names its session, and a domain's own
QMP socket in its XML (pure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmpprof.target.libvirt import names_domain, pid_files, proxy_socket
from qmpprof.target.libvirt_bridge import dedicated_monitor


def test_pid_files_follow_the_connection_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    monkeypatch.delenv("LIBVIRT_DEFAULT_URI", raising=False)
    assert pid_files("vm", "qemu:///system") == [Path("/run/libvirt/qemu/vm.pid")]
    assert pid_files("vm", "qemu:///session") == [Path("/run/user/1000/libvirt/qemu/run/vm.pid")]
    private = "qemu+unix:///session?socket=/tmp/lv/run/libvirt/libvirt-sock"
    assert pid_files("vm", private) == [Path("/tmp/lv/run/libvirt/qemu/run/vm.pid")]
    assert pid_files("vm", "qemu+ssh://host/system") == []  # QEMU is not here


def test_the_default_uri_is_libvirts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIBVIRT_DEFAULT_URI", "qemu:///system")
    assert pid_files("vm", None) == [Path("/run/libvirt/qemu/vm.pid")]


def test_one_proxy_socket_per_uri_and_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    path = proxy_socket("web/1 x", "qemu:///system")
    assert path.startswith("/run/user/1000/qmpprof/libvirt-web_1_x-") and path.endswith(".qmp")
    assert path == proxy_socket("web/1 x", "qemu:///system")
    assert path != proxy_socket("web/1 x", "qemu:///session")
    assert len(proxy_socket("v" * 300, None)) < 108  # a unix socket path's limit


def test_a_process_not_started_by_libvirt_names_no_domain() -> None:
    assert not names_domain(os.getpid(), "vm")


QEMU_NS = "xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'"


def domain_xml(*args: str) -> str:
    values = "".join(f"<qemu:arg value='{arg}'/>" for arg in args)
    commandline = f"<qemu:commandline>{values}</qemu:commandline>"
    return f"<domain type='qemu' {QEMU_NS}><name>vm</name>{commandline}</domain>"


@pytest.mark.parametrize(
    ("args", "monitor"),
    [
        (("-qmp", "unix:/run/qmpprof/vm.qmp,server=on,wait=off"), "/run/qmpprof/vm.qmp"),
        (("-name", "x", "-qmp", "unix:/tmp/a.qmp,server,nowait"), "/tmp/a.qmp"),
        (("-qmp", "unix:/tmp/a.qmp"), None),  # a client socket: QEMU connects out
        (("-qmp", "tcp:127.0.0.1:4444,server=on"), None),
        (("-monitor", "unix:/tmp/a.hmp,server=on"), None),
        ((), None),
    ],
)
def test_a_domains_own_qmp_socket_from_its_xml(args: tuple[str, ...], monitor: str | None) -> None:
    assert dedicated_monitor(domain_xml(*args)) == monitor


def test_xml_that_does_not_parse_names_no_socket() -> None:
    assert dedicated_monitor("<domain") is None
    assert dedicated_monitor("<domain><qemu:arg value='-qmp'/></domain>") is None
