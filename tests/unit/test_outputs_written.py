"""Outputs are checked before recording, written atomically and independently: on real
file systems that fill up (a small tmpfs) or refuse writes (a read-only one)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import Collector, check_writable, raise_for_failures
from qmpprof.errors import OutputError
from qmpprof.output.writers import Format
from qmpprof.profile import Profile
from tests.consumers.samples import RECORDING, TOTAL, realistic_samples
from tests.tmpfs import mounted_tmpfs

#: Three pages: the folded file and the pprof fit (under a page each, as written from
#: realistic_samples), the SVG (about 15 KB) does not.
SMALL = "size=12k"


def collected() -> Collector:
    collector = Collector(Analyzer(), Profile(include_idle=True))
    for sample in realistic_samples():
        collector.add(sample)
    return collector


def folded_total(path: Path) -> int:
    return sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines())


def test_a_full_disk_costs_only_the_output_that_does_not_fit(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", SMALL) as disk:
        outputs = [
            (disk / "p.svg", Format.SVG),
            (disk / "p.folded", Format.FOLDED),
            (disk / "p.pb.gz", Format.PPROF),
        ]
        written = collected().write_outputs(outputs, RECORDING)
        assert [w.error for w in written] == ["No space left on device", None, None]
        assert sorted(os.listdir(disk)) == ["p.folded", "p.pb.gz"]  # no temporary left
        assert folded_total(disk / "p.folded") == TOTAL
        assert (disk / "p.pb.gz").read_bytes()[:2] == b"\x1f\x8b"
        with pytest.raises(OutputError, match=r"1 of 3 outputs not written: .*p\.svg: No space"):
            raise_for_failures(written)


def test_a_write_that_fails_keeps_the_previous_file_whole(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", SMALL) as disk:
        previous = disk / "p.svg"
        previous.write_text("<svg>the previous profile</svg>")
        (written,) = collected().write_outputs([(previous, Format.SVG)], RECORDING)
        assert written.error is not None
        assert previous.read_text() == "<svg>the previous profile</svg>"
        assert os.listdir(disk) == ["p.svg"]


def test_a_replaced_file_keeps_its_mode_and_a_symlink_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.folded"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.folded"
    link.symlink_to(target)
    (written,) = collected().write_outputs([(link, Format.FOLDED)], RECORDING)
    assert written.error is None
    assert link.is_symlink() and folded_total(target) == TOTAL
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.folded", "real.folded"]


def test_a_fifo_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    (written,) = collected().write_outputs([(fifo, Format.FOLDED)], RECORDING)
    reader.join()
    assert written.error is None
    assert fifo.is_fifo()
    assert sum(int(line.rsplit(b" ", 1)[1]) for line in received[0].splitlines()) == TOTAL


def test_outputs_that_cannot_be_written_are_refused_before_recording(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    cases = [
        ([tmp_path / "adir"], "it is a directory"),
        ([tmp_path / "missing" / "p.svg"], "no directory"),
        ([tmp_path / "p.svg", tmp_path / "." / "p.svg"], "named twice"),
    ]
    for paths, message in cases:
        with pytest.raises(OutputError, match=message):
            check_writable(paths)
    check_writable([tmp_path / "p.svg", tmp_path / "p.folded"])
    assert os.listdir(tmp_path) == ["adir"]  # the probe leaves nothing behind


def test_a_read_only_file_system_is_refused_before_recording(tmp_path: Path) -> None:
    """Root may write anywhere permissions allow; a read-only mount still refuses it."""
    with (
        mounted_tmpfs(tmp_path / "ro", "size=16k,ro") as read_only,
        pytest.raises(OutputError, match="Read-only file system"),
    ):
        check_writable([read_only / "p.folded"])
