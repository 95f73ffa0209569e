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
lies in a file the child mapped, so where one of a stack's user frames is named by its
module (dynwork, ld.so, libc, libqmpwork), so is each of them, never left a bare
address: a library mapped after the first walk is walked for. (A sample whose user
frames all stay unnamed is not judged: seen once in some twenty runs, a child's first
sample in ld.so's start, not understood yet.) Three kinds of sample are left out, where
the user frame is not the child's code to name from its maps: those of its exec, whose
user registers are still the program that called execve (inside the call, or a sample
whose kernel part ends where an interrupt entered: spawner's code); those in its exit,
once exit_mm has dropped its maps (named only by a walk made before, and there may have
been none since libc was mapped); and those in the middle of a context switch (qmpprof
leaves the old task's user frames unnamed there, as it promises).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.elf_tools import nm_functions
from tests.integration.conftest import run_cached
from tests.integration.speedscope_stacks import Stack, stacks_by_label
from tests.linux_vm import BUILD, MID_SWITCH, LinuxGuest, kernel_abis, running_linux

pytestmark = pytest.mark.integration

#: A child's label: spawner's children are the only dynwork processes in this guest.
CHILD = re.compile(r"^dynwork \(\d+\)$")
#: Kernel functions of the exec path (until it returns, the user registers are those
#: of the program that called execve) and of the exit path (from exit_mm on, the
#: process has no maps).
EXEC_OR_EXIT = frozenset({"__x64_sys_execve", "bprm_execve", "do_exit"})
#: Where a child's code lies: the files it maps (the kernel's frames are vmlinux's).
CHILD_FILES = {"dynwork", "ld-linux-x86-64.so.2", "libc.so.6", "libqmpwork.so.1", "[vdso]"}
#: A frame left unnamed: its address.
HEX = re.compile(r"^0x[0-9a-f]+$")
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
    output = tmp_path_factory.mktemp("record") / "children.speedscope.json"
    target = ("--qmp-socket", spawner_guest.qmp, "--unwind-paused")
    done = run_cached(*target, "--duration", "10", "-o", str(output))
    assert done.returncode == 0, done.stderr
    stacks = stacks_by_label(json.loads(output.read_text()))
    return {label: found for label, found in stacks.items() if CHILD.match(label)}


def spawner_code() -> range:
    """Where spawner's functions lie (static, not PIE: at its link addresses)."""
    functions = nm_functions(BUILD / "spawner")
    return range(functions[0][0], functions[-1][0] + functions[-1][1])


def its_own_code(stack: Stack, spawner: range) -> bool:
    names = {frame.name for frame in stack}
    unnamed = [int(frame.name, 16) for frame in stack if HEX.match(frame.name)]
    in_spawner = any(address in spawner for address in unnamed)
    return not names & EXEC_OR_EXIT and not names & MID_SWITCH and not in_spawner


def test_each_short_lived_process_s_frames_are_named_by_the_files_it_mapped(
    children: dict[str, list[Stack]],
) -> None:
    assert len(children) >= MIN_CHILDREN, sorted(children)
    checked, in_libraries = 0, 0
    spawner = spawner_code()
    for label, stacks in children.items():
        for stack in (stack for stack in stacks if its_own_code(stack, spawner)):
            users = [frame for frame in stack if frame.file != "vmlinux"]
            unnamed = [frame for frame in users if frame.file not in CHILD_FILES]
            if len(unnamed) == len(users):
                continue
            assert not unnamed, f"{label}: {shown(stack)}\nits samples:\n" + "\n".join(
                map(shown, stacks)
            )
            checked += 1
            in_libraries += any(frame.file == "libc.so.6" for frame in users)
    assert checked and in_libraries, (checked, in_libraries)


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
