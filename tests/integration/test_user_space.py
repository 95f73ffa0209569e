"""The example guest's user workload on two vCPUs: processes, user stacks, syscalls."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest_vm import Guest, running_guest
from tests.integration.conftest import record_folded
from tests.unit.conftest import build_elf

#: examples/guest/README.md: crunch 30 % of one CPU each, pulse 10 %, so of the time
#: processes run: 3/7, 3/7 and 1/7.
PROCESS_SHARES = {"crunch (1)": 3 / 7, "crunch (2)": 3 / 7, "pulse (3)": 1 / 7}
#: crunch's own chains: hash 50 %, sort 30 %, checksum (a system call) 20 %.
CRUNCH_CHAINS = {"crunch_hash": 0.5, "crunch_sort": 0.3, "crunch_checksum": 0.2}
TOLERANCE = 0.06
#: Under TCG `int $0x80` and `iretq` are slow and a stop lands at the syscall stub's first
#: instruction often (examples/guest/README.md): the checksum chain reads a few points high.
CHAIN_TOLERANCE = 0.08


@pytest.fixture(scope="module")
def user_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-us-") as name,
        running_guest(Path(name), "--accel", "tcg", "--workload", "user", "--smp", "2") as guest,
    ):
        yield guest


def record(guest: Guest, output: Path, *extra: str) -> tuple[str, list[tuple[list[str], int]]]:
    return record_folded(guest, output, 10, *extra)


def shares(counts: Counter[str]) -> dict[str, float]:
    total = sum(counts.values())
    return {key: count / total for key, count in counts.items()}


def caught_switching(frames: list[str]) -> bool:
    """A sample inside switch_context after switch_to set cpu_current to the next process
    but before the stack switch: the next process's label over the previous context's
    stack (examples/guest/README.md, "Call chains")."""
    return frames[-1] == "switch_context"


def test_processes_chains_and_user_stacks(user_guest: Guest, tmp_path: Path) -> None:
    assert user_guest.user_dir is not None
    out, stacks = record(user_guest, tmp_path / "p.folded", "--user-dir", str(user_guest.user_dir))
    assert "torn" not in out  # every return address follows a call in stop mode
    assert all(not frames[0].startswith("cr3:") for frames, _ in stacks), "unlabelled samples"
    processes: Counter[str] = Counter()
    chains: Counter[str] = Counter()
    for frames, count in stacks:
        if frames[0] in PROCESS_SHARES:
            processes[frames[0]] += count
            assert frames[1] == "_start" or caught_switching(frames), (
                f"user stack does not reach _start: {frames}"
            )
        if frames[0].startswith("crunch") and len(frames) > 3:
            # A few samples catch crunch between chunks (usys_sleep): not a chain of its own.
            chains[frames[3] if frames[3] in CRUNCH_CHAINS else "other"] += count
    print(f"\nprocess shares {shares(processes)}\ncrunch chain shares {shares(chains)}")
    for name, share in shares(processes).items():
        assert abs(share - PROCESS_SHARES[name]) < TOLERANCE, (name, share)
    chain_shares = shares(chains)
    assert chain_shares.pop("other", 0.0) < 0.05
    for name, share in chain_shares.items():
        assert abs(share - CRUNCH_CHAINS[name]) < CHAIN_TOLERANCE, (name, share)


def test_syscall_samples_show_kernel_frames_above_the_user_caller(
    user_guest: Guest, tmp_path: Path
) -> None:
    assert user_guest.user_dir is not None
    _, stacks = record(user_guest, tmp_path / "p.folded", "--user-dir", str(user_guest.user_dir))
    syscalls = [frames for frames, _ in stacks if "checksum_leaf" in frames]
    assert syscalls
    for frames in syscalls:
        user_part = frames[: frames.index("syscall_entry")]
        assert user_part[-1] == "usys_checksum" and user_part[1] == "_start"


def test_without_user_binaries_frames_are_addresses_and_the_summary_says_why(
    user_guest: Guest, tmp_path: Path
) -> None:
    out, stacks = record(user_guest, tmp_path / "p.folded")
    user_leaves = [
        frames[-1]
        for frames, _ in stacks
        if frames[0] in PROCESS_SHARES and frames[-1].startswith("0x")
    ]
    assert user_leaves, "user samples should be raw addresses"
    assert "unsymbolized user samples" in out and "no user binaries given" in out


def test_a_wrong_user_binary_never_names_frames(user_guest: Guest, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    build_elf("symbols.c", wrong, "-O2", "-g", "-static").rename(wrong / "crunch.elf")
    out, stacks = record(user_guest, tmp_path / "p.folded", "--user-dir", str(wrong))
    for frames, _ in stacks:
        if frames[0] in PROCESS_SHARES:
            user = [f for f in frames[1:] if not f.startswith("0x")]
            assert not {"leaf", "middle", "main"} & set(user), frames
    assert "no given binary matches address space" in out
