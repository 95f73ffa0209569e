"""A recording saved as .qmpcap gives, through `qmpprof report`, the folded output the
recording itself wrote: exactly, from the recorded addresses and from the memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Guest, record_args, run_qmpprof


def test_report_reproduces_the_recorded_folded_output(guest: Guest, workdir: Path) -> None:
    recorded, capture = workdir / "live.folded", workdir / "live.qmpcap"
    done = run_qmpprof(
        *record_args(guest.qmp, guest.kernel, 3, recorded, "-o", str(capture), "--capture-memory")
    )
    assert done.returncode == 0, done.stderr
    assert recorded.read_text().strip()
    for extra in ((), ("--reunwind",)):
        replayed = workdir / f"replay{len(extra)}.folded"
        report = run_qmpprof("report", str(capture), "-o", str(replayed), *extra)
        assert report.returncode == 0, report.stderr
        assert replayed.read_text() == recorded.read_text()


def test_report_of_something_else_is_a_one_line_error(workdir: Path) -> None:
    not_a_capture = workdir / "x.qmpcap"
    not_a_capture.write_bytes(b"\x7fELF not a capture")
    done = run_qmpprof("report", str(not_a_capture), "-o", str(workdir / "out.folded"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "not a readable qmpcap" in done.stderr


def test_a_capture_killed_while_recording_reports_its_flushed_samples(
    guest: Guest, workdir: Path
) -> None:
    """SIGKILL after a few progress lines: the capture holds every sample up to its
    last flush, as gzip itself decodes them, and report reads them all with one warning."""
    capture, replayed = workdir / "killed.qmpcap", workdir / "replayed.folded"
    args = record_args(guest.qmp, guest.kernel, 60, workdir / "never.folded", "-o", str(capture))
    recording = subprocess.Popen(
        [sys.executable, "-m", "qmpprof", *args, "--idle"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert recording.stderr is not None
        progress = 0
        while progress < 3:
            line = recording.stderr.readline()
            assert line, "qmpprof ended before printing progress"
            progress += line.startswith("progress:")
    finally:
        recording.kill()
        recording.communicate()
    decoded = subprocess.run(["gzip", "-dc", str(capture)], capture_output=True).stdout
    written = decoded.count(b"\n") - 1  # complete lines, less the header
    assert written > 0
    report = run_qmpprof("report", str(capture), "-o", str(replayed), "--idle")
    assert report.returncode == 0, report.stderr
    assert report.stderr.count("\n") == 1 and report.stderr.startswith("warning: "), report.stderr
    assert "killed?" in report.stderr
    assert folded_total(replayed) == written


def folded_total(path: Path) -> int:
    return sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines())
