"""The capture-time unwind of a sample is the one its analysis uses (no second unwind)."""

from pathlib import Path

from qmpprof.analysis import MAX_REMEMBERED, Analyzer
from qmpprof.commands.collect import Collector
from qmpprof.memory import MemoryReader
from qmpprof.model import MemoryWindow, Process, RawSample, RegisterSet
from qmpprof.profile import Profile
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"


class CountingAdapter:
    """An OS adapter that names every vCPU's process and counts how often it is asked."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        self.calls += 1
        return Process(7, "seven")


def raw_sample() -> RawSample:
    registers = parse_all((DATA / "regs_guest_longmode.txt").read_text())[0]
    return RawSample(0.0, registers, (MemoryWindow(registers.rsp, bytes(64)),))


def test_analysis_after_capture_reuses_the_capture_time_work() -> None:
    adapter = CountingAdapter()
    analyzer = Analyzer(adapter=adapter)
    raw = raw_sample()
    assert analyzer.missing_address(raw) is None
    sample = analyzer.analyze(raw)
    assert adapter.calls == 1
    assert sample == Analyzer(adapter=CountingAdapter()).analyze(raw)


def test_the_recorder_reuses_the_capture_time_work_too() -> None:
    adapter = CountingAdapter()
    collector = Collector(Analyzer(adapter=adapter), Profile())
    raw = raw_sample()
    assert collector.analyzer.missing_address(raw) is None
    collector.add_raw(raw)
    assert adapter.calls == 1
    assert collector.samples == [Analyzer(adapter=CountingAdapter()).analyze(raw)]


def test_an_equal_but_other_sample_is_analysed_afresh() -> None:
    adapter = CountingAdapter()
    analyzer = Analyzer(adapter=adapter)
    analyzer.missing_address(raw_sample())
    analyzer.analyze(raw_sample())
    analyzer.analyze(raw_sample())
    assert adapter.calls == 3


def test_samples_never_analysed_are_forgotten() -> None:
    adapter = CountingAdapter()
    analyzer = Analyzer(adapter=adapter)
    kept = [raw_sample() for _ in range(MAX_REMEMBERED + 1)]
    for raw in kept:
        analyzer.missing_address(raw)
    analyzer.analyze(kept[0])  # the oldest was dropped to make room: unwound again
    analyzer.analyze(kept[-1])
    assert adapter.calls == len(kept) + 1
