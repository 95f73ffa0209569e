"""The kernel-coverage rule (symbols/coverage.py) over ticks captured from the example
guest (data/samples/torn_ticks.qmpcap: its user workload on two vCPUs), each sample
symbolized as `record` does, through a Collector: a --kernel that names no kernel PC
mismatches (the run stops and fails); with no kernel given nothing mismatches (the run
goes on), and the summary's line says what went unnamed and how to name it."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import Collector
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.model import CapturedSample, Mode
from qmpprof.profile import Profile
from qmpprof.record.qmpcap import read_capture
from qmpprof.symbols.coverage import KernelCoverage
from tests.unit.data.qmp import guest_setup

FIXTURE = Path(__file__).parent / "data" / "samples" / "torn_ticks.qmpcap"
#: The fixture holds 10 kernel-mode (or idle) samples: the rule needs this many.
MIN_SAMPLES = 5


@pytest.fixture(scope="module")
def captured() -> list[CapturedSample]:
    guest_setup.built_guest()
    with read_capture(FIXTURE) as capture:
        return list(capture.samples())


def collected(analyzer: Analyzer, captured: list[CapturedSample]) -> Collector:
    collector = Collector(analyzer, Profile())
    collector.coverage.min_samples = MIN_SAMPLES
    for sample in captured:
        collector.add_captured(sample)
    return collector


def privileged(collector: Collector) -> int:
    return sum(sample.mode is not Mode.USER for sample in collector.samples)


def test_the_guests_kernel_matches(captured: list[CapturedSample]) -> None:
    collector = collected(guest_setup.guest_analyzer(), captured)
    assert collector.coverage.kernel_samples >= MIN_SAMPLES
    assert not collector.coverage.mismatched
    assert collector.symbol_problems() == []


def test_another_elf_given_as_kernel_mismatches(captured: list[CapturedSample]) -> None:
    wrong = guest_setup.USER_DIR / "crunch.elf"
    collector = collected(build_analyzer(TargetOptions("", wrong)), captured)
    assert collector.coverage.mismatched
    total = privileged(collector)
    assert collector.coverage.describe(str(wrong)) == (
        f"{wrong} does not match the guest: {total} of {total} kernel-mode PCs are "
        "outside its symbols"
    )
    assert collector.symbol_problems() == []  # an error, not a note


def test_no_kernel_given_never_mismatches_and_says_what_went_unnamed(
    captured: list[CapturedSample],
) -> None:
    collector = collected(build_analyzer(TargetOptions("", None)), captured)
    total = privileged(collector)
    assert total >= MIN_SAMPLES and not collector.coverage.mismatched
    assert collector.symbol_problems() == [
        f"kernel: no symbols for {total} of {total} kernel-mode PCs (no --kernel given, "
        "and none read from the guest's memory): give --kernel ELF to name them"
    ]


def test_a_kernel_read_from_memory_that_names_too_little_is_said_not_stopped_for(
    captured: list[CapturedSample],
) -> None:
    """As if the kernel read from the guest's memory (not given) were another ELF."""
    analyzer = build_analyzer(TargetOptions("", guest_setup.USER_DIR / "crunch.elf"))
    coverage = KernelCoverage(min_samples=MIN_SAMPLES, kernel_given=False)
    for sample in captured:
        coverage.add(analyzer.symbolize(sample))
    assert not coverage.mismatched
    total = coverage.kernel_samples
    assert coverage.unnamed_line(has_kernel=True) == (
        f"kernel: no symbols for {total} of {total} kernel-mode PCs (outside the symbols "
        "of the kernel read from the guest's memory): give --kernel VMLINUX to name them"
    )


def test_a_kernel_given_that_names_its_pcs_says_nothing() -> None:
    assert KernelCoverage(kernel_given=True).unnamed_line(has_kernel=True) is None
