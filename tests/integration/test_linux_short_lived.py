"""Processes that live for less than a second, as a shell script's or a build's do: the
Linux example guest's spawner (boot.sh --workloads spawner) starts one dynwork after
another, each for a few rounds of its loop (workloads/spawner.c), a dynamically linked
PIE with Debian's ld.so and libc and our libqmpwork.so.1, at addresses ASLR picks.

`qmpprof record` with no kernel and no sysroot, as the mission's user runs it, but with
`--unwind-paused`, so that each sample's maps are walked at the very instant it was
taken (by default they are walked after the VM runs again, and a child exiting or
mapping its files then may leave one sample unnamed). A child's maps are first walked
while its exec or ld.so is still mapping its files, so its libraries are mapped after
that walk; the recording goes on long enough to see many children.

The oracle is the guest's own code: every frame of a child that is not the kernel's
lies in a file the child mapped (dynwork, ld.so, libc, libqmpwork, the vDSO), so each
must be named by its module, never left a bare address; inside execve, until the new
program runs, the user registers are still those of the program that called execve,
spawner (fork gave the child spawner's maps), so there it is named by spawner. Every
child sample is judged, but two kinds that no walk of the guest's memory can name (the
files that held the pc were never mapped when the child was seen): the exec of the
recording's first child (it began before spawner, its parent, was ever sampled), and the
end of the exit of a child none of whose samples ran libc code (once exit_mmap has
freed its maps, the maps read before name it, and a child seen only in ld.so and in its
exit was never seen with libc mapped). Samples in the middle of a context switch are
left out too: past its first user frame, the user stack there is another process's
memory (qmpprof names only that first frame).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.integration.conftest import run_cached
from tests.integration.speedscope_stacks import Stack, recorded_stacks
from tests.linux_vm import MID_SWITCH, LinuxGuest, kernel_abis, running_linux

pytestmark = pytest.mark.integration

#: A child's label: spawner's children are the only dynwork processes in this guest.
CHILD = re.compile(r"^dynwork \(\d+\)$")
#: The kernel function of the exec path (until it returns, the user registers are those
#: of the program that called execve) and of the exit path (from exit_mm on, the
#: process has no maps of its own).
EXEC, EXIT = "__x64_sys_execve", "do_exit"
#: Where a child's code lies: the files it maps (the kernel's frames are vmlinux's).
CHILD_FILES = {"dynwork", "ld-linux-x86-64.so.2", "libc.so.6", "libqmpwork.so.1", "[vdso]"}
#: Where it lies from fork until its exec is done (the label says `dynwork` from the
#: middle of execve on): its parent's program (static, so one file).
PARENT_FILES = {"spawner"}
#: Children seen at least (a few rounds of dynwork's loop each: some 80 in 10 s here).
MIN_CHILDREN = 10


@pytest.fixture(scope="module")
def spawner_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    workdir = tmp_path_factory.mktemp("short-lived")
    with running_linux(workdir, "--workloads", "spawner", abi=kernel_abis()[0]) as guest:
        yield guest


@pytest.fixture(scope="module")
def children(
    spawner_guest: LinuxGuest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[Stack]]:
    """Each child's samples in a 10 s recording, by its label."""
    target = ("--qmp-socket", spawner_guest.qmp, "--unwind-paused", "--duration", "10")
    stacks, _ = recorded_stacks(tmp_path_factory.mktemp("record"), *target)
    return {label: found for label, found in stacks.items() if CHILD.match(label)}


def test_each_short_lived_process_s_frames_are_named_by_the_files_it_mapped(
    children: dict[str, list[Stack]],
) -> None:
    assert len(children) >= MIN_CHILDREN, sorted(children)
    first = min(children, key=pid_of)
    judged = {"exec": 0, "exit": 0, "other": 0}
    for label, stacks in children.items():
        ran_libc = any(frame.file == "libc.so.6" for stack in stacks for frame in stack)
        for stack in stacks:
            names = {frame.name for frame in stack}
            kind = "exec" if EXEC in names else "exit" if EXIT in names else "other"
            if names & MID_SWITCH or (kind == "exec" and label == first):
                continue
            users = [frame for frame in stack if frame.file != "vmlinux"]
            unnamed = [frame for frame in users if frame.file not in CHILD_FILES | PARENT_FILES]
            if unnamed and kind == "exit" and not ran_libc:
                continue
            assert not unnamed, f"{label}: {shown(stack)}\nits samples:\n" + "\n".join(
                map(shown, stacks)
            )
            judged[kind] += bool(users)
    assert all(judged.values()), judged


def pid_of(label: str) -> int:
    return int(label.rsplit("(", 1)[1].rstrip(")"))


def shown(stack: Stack) -> str:
    return " <- ".join(f"{f.name} ({f.file})" for f in reversed(stack))


def test_grouped_by_program_the_children_are_one_root(
    spawner_guest: LinuxGuest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`--group-by comm`: spawner's dozens of short-lived children (each `dynwork (pid)`
    in the default grouping) are one root, `dynwork`, in the folded stacks and in the
    summary's program line, as perf's comm sort shows them."""
    output = tmp_path_factory.mktemp("comm") / "programs.folded"
    target = ("--qmp-socket", spawner_guest.qmp, "--group-by", "comm")
    done = run_cached(*target, "--duration", "4", "-o", str(output))
    assert done.returncode == 0, done.stderr
    roots = {line.split(";", 1)[0] for line in output.read_text().splitlines()}
    assert "dynwork" in roots and "spawner" in roots, roots
    assert not [root for root in roots if re.search(r" \(\d+\)$", root)], roots
    summary = done.stderr + done.stdout
    (programs,) = [line for line in summary.splitlines() if line.startswith("programs: ")]
    assert programs.count("dynwork ") == 1 and " more " not in programs, programs
