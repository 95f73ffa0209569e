"""A sample whose analysis fails is counted and reported; the profile goes on."""

from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import Collector
from qmpprof.model import CapturedSample, MemoryWindow, RawSample, StopReason, UnwoundStack
from qmpprof.profile import Profile
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"


def test_a_failing_sample_is_counted_not_raised() -> None:
    """A replayed capture may hold a stack with no frame at all: symbolizing it fails."""
    registers = parse_all((DATA / "regs_guest_longmode.txt").read_text())[0]
    raw = RawSample(0.0, registers, (MemoryWindow(registers.rsp, bytes(64)),))
    frameless = CapturedSample(raw, UnwoundStack((), StopReason.END_OF_STACK), None)
    collector = Collector(Analyzer(), Profile())
    collector.add_captured(frameless)
    collector.add_captured(frameless)
    assert collector.profile.unanalysed == 2
    assert collector.profile.last_error == "IndexError: tuple index out of range"
    assert collector.samples == []
