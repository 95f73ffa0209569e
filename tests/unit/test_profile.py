"""Aggregation into folded stacks."""

from qmpprof.model import Frame, FrameAddress, FrameKind, Mode, Sample, StopReason
from qmpprof.output.folded import folded_lines
from qmpprof.profile import Profile


def sample(names: list[str | None], mode: Mode = Mode.KERNEL) -> Sample:
    frames = tuple(
        Frame(
            FrameAddress(0x1000 + i, FrameKind.RETURN if i else FrameKind.INSTRUCTION),
            name,
            0,
            "k" if name else None,
        )
        for i, name in enumerate(names)
    )
    return Sample(0.0, 0, mode, frames, StopReason.END_OF_STACK)


def test_folded_is_root_first_heaviest_first() -> None:
    profile = Profile()
    for _ in range(3):
        profile.add(sample(["leaf_a", "mid", "main"]))
    profile.add(sample(["leaf_b", "main"]))
    assert list(folded_lines(profile)) == ["main;mid;leaf_a 3", "main;leaf_b 1"]


def test_unknown_frames_are_addresses_and_separators_are_neutralized() -> None:
    profile = Profile()
    profile.add(sample([None, "evil;name\nx"]))
    assert list(folded_lines(profile)) == ["evil:name x;0x1000 1"]


def test_idle_is_counted_but_not_stacked_unless_asked() -> None:
    profile = Profile()
    profile.add(sample(["hlt_loop"], Mode.IDLE))
    profile.add(sample(["work"]))
    assert profile.total == 2 and profile.stacked == 1
    with_idle = Profile(include_idle=True)
    with_idle.add(sample(["hlt_loop"], Mode.IDLE))
    assert with_idle.stacked == 1
