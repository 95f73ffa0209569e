"""A 10 s `qmpprof record` of the system-call workload (sysloop) on the Linux guest, KASLR on:
its kernel samples carry its user frames below the kernel's, every sample that is not idle
is labelled with its task, and its heaviest stacks read as perf draws a system call.

The oracles are not qmpprof's: the call chains examples/linux/workloads/sysloop.c documents,
the names and addresses nm gives for sysloop and the vmlinux, Linux's x86-64 system-call
path (entry_SYSCALL_64 -> do_syscall_64 -> the call's function, or the entry and exit
work do_syscall_64 does around it), and the pid init prints for sysloop on the console.
The recording is read from its speedscope file, which keeps each sample's stack and each
frame's file (vmlinux or sysloop) apart."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import run_cached
from tests.integration.speedscope_stacks import Frame, Stack, stacks_by_label
from tests.linux_vm import (
    BUILD,
    MID_SWITCH,
    LinuxGuest,
    nm_symbols,
    running_linux,
    started_pids,
)

WORKLOAD = BUILD / "sysloop"
#: sysloop's helpers and the C library call each one makes (workloads/sysloop.c).
CALLS = {"read_zero": "read", "write_null": "write", "ask_parent": "getppid"}
#: sysloop's own chain from main to a helper (workloads/sysloop.c).
USER_CHAIN = ("main", "sysloop_loop")
#: Where Linux's 64-bit system-call path goes before the call's own function.
SYSCALL_ENTRY = ("entry_SYSCALL_64", "do_syscall_64")
#: What do_syscall_64 calls to pick the call's function since 2024 (6.12; backported to
#: Debian's 6.1), instead of indexing the table itself.
DISPATCH = "x64_sys_call"
#: What do_syscall_64 calls before and after the call's function (arch/x86/entry/common.c):
#: the entry work (tracing, seccomp) and the exit work (signals, rescheduling).
SYSCALL_WORK = ("syscall_enter_from_user_mode", "syscall_exit_to_user_mode")
#: The share of sysloop's kernel samples that must reach one of its user frames.
MIN_INTO_USER = 0.95
#: Process labels: `comm (pid)` for a process, `[comm]` for a kernel thread or idle.
LABEL = re.compile(r"^(\S+ \(\d+\)|\[\S+\])$")
#: qmpprof's label for a CPU whose task it could not tell (qmpprof/model.py).
NO_TASK = "[kernel]"
#: The stacks compared with perf's.
TOP = 5


@pytest.fixture(scope="module")
def sysloop_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    with running_linux(tmp_path_factory.mktemp("syscalls"), "--workloads", "sysloop") as guest:
        yield guest


@pytest.fixture(scope="module")
def recorded(
    sysloop_guest: LinuxGuest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """The speedscope file of the recording, and what record printed."""
    output = tmp_path_factory.mktemp("record") / "sysloop.speedscope.json"
    target = ["--qmp-socket", sysloop_guest.qmp, "--kernel", str(sysloop_guest.kernel)]
    done = run_cached(
        "record", *target, "--user", str(WORKLOAD), "--duration", "10", "-o", str(output)
    )
    assert done.returncode == 0, done.stderr
    return output, done.stdout + done.stderr


@pytest.fixture(scope="module")
def recording(recorded: tuple[Path, str]) -> dict[str, list[Stack]]:
    """Each sampled task's stacks, one per sample, by its label (idle left out)."""
    return stacks_by_label(json.loads(recorded[0].read_text()))


def test_no_stack_is_called_torn(recorded: tuple[Path, str]) -> None:
    """Linux rewrites its code at boot (paravirt calls, alternatives): the vmlinux's
    bytes cannot say whether a kernel return address follows a call, so they must not
    call the idle task's or read_zero's stacks torn (they did, 1,023 of 1,684 samples)."""
    assert "torn stacks" not in recorded[1], recorded[1]


def sysloop_label(guest: LinuxGuest) -> str:
    pids = started_pids(Path(guest.serial).read_text())
    assert "sysloop" in pids, "init did not say it started sysloop"
    return f"sysloop ({pids['sysloop']})"


def is_user(frame: Frame) -> bool:
    return frame.file == WORKLOAD.name


def test_every_sample_that_is_not_idle_is_labelled_with_its_task(
    sysloop_guest: LinuxGuest, recording: dict[str, list[Stack]]
) -> None:
    label = sysloop_label(sysloop_guest)
    counts = {name: len(stacks) for name, stacks in recording.items()}
    print(f"\nsamples by task (idle left out): {counts}")
    assert label in recording, sorted(recording)
    assert all(LABEL.match(name) for name in recording), sorted(recording)
    assert NO_TASK not in recording, counts
    for name, stacks in recording.items():
        if name != label:  # sysloop's code runs under sysloop's pid alone
            settled = [stack for stack in stacks if not switching(stack)]
            assert not any(is_user(frame) for stack in settled for frame in stack), name


def switching(stack: Stack) -> bool:
    """A sample mid context switch: on the next task's stack (sysloop's, seen under
    [kworker/0:1]) while `current` still names the task switched out."""
    return any(frame.name in MID_SWITCH for frame in stack)


