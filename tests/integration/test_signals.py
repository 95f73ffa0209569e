"""Signals that end a recording: the VM runs afterwards and every sample the summary
counted is in every output. Real signals, sent to qmpprof as a separate process, at
several points of a real recording of the example guest."""

from __future__ import annotations

import gzip
import json
import re
import select
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.consumers.protobuf import decode_message, ints, messages
from tests.integration.conftest import Guest, record_args

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
OUTPUTS = ("p.folded", "p.speedscope.json", "p.svg", "p.pb.gz", "p.qmpcap")
_SAMPLES = re.compile(r"^\d+ ticks \((\d+) vCPU samples\)", re.MULTILINE)
SVG = "{http://www.w3.org/2000/svg}"


def start(guest: Guest, directory: Path) -> subprocess.Popen[str]:
    """A long recording into every format (idle samples included, so that every sample
    lands in every output), returned once it says it is recording."""
    outputs = [arg for name in OUTPUTS[1:] for arg in ("-o", str(directory / name))]
    args = record_args(guest.qmp, guest.kernel, 300, directory / OUTPUTS[0], *outputs)
    process = subprocess.Popen(
        [sys.executable, "-m", "qmpprof", *args, "--idle", "--rate", "200"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert next_line(process).startswith("recording "), "qmpprof did not start recording"
    return process


def next_line(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], 60)
    assert ready, "qmpprof said nothing for 60 s"
    return process.stderr.readline()


def wait_for_progress_lines(process: subprocess.Popen[str], count: int) -> None:
    """Block until qmpprof printed `count` progress lines (one a second, samples taken)."""
    seen = 0
    while seen < count:
        line = next_line(process)
        assert line, "qmpprof exited while recording"
        seen += line.startswith("progress: ") and not line.startswith("progress: 0 samples")


def counted_in_outputs(directory: Path) -> dict[str, int]:
    """The number of samples each output file holds, read by independent parsers."""
    folded = directory / "p.folded"
    lines = [line.rsplit(" ", 1) for line in folded.read_text().splitlines()]
    speedscope = json.loads((directory / "p.speedscope.json").read_text())
    svg = ET.fromstring((directory / "p.svg").read_bytes())
    pprof = decode_message(gzip.decompress((directory / "p.pb.gz").read_bytes()))
    with gzip.open(directory / "p.qmpcap", "rt") as capture:
        records = [json.loads(line) for line in capture]
    # Neither the header (first) nor the closing record ({"end": ...}) is a sample.
    captured = sum(1 for record in records[1:] if "end" not in record)
    return {
        "folded": sum(int(count) for _, count in lines),
        "speedscope": sum(len(p["samples"]) for p in speedscope["profiles"]),  # one each
        "svg": sum(
            int(g.attrib["data-w"])
            for g in svg.iter(f"{SVG}g")
            if g.get("class") == "frame" and g.attrib["data-d"] == "0"
        ),
        "pprof": sum(ints(sample, 2)[0] for sample in messages(pprof, 2)),
        "qmpcap": captured,
    }


def ended_by(guest: Guest, directory: Path, signum: signal.Signals, progress_lines: int) -> None:
    process = start(guest, directory)
    wait_for_progress_lines(process, progress_lines)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert f"recording ended early: interrupted ({signum.name})" in stdout, stdout
    assert "could not be analysed" not in stdout
    summary = _SAMPLES.search(stdout)
    assert summary is not None, stdout
    samples = int(summary.group(1))
    counted = counted_in_outputs(directory)
    assert counted == dict.fromkeys(counted, samples), stdout
    assert guest.status() == "running"


@pytest.mark.parametrize("progress_lines", [0, 2])
def test_every_stop_signal_keeps_every_sample_and_a_running_vm(
    guest: Guest, workdir: Path, progress_lines: int
) -> None:
    """Right after recording starts (few or no ticks yet) and two seconds in."""
    for signum in SIGNALS:
        directory = workdir / signum.name
        directory.mkdir()
        ended_by(guest, directory, signum, progress_lines)
