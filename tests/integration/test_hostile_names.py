"""The example guest profiled with a copy of its kernel whose hottest symbols objcopy
renamed to names that hold ESC, BEL, an OSC title sequence and a line break: `dump`,
`record` and `top` (in a real pseudo-terminal) never write them raw."""

from __future__ import annotations

import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from qmpprof.visible import visible
from tests.integration.conftest import Guest, record_args, run_qmpprof

#: The example guest's hottest function, and the idle loop.
RENAMED = {
    "physics_leaf": "\x1b]0;owned\x07physics\nleaf",
    "cpu_idle": "\x1b[2J\x1b[31midle\r",
}


def raw_controls(text: str) -> set[str]:
    return {c for c in text if unicodedata.category(c) in {"Cc", "Cf"} and c != "\n"}


@pytest.fixture
def hostile_kernel(guest: Guest, tmp_path: Path) -> Path:
    renamed = tmp_path / "hostile-kernel.elf"
    renames = [f"--redefine-sym={old}={new}" for old, new in RENAMED.items()]
    subprocess.run(["objcopy", *renames, str(guest.kernel), str(renamed)], check=True)
    return renamed


def test_dump(guest: Guest, hostile_kernel: Path) -> None:
    done = run_qmpprof("dump", "--qmp-socket", guest.qmp, "--kernel", str(hostile_kernel))
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout + done.stderr) == set()


def test_record_summary_and_folded(guest: Guest, hostile_kernel: Path, tmp_path: Path) -> None:
    folded = tmp_path / "out.folded"
    done = run_qmpprof(*record_args(guest.qmp, hostile_kernel, 2, folded))
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout + done.stderr + folded.read_text()) == set()
    assert "\\x07physics\\nleaf" in folded.read_text()  # spelled out, not dropped


def test_top_in_a_terminal(guest: Guest, hostile_kernel: Path, tmp_path: Path) -> None:
    """`script` gives top a pseudo-terminal and keeps every byte top wrote to it. Rich
    writes CSI sequences of its own, never BEL nor an OSC sequence: those would be the
    guest's."""
    log = tmp_path / "terminal.log"
    command = f"{sys.executable} -m qmpprof top --qmp-socket {guest.qmp} --kernel {hostile_kernel}"
    top = subprocess.Popen(
        ["script", "-qfec", command, str(log)], stdin=subprocess.PIPE, cwd=Path.cwd()
    )
    shown = visible(RENAMED["physics_leaf"]).split("\\n")[0]
    try:
        started = time.monotonic()
        while shown.encode() not in _bytes(log) and time.monotonic() - started < 60:
            time.sleep(0.1)  # polling a screen, as a reader would; not a synchronisation
        assert top.stdin is not None
        top.stdin.write(b"q")
        top.stdin.flush()
        top.wait(timeout=30)
    finally:
        top.kill()
        top.wait()
    written = _bytes(log)
    assert shown.encode() in written, written[-2000:]
    assert b"\x07" not in written and b"\x1b]" not in written


def _bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


#: What fits in the example guest's 16-byte process name: clear screen, BEL, a line break.
PROCESS_NAME = b"\x1b[2J\x07cr\nunch"


def test_a_guest_process_named_with_escapes(workdir: Path, tmp_path: Path) -> None:
    """GDB (which holds the guest stopped once attached) writes the name into the process
    table, then detaches and the guest runs on; qmpprof reads the name from guest memory,
    as always."""
    from tests.integration.test_gdb_agreement import guest_under_gdb

    with guest_under_gdb(workdir, "--workload", "user", "--smp", "2") as (guest, gdb):
        gdb.command(f"-data-write-memory-bytes &process_table[0].name {PROCESS_NAME.hex()}00")
        gdb.detach()
        folded = tmp_path / "out.folded"
        done = run_qmpprof(*record_args(guest.qmp, guest.kernel, 2, folded))
    assert done.returncode == 0, done.stderr
    assert raw_controls(done.stdout + done.stderr + folded.read_text()) == set()
    assert visible(PROCESS_NAME.decode()) in done.stdout