def test_kernel_samples_of_sysloop_show_its_user_frames_below(
    sysloop_guest: LinuxGuest, recording: dict[str, list[Stack]]
) -> None:
    """A kernel sample's leaf is not sysloop's; its stack reaches sysloop's _start, and no
    kernel frame sits below a user frame."""
    kernel = [s for s in recording[sysloop_label(sysloop_guest)] if not is_user(s[-1])]
    into_user = [s for s in kernel if s[0].name == "_start" and is_user(s[0])]
    share = len(into_user) / len(kernel) if kernel else 0.0
    print(
        f"\n{len(into_user)} of {len(kernel)} kernel samples of sysloop reach _start ({share:.1%})"
    )
    assert kernel, "sysloop spends most of its time in system calls, yet no kernel sample"
    assert share >= MIN_INTO_USER
    for stack in into_user:
        users = [is_user(frame) for frame in stack]
        assert users == sorted(users, reverse=True), stack


def test_the_heaviest_stacks_of_sysloop_read_like_perfs(
    sysloop_guest: LinuxGuest, recording: dict[str, list[Stack]]
) -> None:
    tally = Counter(recording[sysloop_label(sysloop_guest)])
    heaviest = tally.most_common(TOP)
    print(f"\nsysloop's {TOP} heaviest stacks of {tally.total()} samples (root first):")
    for stack, count in heaviest:
        print(f"  {count:5d}  {';'.join(frame.name for frame in stack)}")
    names = PerfNames(nm_symbols(WORKLOAD), nm_symbols(sysloop_guest.kernel))
    for stack, _ in heaviest:
        assert names.problem(stack) is None, (names.problem(stack), stack)
    full = [stack for stack, _ in heaviest if names.reaches_the_call(stack)]
    assert full, "no heavy stack goes from entry_SYSCALL_64 down to the call's own function"


@dataclass(frozen=True)
class PerfNames:
    """What perf names along sysloop's stacks: nm's symbols of sysloop and the vmlinux."""

    user: dict[str, set[int]]
    kernel: dict[str, set[int]]

    def problem(self, stack: Stack) -> str | None:
        """Why `stack` is not drawn as perf draws sysloop (None: it is)."""
        users = [frame for frame in stack if is_user(frame)]
        kernels = list(stack[len(users) :])
        if any(is_user(frame) for frame in kernels) or not users:
            return "user frames are not all below the kernel's"
        if users[0].name != "_start" or any(f.name not in self.user for f in users):
            return "user frames other than nm's from _start"
        if any(frame.name not in self.kernel for frame in kernels):
            return "a kernel frame nm does not name"
        call = self.call_of(users)
        if call is None:
            if kernels and not kernels[0].name.startswith("asm_"):
                return "kernel frames over user code that made no call, not an interrupt entry"
            return None
        return self.kernel_problem(call, [frame.name for frame in kernels])

    def call_of(self, users: list[Frame]) -> str | None:
        """The C library call the user leaf is in, if its helper called it; checks the
        documented chain main -> sysloop_loop -> helper -> call's wrapper on the way."""
        names = [frame.name for frame in users]
        if "main" not in names:
            return None
        chain = names[names.index("main") :]
        helper = chain[len(USER_CHAIN)] if len(chain) > len(USER_CHAIN) else None
        assert tuple(chain[: len(USER_CHAIN)]) == USER_CHAIN[: len(chain)], chain
        if helper is None or len(chain) == len(USER_CHAIN) + 1:
            return None
        assert helper in CALLS and len(chain) == len(USER_CHAIN) + 2, chain
        wrapper, call = chain[-1], CALLS[helper]
        assert self.user[wrapper] & self.user[call], f"{wrapper} is not nm's {call}"
        return call

    def kernel_problem(self, call: str, names: list[str]) -> str | None:
        """Over the wrapper of `call`: entry_SYSCALL_64, do_syscall_64, the call's function."""
        rest = after_entry(names)
        if rest is None:
            return f"not entered through {' -> '.join(SYSCALL_ENTRY)}"
        if rest and rest[0] not in SYSCALL_WORK and not self.is_call_function(call, rest[0]):
            return f"{rest[0]} is neither {call}'s own function nor do_syscall_64's work"
        return None

    def is_call_function(self, call: str, name: str) -> bool:
        """`name` is where Linux's table sends `call` (nm's __x64_sys_CALL, or an alias of
        it) or the ksys_CALL that it hands over to."""
        targets = self.kernel.get(f"__x64_sys_{call}", set())
        targets |= self.kernel.get(f"ksys_{call}", set())
        return bool(self.kernel.get(name, set()) & targets)

    def reaches_the_call(self, stack: Stack) -> bool:
        users = [frame for frame in stack if is_user(frame)]
        call = self.call_of(users)
        rest = after_entry([frame.name for frame in stack[len(users) :]])
        if call is None or not rest:
            return False
        return self.is_call_function(call, rest[0])


def after_entry(names: list[str]) -> list[str] | None:
    """The kernel frames after the system-call entry (and 6.12's dispatch), None when
    `names` do not begin as the entry does (all of them may be the entry's first)."""
    entry = list(SYSCALL_ENTRY)
    if names[: len(entry)] != entry[: len(names)]:
        return None
    rest = names[len(entry) :]
    return rest[1:] if rest[:1] == [DISPATCH] else rest
