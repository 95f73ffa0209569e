"""Bad input against a real guest: one line on stderr, a non-zero exit, the VM untouched."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

from tests.integration.conftest import Guest, record_args, run_qmpprof
from tests.tmpfs import mounted_tmpfs
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
    """Nothing sampled: the profile and the summary, then one line and exit 1."""
    guest.qmp_call("stop")
    done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 1, tmp_path / "p.folded"))
    assert done.returncode == 1, done.stderr
    assert "skipped while the VM was paused by others" in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("qmpprof: error: no sample taken: the VM was paused by someone else")
    assert (tmp_path / "p.folded").exists()
    assert guest.status() == "paused"


def test_bad_command_lines_leave_the_vm_running(guest: Guest, tmp_path: Path) -> None:
    """Refused while parsing: one line, exit 2, well before the 300 s asked for."""
    output = tmp_path / "p.folded"
    for flag, value in (("--rate", "inf"), ("--stack-bytes", "100000000"), ("--interval", "0")):
        done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 300, output), flag, value)
        assert done.returncode == 2
        assert_one_line_error(done.stderr, done.returncode, f"argument {flag}: must be")
    assert not output.exists()
    assert guest.status() == "running"


def test_an_output_that_is_a_directory_is_refused_before_recording(
    guest: Guest, tmp_path: Path
) -> None:
    (tmp_path / "adir").mkdir()
    outputs = ("-o", str(tmp_path / "adir"), "-o", str(tmp_path / "p.svg"))
    done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 300, tmp_path / "p.folded"), *outputs)
    assert_one_line_error(done.stderr, done.returncode, "adir: it is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
    assert guest.status() == "running"


def summary_samples(stdout: str) -> int:
    found = re.search(r"^\d+ ticks \((\d+) vCPU samples\)", stdout, re.MULTILINE)
    assert found is not None, stdout
    return int(found.group(1))


def folded_total(path: Path) -> int:
    return sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines())


def test_a_disk_that_fills_while_recording_costs_only_the_capture(
    guest: Guest, tmp_path: Path
) -> None:
    """The capture file (with memory: about a megabyte a second) fills a 64 KiB tmpfs;
    the folded profile elsewhere and the summary keep every sample."""
    with mounted_tmpfs(tmp_path / "disk", "size=64k") as disk:
        capture, output = disk / "p.qmpcap", tmp_path / "p.folded"
        extra = ("-o", str(capture), "--capture-memory", "--idle")
        done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 3, output, *extra))
        assert_one_line_error(done.stderr.splitlines()[-1], done.returncode, "1 of 2 outputs")
        assert f"{capture}: No space left on device" in done.stderr
        assert f"not written: {capture} (qmpcap)" in done.stdout
        assert folded_total(output) == summary_samples(done.stdout) > 0
    assert guest.status() == "running"


def test_a_disk_that_fills_while_writing_the_svg_costs_only_the_svg(
    guest: Guest, tmp_path: Path
) -> None:
    """Two pages of tmpfs: the folded profile and the pprof fit, the SVG does not."""
    with mounted_tmpfs(tmp_path / "disk", "size=8k") as disk:
        names = ("p.svg", "p.folded", "p.pb.gz")
        outputs = [arg for name in names[1:] for arg in ("-o", str(disk / name))]
        args = record_args(guest.qmp, guest.kernel, 2, disk / names[0], *outputs, "--idle")
        done = run_qmpprof(*args)
        assert_one_line_error(done.stderr.splitlines()[-1], done.returncode, "1 of 3 outputs")
        assert f"{disk / 'p.svg'}: No space left on device" in done.stderr
        assert sorted(os.listdir(disk)) == ["p.folded", "p.pb.gz"]
        assert folded_total(disk / "p.folded") == summary_samples(done.stdout) > 0
    assert guest.status() == "running"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "serve needs at least one --vm NAME=SOCKET or --libvirt DOMAIN"),
        (("--libvirt", "web 1"), "serve names a domain's profiles after it"),
        (("--vm", "web=/x.qmp", "--libvirt", "web"), "the same name given twice: web"),
    ],
)
def test_serve_refuses_a_vm_it_cannot_name(args: tuple[str, ...], expected: str) -> None:
    done = run_qmpprof("serve", "--listen", "127.0.0.1:0", *args)
    assert_one_line_error(done.stderr, done.returncode, expected)
