"""`report --reunwind` of a capture whose kernel and files were read from the guest's
memory, with none of them on this host: the stacks and names of the recording.

data/linux/reunwind.qmpcap is real: 8 of the 1,102 samples of a 10 s `qmpprof
--capture-memory` recording of the Linux example guest (Debian's 6.1, KASLR on) with no
kernel file and no sysroot, picked (one per process, mode and first recovery) among
those whose memory report unwinds differently on its own: the kernel's ORC and text, the
programs' CFI, the tasks' saved user registers were read from the guest, and report has
none. The recording wrote them with their names (CaptureWriter, as `record` does). The
expected stacks are the recording's own unwind and names, as the capture holds them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.report import (
    ReportOptions,
    named_as_recorded,
    reunwound,
    run_report,
    spliced_stack,
)
from qmpprof.console import Console
from qmpprof.model import (
    CapturedSample,
    Frame,
    FrameAddress,
    FrameKind,
    Recovery,
    StopReason,
    UnwoundStack,
)
from qmpprof.output.writers import Format
from qmpprof.record.qmpcap import read_capture
from qmpprof.record.qmpcap_schema import decode_sample, encode_sample, parse_line

CAPTURE = Path(__file__).parent / "data" / "linux" / "reunwind.qmpcap"


@pytest.fixture(scope="module")
def recorded() -> list[CapturedSample]:
    with read_capture(CAPTURE) as capture:
        samples = list(capture.samples())
    assert capture.damage is None and len(samples) == 8
    return samples


def test_the_saved_samples_round_trip_with_their_memory_and_names(
    recorded: list[CapturedSample],
) -> None:
    for sample in recorded:
        assert sample.raw.windows and any(sample.names)
        again = decode_sample(parse_line(encode_sample(sample, True, named(sample))))
        assert again == sample


def named(sample: CapturedSample) -> list[Frame]:
    """The frames as `record` gives them to the writer (only their names are written)."""

    return [
        Frame(f, n.function if n else None, n.offset if n else 0, n.module if n else None)
        for f, n in zip(sample.stack.frames, sample.names, strict=True)
    ]


def test_report_alone_unwinds_each_otherwise(recorded: list[CapturedSample]) -> None:
    """The data exercises what it should: with nothing of the guest's, report's own
    unwind of each sample's memory is not the recording's, and names no process."""
    analyzer = build_analyzer(TargetOptions("", None))
    for sample in recorded:
        again = analyzer.examine(sample.raw).sample
        assert addresses(again.stack) != addresses(sample.stack)
        assert again.process is None and sample.process is not None


def test_reunwound_is_the_recording_s_stack_and_process(recorded: list[CapturedSample]) -> None:
    analyzer = build_analyzer(TargetOptions("", None))
    for sample in recorded:
        again = reunwound(analyzer, sample)
        assert addresses(again.stack) == addresses(sample.stack)
        assert again.stack.stop is sample.stack.stop and again.process == sample.process
        labels = [f.label() for f in named_as_recorded(analyzer.symbolize(again), sample).frames]
        assert labels == [n.function if n else labels[i] for i, n in enumerate(sample.names)]


def test_report_with_and_without_reunwind_writes_the_same_stacks(tmp_path: Path) -> None:
    outputs = []
    for reunwind in (False, True):
        folded = tmp_path / f"{reunwind}.folded"
        options = ReportOptions(
            CAPTURE, TargetOptions("", None), ((folded, Format.FOLDED),), reunwind=reunwind
        )
        run_report(options, Console(file=(tmp_path / "out").open("w")))
        outputs.append(sorted(folded.read_text().splitlines()))
    assert outputs[0] == outputs[1]
    assert any("do_syscall_64" in line and "crunch" not in line for line in outputs[1])
    assert not any(";0x" in line for line in outputs[1] if "vmlinux" in line)


def addresses(stack: UnwoundStack) -> list[int]:
    return [frame.address for frame in stack.frames]


def frame(address: int, how: Recovery, kind: FrameKind = FrameKind.RETURN) -> FrameAddress:
    return FrameAddress(address, kind, how)


LEAF = FrameAddress(0x1000, FrameKind.INSTRUCTION, Recovery.REGISTERS)
RECORDED = UnwoundStack(
    (LEAF, frame(0x2000, Recovery.CFI), frame(0x3000, Recovery.CFI)), StopReason.END_OF_STACK
)


def never(address: int) -> bool:
    return False


def test_a_frame_report_found_by_its_own_tables_stands() -> None:
    ours = UnwoundStack((LEAF, frame(0x2500, Recovery.CFI)), StopReason.END_OF_STACK)
    assert spliced_stack(RECORDED, ours, never) is ours


def test_a_frame_report_guessed_by_frame_pointers_gives_way_to_the_recording_s() -> None:
    ours = UnwoundStack((LEAF, frame(0x2500, Recovery.FRAME_POINTER)), StopReason.BAD_FRAME)
    assert spliced_stack(RECORDED, ours, never) == RECORDED
    short = UnwoundStack((LEAF,), StopReason.END_OF_STACK)  # frame pointers said so
    assert spliced_stack(RECORDED, short, never) == RECORDED


def test_report_s_max_depth_stands() -> None:
    short = UnwoundStack((LEAF, frame(0x2000, Recovery.CFI)), StopReason.MAX_DEPTH)
    assert spliced_stack(RECORDED, short, never) is short


def test_frame_pointers_of_both_differ_only_where_report_lacks_the_code() -> None:
    """Both by frame pointers: the recording had the code (a prologue check reads it)
    where report has none; where report has it, its own answer stands."""
    theirs = UnwoundStack((LEAF, frame(0x2000, Recovery.FRAME_POINTER)), StopReason.END_OF_STACK)
    ours = UnwoundStack((LEAF, frame(0x2500, Recovery.FRAME_POINTER)), StopReason.END_OF_STACK)
    assert spliced_stack(theirs, ours, never) is ours
    assert spliced_stack(theirs, ours, lambda address: address == LEAF.address) == theirs


def test_a_different_leaf_is_report_s() -> None:
    ours = UnwoundStack(
        (frame(0x9000, Recovery.REGISTERS, FrameKind.INSTRUCTION),), StopReason.FAULT
    )
    assert spliced_stack(RECORDED, ours, lambda address: True) is ours
