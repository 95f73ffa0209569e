"""`top`'s analysis (commands/top.py _Analysis) over ticks captured from the example guest
(data/samples/torn_ticks.qmpcap): what the view could not show is said on stderr once it
is gone, and a sample that cannot be analysed is counted, never the end of the view."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.top import _Analysis
from qmpprof.model import CapturedSample, Mode, Sample
from qmpprof.record.qmpcap import read_capture
from qmpprof.top_stats import TopStats
from tests.unit.data.qmp import guest_setup

FIXTURE = Path(__file__).parent / "data" / "samples" / "torn_ticks.qmpcap"


@pytest.fixture(scope="module")
def captured() -> list[CapturedSample]:
    guest_setup.built_guest()
    with read_capture(FIXTURE) as capture:
        return list(capture.samples())


class FailingOnKernelSamples(Analyzer):
    """Fails as a bug in analysis would, on every kernel-mode sample."""

    def symbolize(self, captured: CapturedSample) -> Sample:
        sample = super().symbolize(captured)
        if sample.mode is Mode.KERNEL:
            raise ValueError("no such frame")
        return sample


def test_no_kernel_given_is_said_once_the_view_is_gone(
    captured: list[CapturedSample], capsys: pytest.CaptureFixture[str]
) -> None:
    analysis = _Analysis(build_analyzer(TargetOptions("", None)), TopStats(), asyncio.Event())
    for sample in captured:
        analysis.add(sample)
    assert capsys.readouterr().err == ""
    analysis.tell()
    privileged = analysis.coverage.privileged
    assert privileged > 0
    assert capsys.readouterr().err == (
        f"qmpprof: kernel: no symbols for {privileged} of {privileged} kernel-mode PCs "
        "(no --kernel given, and none read from the guest's memory): give --kernel ELF to "
        "name them\n"
    )


def test_the_guests_kernel_says_nothing(
    captured: list[CapturedSample], capsys: pytest.CaptureFixture[str]
) -> None:
    analysis = _Analysis(guest_setup.guest_analyzer(), TopStats(), asyncio.Event())
    for sample in captured:
        analysis.add(sample)
    analysis.tell()
    assert capsys.readouterr().err == ""


def test_a_sample_that_cannot_be_analysed_is_counted(
    captured: list[CapturedSample], capsys: pytest.CaptureFixture[str]
) -> None:
    guest = guest_setup.guest_analyzer()
    analysis = _Analysis(
        FailingOnKernelSamples(guest.kernel, guest.users, guest.adapter),
        TopStats(),
        asyncio.Event(),
    )
    for sample in captured:
        analysis.add(sample)  # never raises
    kernel = sum(guest.symbolize(sample).mode is Mode.KERNEL for sample in captured)
    assert kernel > 0 and analysis.unanalysed == kernel
    analysis.tell()
    assert capsys.readouterr().err == (
        f"qmpprof: samples that could not be analysed: {kernel} (last: ValueError: no such frame)\n"
    )


def test_a_kernel_given_that_is_not_the_guests_ends_the_view(
    captured: list[CapturedSample],
) -> None:
    wrong = build_analyzer(TargetOptions("", guest_setup.USER_DIR / "crunch.elf"))
    unknown = build_analyzer(TargetOptions("", None))
    for analyzer, ends in ((wrong, True), (unknown, False), (guest_setup.guest_analyzer(), False)):
        stop = asyncio.Event()
        analysis = _Analysis(analyzer, TopStats(), stop)
        analysis.coverage.min_samples = 5  # the fixture holds 10 kernel-mode samples
        for sample in captured:
            analysis.add(sample)
        assert stop.is_set() == ends == analysis.coverage.mismatched
