"""A recording saved as .qmpcap gives, through `qmpprof report`, the folded output the
recording itself wrote: exactly, from the recorded addresses and from the memory."""

from __future__ import annotations

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
