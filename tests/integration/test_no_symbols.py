"""A guest qmpprof has no symbols for, profiled as a user would with no --kernel and no
--user-dir: the example guest (its memory gives no kernel: it is not Linux) and Debian's
memtest86+, a bare-metal program nobody here wrote. `record`, `top` and `serve` sample
for as long as asked (they once stopped after 20 kernel-mode samples, silently: the
check for a --kernel that does not match the guest fired with no kernel given), keep
frames as addresses, and say in one line what went unnamed and how to name it."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.symbols.coverage import KernelCoverage
from tests.consumers.protobuf import decode_message, one
from tests.integration.conftest import Guest, run_qmpprof
from tests.integration.test_serve import serving, wait_for
from tests.integration.test_top_tmux import (
    in_tmux,
    needs_tmux,
    qmpprof_command,
    rows,
    tmux,
    wait_for_exit,
    wait_for_session_text,
)
from tests.unit.conftest import build_elf

SECONDS = 2
RATE = 50
MEMTEST = Path("/boot/memtest86+x64.bin")
#: The one line, on the summary (record) or stderr (top) or the log (serve).
UNNAMED = re.compile(
    r"kernel: no symbols for (\d+) of (\d+) kernel-mode PCs \(no --kernel given, and none "
    r"read from the guest's memory\): give --kernel ELF to name them"
)
_REQUESTED = re.compile(r"^\d+ ticks .*; requested (\d+),", re.MULTILINE)
_MODES = re.compile(r"^samples: kernel (\d+) \(.*, user (\d+) \(.*, idle (\d+) ", re.MULTILINE)
#: A frame with no symbol: a bare address, or FILE+offset where a module is known.
_ADDRESS = re.compile(r"^(?:0x[0-9a-f]+|\S+\+0x[0-9a-f]+)$")


def record_unnamed(qmp: str, output: Path, *extra: str) -> str:
    """`record` with no binaries for SECONDS at RATE Hz: its stdout, once it is checked
    to have run its whole schedule, exited 0 and said the one line."""
    done = run_qmpprof(
        "--qmp-socket", qmp, "--duration", str(SECONDS), "--rate", str(RATE),
        "-o", str(output), *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    requested = _REQUESTED.search(done.stdout)
    assert requested is not None, done.stdout
    # Every slot of the SECONDS was scheduled (taken, or missed on a slow host): the
    # recording was not cut short.
    assert int(requested[1]) >= SECONDS * RATE, done.stdout
    assert "ended early" not in done.stdout
    said = [line for line in done.stdout.splitlines() if line.startswith("kernel: no symbols")]
    assert len(said) == 1, done.stdout
    found = UNNAMED.fullmatch(said[0])
    modes = _MODES.search(done.stdout)
    assert found is not None and modes is not None, done.stdout
    kernel, _, idle = map(int, modes.groups())
    # Every kernel-mode (and idle) sample, and none of them named.
    assert int(found[1]) == int(found[2]) == kernel + idle > 0
    return done.stdout


def address_frames(output: Path) -> list[str]:
    """Every frame of the folded output under its process label."""
    lines = output.read_text().splitlines()
    assert lines, "an empty profile"
    return [frame for line in lines for frame in line.rsplit(" ", 1)[0].split(";")[1:]]


def test_record_without_symbols_runs_its_duration(guest: Guest, workdir: Path) -> None:
    output = workdir / "p.folded"
    record_unnamed(guest.qmp, output)
    frames = address_frames(output)
    assert frames and all(_ADDRESS.match(frame) for frame in frames), frames
    assert guest.status() == "running"


def test_top_without_symbols_keeps_sampling_and_says_so_at_the_end(
    guest: Guest, workdir: Path
) -> None:
    needs_tmux()
    session = "qmpprof-top-no-symbols"
    command = qmpprof_command("top", "--qmp-socket", guest.qmp)
    past_the_old_stop = KernelCoverage().min_samples

    def counted_past_it(text: str) -> bool:
        totals = [int(row[3]) for row in rows(text) if len(row) > 4] if "%Own" in text else []
        return bool(totals) and max(totals) > past_the_old_stop

    with in_tmux(session, command, workdir, keep_stderr=True) as pid:
        wait_for_session_text(session, counted_past_it, 60)
        text = tmux("capture-pane", "-p", "-t", session)
        functions = [row[4] for row in rows(text) if len(row) > 4]
        assert functions and all(_ADDRESS.match(name) for name in functions), text
        tmux("send-keys", "-t", session, "q")
        wait_for_exit(pid, 30)
    assert (workdir / "status").read_text().strip() == "0"
    lines = (workdir / "stderr").read_text().strip().splitlines()
    found = UNNAMED.fullmatch(lines[-1].removeprefix("qmpprof: "))
    assert found is not None, lines
    assert int(found[1]) == int(found[2]) > past_the_old_stop
    assert guest.status() == "running"


def test_serve_without_symbols_answers_the_seconds_asked(guest: Guest) -> None:
    with serving({"a": guest.qmp}, None, "--rate", str(RATE)) as serve:
        status, _, body = serve.get(f"/debug/pprof/profile?seconds={SECONDS}")
        assert status == 200, body
        profile = decode_message(gzip.decompress(body))
        # The sampling ends at the first tick due at or past the seconds asked: the
        # profile covers them, less the last period (a slot moves by 10% of one).
        assert one(profile, 10) >= (SECONDS - 2 / RATE) * 1e9
        strings = [s.decode() for s in profile[6] if isinstance(s, bytes)]
        assert any(re.fullmatch(r"0x[0-9a-f]+", name) for name in strings), strings
        wait_for(lambda: any(UNNAMED.search(line) for line in serve.log), "the unnamed line")
        said = [line for line in serve.log if UNNAMED.search(line)]
        assert len(said) == 1 and said[0].startswith("qmpprof serve: VM a: kernel: ")
        assert serve.get(f"/debug/pprof/profile?seconds={SECONDS}")[0] == 200
        assert [line for line in serve.log if UNNAMED.search(line)] == said  # said once
        # So is what connecting found (no kernel in the guest's memory): not per scrape.
        found = [line for line in serve.log if "the guest's memory gives none" in line]
        assert len(found) == 1, serve.log
    assert guest.status() == "running"


@pytest.fixture
def memtest(workdir: Path) -> Iterator[str]:
    """Debian's memtest86+ (package memtest86+) booted by QEMU's -kernel: its QMP socket."""
    if not MEMTEST.is_file():
        pytest.skip(f"no {MEMTEST}: apt-get install memtest86+")
    qmp, pid_file = workdir / "qmp", workdir / "pid"
    accel = os.environ.get("ACCEL", "tcg")
    command = [
        "qemu-system-x86_64", "-daemonize", "-pidfile", str(pid_file),
        "-qmp", f"unix:{qmp},server=on,wait=off", "-accel", accel, "-m", "256M",
        "-display", "none", "-serial", f"file:{workdir / 'serial.log'}",
        "-kernel", str(MEMTEST),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=60)
    try:
        yield str(qmp)
    finally:
        subprocess.run(["kill", pid_file.read_text().strip()], check=False)


def test_memtest86_without_symbols_is_recorded_for_its_duration(
    memtest: str, workdir: Path
) -> None:
    """Whatever it runs when sampled (SeaBIOS loading it, or its tests), every sample is
    kept (--idle: a firmware waiting in `hlt` is profiled too) and none is named."""
    output = workdir / "p.folded"
    record_unnamed(memtest, output, "--idle")
    frames = address_frames(output)
    assert frames and all(_ADDRESS.match(frame) for frame in frames), frames


def test_top_with_a_kernel_that_is_not_the_guests_ends_with_one_line(
    guest: Guest, workdir: Path
) -> None:
    """The contrast: a --kernel given that names none of the guest's PCs ends the view by
    itself (as it ends `record`), with the error and a non-zero exit."""
    needs_tmux()
    wrong = build_elf("symbols.c", workdir, "-O1")
    session = "qmpprof-top-wrong-kernel"
    command = qmpprof_command("top", "--qmp-socket", guest.qmp, "--kernel", str(wrong))
    with in_tmux(session, command, workdir, keep_stderr=True) as pid:
        wait_for_exit(pid, 60)
    assert (workdir / "status").read_text().strip() == "1"
    lines = (workdir / "stderr").read_text().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qmpprof: error: "), lines
    assert f"{wrong} does not match the guest" in lines[0]
    assert guest.status() == "running"
