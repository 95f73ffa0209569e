"""Bad input against a real guest: one line on stderr, a non-zero exit, the VM untouched."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.integration.conftest import Guest, record_args, run_qmpprof
from tests.unit.conftest import build_elf


def assert_one_line_error(stderr: str, returncode: int, expected: str) -> None:
    assert returncode != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qmpprof: error:"), stderr
    assert expected in lines[0]


def test_a_qmp_socket_another_client_holds(guest: Guest) -> None:
    with socket.socket(socket.AF_UNIX) as holder:
        holder.connect(guest.qmp)
        assert b"QMP" in holder.recv(4096)
        done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    assert_one_line_error(done.stderr, done.returncode, "another client")
    assert guest.status() == "running"


def test_a_kernel_that_is_not_the_guests(guest: Guest, tmp_path: Path) -> None:
    wrong = build_elf("symbols.c", tmp_path, "-O1")
    done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(wrong))
    assert_one_line_error(done.stderr, done.returncode, "does not match the guest")
    record = run_qmpprof(*record_args(guest.qmp, wrong, 5, tmp_path / "p.folded"))
    assert_one_line_error(record.stderr.splitlines()[-1], record.returncode, "does not match")
    assert guest.status() == "running"


def test_dump_leaves_a_running_vm_running_and_a_paused_vm_paused(guest: Guest) -> None:
    args = ("dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel))
    done = run_qmpprof(*args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["vcpus"][0]["mode"] in ("kernel", "idle")
    assert guest.status() == "running"
    guest.qmp_call("stop")
    assert run_qmpprof(*args).returncode == 0
    assert guest.status() == "paused"


def test_record_never_resumes_a_vm_paused_by_the_user(guest: Guest, tmp_path: Path) -> None:
    guest.qmp_call("stop")
    done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 1, tmp_path / "p.folded"))
    assert done.returncode == 0, done.stderr
    assert "skipped while the VM was paused by others" in done.stdout
    assert guest.status() == "paused"
