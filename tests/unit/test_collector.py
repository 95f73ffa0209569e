"""A sample whose analysis fails is counted and reported; the profile goes on."""

from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.collect import Collector
from qmpprof.memory import MemoryReader
from qmpprof.model import MemoryWindow, Process, RawSample, RegisterSet
from qmpprof.profile import Profile
from qmpprof.target.registers import parse_all

DATA = Path(__file__).parent / "data"


class BrokenAdapter:
    """An OS adapter with a bug: it raises something other than MemoryFault."""

    name = "broken"

    def process(self, registers: RegisterSet, memory: MemoryReader) -> Process | None:
        raise ValueError("adapter bug")


def test_a_failing_sample_is_counted_not_raised() -> None:
    registers = parse_all((DATA / "regs_guest_longmode.txt").read_text())[0]
    raw = RawSample(0.0, registers, (MemoryWindow(registers.rsp, bytes(64)),))
    collector = Collector(Analyzer(adapter=BrokenAdapter()), Profile())
    collector.add_raw(raw)
    collector.add_raw(raw)
    assert collector.profile.unanalysed == 2
    assert collector.profile.last_error == "ValueError: adapter bug"
    assert collector.samples == []
