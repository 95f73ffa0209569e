"""Aggregation into folded stacks: process roots, scopes, idle."""

from qmpprof.model import (
    KERNEL_ONLY,
    Frame,
    FrameAddress,
    FrameKind,
    Mode,
    Process,
    Sample,
    StopReason,
)
from qmpprof.output.folded import folded_lines
from qmpprof.profile import Grouping, Profile, Scope

KERNEL = 0xFFFF_FFFF_8010_0000
CRUNCH = Process(1, "crunch")


def sample(
    names: list[str | None],
    mode: Mode = Mode.KERNEL,
    process: Process | None = CRUNCH,
    kernel_frames: int | None = None,
) -> Sample:
    """Frames leaf first; the first `kernel_frames` (default: all in kernel mode) are kernel."""
    if kernel_frames is None:
        kernel_frames = len(names) if mode is not Mode.USER else 0
    frames = tuple(
        Frame(
            FrameAddress(
                (KERNEL if i < kernel_frames else 0x401000) + i,
                FrameKind.RETURN if i else FrameKind.INSTRUCTION,
            ),
            name,
            0,
            "m" if name else None,
        )
        for i, name in enumerate(names)
    )
    return Sample(0.0, 0, mode, frames, StopReason.END_OF_STACK, 0x5000, process)


def test_folded_is_process_then_root_first_heaviest_first() -> None:
    profile = Profile()
    for _ in range(3):
        profile.add(sample(["leaf_a", "mid", "main"]))
    profile.add(sample(["leaf_b", "main"], process=KERNEL_ONLY))
    assert list(folded_lines(profile)) == [
        "crunch (1);main;mid;leaf_a 3",
        "[kernel];main;leaf_b 1",
    ]
    assert profile.processes == {"crunch (1)": 3, "[kernel]": 1}


def test_unknown_process_is_labelled_by_address_space() -> None:
    profile = Profile()
    profile.add(sample(["work"], process=None))
    assert list(folded_lines(profile)) == ["cr3:0x5000;work 1"]


def test_unknown_frames_are_addresses_and_separators_are_neutralized() -> None:
    profile = Profile()
    profile.add(sample([None, "evil;name\nx"], process=Process(7, "a;b")))
    assert list(folded_lines(profile)) == [f"a:b (7);evil:name\\nx;{KERNEL:#x} 1"]


def test_idle_is_counted_but_not_stacked_unless_asked() -> None:
    profile = Profile()
    profile.add(sample(["hlt_loop"], Mode.IDLE))
    profile.add(sample(["work"]))
    assert profile.total == 2 and profile.stacked == 1
    with_idle = Profile(include_idle=True)
    with_idle.add(sample(["hlt_loop"], Mode.IDLE))
    assert with_idle.stacked == 1


def test_scopes_split_a_syscall_sample() -> None:
    syscall = sample(
        ["checksum_leaf", "sys_checksum", "crunch_checksum", "_start"], kernel_frames=2
    )
    in_user = sample(["hash_leaf", "_start"], mode=Mode.USER)
    kernel_only, user_only = Profile(scope=Scope.KERNEL), Profile(scope=Scope.USER)
    for profile in (kernel_only, user_only):
        profile.add(syscall)
        profile.add(in_user)
    assert list(folded_lines(kernel_only)) == ["crunch (1);sys_checksum;checksum_leaf 1"]
    assert (kernel_only.total, kernel_only.stacked) == (2, 1)
    assert sorted(folded_lines(user_only)) == [
        "crunch (1);_start;crunch_checksum 1",
        "crunch (1);_start;hash_leaf 1",
    ]


def test_folded_stacks_have_the_thread_or_the_vcpu_below_the_process() -> None:
    """`--group-by`: process then thread by default (none for a process without threads
    or a kernel thread), process then vCPU, or process alone."""
    worker = Process(7, "db", tid=9)
    kthread = Process(None, "[kworker/0:1]", tid=30)
    samples = [
        sample(["leaf", "main"], process=worker),
        sample(["idle"], process=kthread),
        sample(["leaf", "main"]),
    ]
    expected = {
        Grouping.THREAD: {"db (7);thread 9;main;leaf 1", "[kworker/0:1];idle 1"},
        Grouping.VCPU: {"db (7);vCPU 0;main;leaf 1", "[kworker/0:1];vCPU 0;idle 1"},
        Grouping.PROCESS: {"db (7);main;leaf 1", "[kworker/0:1];idle 1"},
    }
    for grouping, lines in expected.items():
        profile = Profile(grouping=grouping)
        for each in samples:
            profile.add(each)
        assert set(folded_lines(profile)) >= lines, grouping


def test_grouped_by_program_every_process_of_one_name_is_one_root() -> None:
    """`--group-by comm` (perf's `--sort comm`): a forking guest's hundreds of pids of a
    few programs are a few roots, in the stacks and in the summary's counts."""
    children = [Process(pid, "sh", tid=pid) for pid in range(100, 105)]
    samples = [sample(["fork", "main"], process=child) for child in children]
    samples.append(sample(["leaf", "main"]))
    profile = Profile(grouping=Grouping.COMM)
    for each in samples:
        profile.add(each)
    assert sorted(folded_lines(profile)) == ["crunch;main;leaf 1", "sh;main;fork 5"]
    assert profile.processes == {"sh": 5, "crunch": 1}
    unknown = sample(["leaf"], process=None)
    assert unknown.program() == unknown.label() == "cr3:0x5000"
