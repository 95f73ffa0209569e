"""record/capture.py against QMP exchanges recorded from the example guest (user workload,
two vCPUs) and replayed byte for byte, with qmpprof's HMP memory backend: no QEMU runs.

While the exchanges were recorded, GDB held the VM stopped where one vCPU ran kernel
code entered from pulse's user code (the timer interrupt, or a system call) and the
other user code; its backtrace of each vCPU and the process `cpu_current` named for it
are the oracle (data/qmp/capture_user.gdb.json). Re-record with
tests/unit/data/qmp/record_capture.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import qmpprof.record.capture as capture
from qmpprof.analysis import Analyzer
from qmpprof.model import CapturedSample, Process, StopReason
from qmpprof.record.capture import CaptureConfig, Capturer
from qmpprof.target import qmp
from qmpprof.target.memory import HmpMemory
from qmpprof.target.qmp import QmpSession
from tests.unit.data.qmp import guest_setup
from tests.unit.data.qmp.guest_setup import CAPTURE, USER_END
from tests.unit.qmp_replay import RECORDINGS, Replay, recorded, serve
from tests.unit.test_qmp_replay import PATIENT_S, spoke_as_recorded

#: GDB's name for the frame an interrupt or a system call entered the kernel through.
SIGNAL_FRAME = "<signal handler called>"


@pytest.fixture(scope="module")
def analyzer() -> Iterator[Analyzer]:
    guest_setup.built_guest()
    check_same_build(oracle())
    yield guest_setup.guest_analyzer()


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake QEMU answers at once: only a host too busy to run us could time out."""
    monkeypatch.setattr(qmp, "COMMAND_TIMEOUT_S", PATIENT_S)


@functools.cache
def oracle() -> dict[str, Any]:
    """What GDB said of each vCPU, by its number as a string."""
    recorded: dict[str, dict[str, Any]] = json.loads(
        (RECORDINGS / "capture_user.gdb.json").read_text()
    )
    return recorded["vcpus"]


def gdb_frames(vcpu: int) -> list[tuple[int, str]]:
    """GDB's frames of `vcpu` (address, function), leaf first. GDB lists an inlined call
    above its caller at the same address; the physical frame is named after the caller."""
    frames: list[tuple[int, str]] = []
    for address, function in oracle()[str(vcpu)]["frames"]:
        if frames and frames[-1][0] == address:
            frames.pop()
        frames.append((address, function))
    return frames


def in_user_code() -> int:
    """The vCPU that GDB saw in user code."""
    return next(int(n) for n, view in oracle().items() if view["frames"][0][0] < USER_END)


def over_user_code() -> int:
    """The vCPU that GDB saw in kernel code entered from user code."""
    return 1 - in_user_code()


def gdb_process(vcpu: int) -> Process:
    view = oracle()[str(vcpu)]
    return Process(int(view["pid"]), view["name"])


@functools.cache
def nm_functions(elf: Path) -> list[tuple[int, str]]:
    """The function symbols of `elf` as binutils' nm lists them, by address."""
    listing = subprocess.run(["nm", "-n", str(elf)], capture_output=True, text=True, check=True)
    return [
        (int(fields[0], 16), fields[2])
        for fields in (line.split() for line in listing.stdout.splitlines())
        if len(fields) == 3 and fields[1] in "tT"
    ]


def nm_address(elf: Path, symbol: str) -> int:
    listing = subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True)
    lines = listing.stdout.splitlines()
    return next(int(line.split()[0], 16) for line in lines if line.endswith(f" {symbol}"))


def named_by_nm(functions: list[tuple[int, str]], address: int) -> str | None:
    before = [name for start, name in functions if start <= address]
    return before[-1] if before else None


def check_same_build(vcpus: dict[str, Any]) -> None:
    """The binaries here name GDB's frames as the ones the recording ran did (a rebuild
    with another compiler would move them): nm's function at each frame is GDB's."""
    for view in vcpus.values():
        previous = SIGNAL_FRAME  # the leaf, like an interrupted frame, is no return address
        for address, function in view["frames"]:
            elf = guest_setup.KERNEL
            if address < USER_END:
                elf = guest_setup.USER_DIR / f"{view['program']}.elf"
            inside = address if previous == SIGNAL_FRAME else address - 1  # in the call
            if function != SIGNAL_FRAME and named_by_nm(nm_functions(elf), inside) != function:
                pytest.fail(f"{elf} is not the build recorded: re-record (record_capture.py)")
            previous = function


@contextlib.asynccontextmanager
async def replay_session(replay: Replay) -> AsyncIterator[QmpSession]:
    """A session with a fake QEMU that replays `replay`, closed with it on the way out."""
    with tempfile.TemporaryDirectory(prefix="qmprep-") as work:  # unix paths are short
        path = Path(work) / "qmp.sock"
        server = await serve(path, replay)
        try:
            session = await QmpSession.connect(str(path), timeout=PATIENT_S)
            try:
                yield session
            finally:
                await session.close()
        finally:
            server.close()


async def captured(
    analyzer: Analyzer, name: str, config: CaptureConfig = CAPTURE
) -> list[CapturedSample]:
    replay = Replay(recorded(name))
    async with replay_session(replay) as session:
        samples = await Capturer(session, HmpMemory(session), analyzer, config).capture()
    spoke_as_recorded(replay)
    return samples


def addresses(sample: CapturedSample) -> list[int]:
    return [frame.address for frame in sample.stack.frames]


def kernel_part(vcpu: int) -> list[int]:
    """GDB's frames of `vcpu` up to its first user frame (the interrupted instruction)."""
    frames = [address for address, _ in gdb_frames(vcpu)]
    first_user = next(i for i, address in enumerate(frames) if address < USER_END)
    return frames[: first_user + 1]


async def test_one_sample_per_vcpu_with_the_registers_gdb_saw(analyzer: Analyzer) -> None:
    samples = await captured(analyzer, "capture_user")
    assert [s.raw.vcpu for s in samples] == [0, 1]
    for sample in samples:
        assert sample.raw.error is None
        assert sample.raw.registers.rip == gdb_frames(sample.raw.vcpu)[0][0]


async def test_kernel_code_over_user_code_is_unwound_into_the_user_stack(
    analyzer: Analyzer,
) -> None:
    """The kernel stack is read first, then the user stack in an extra window; the
    frames agree with GDB's, names included."""
    vcpu = over_user_code()
    sample = (await captured(analyzer, "capture_user"))[vcpu]
    gdb = gdb_frames(vcpu)
    ours = addresses(sample)
    assert len(ours) > len(kernel_part(vcpu)) > 1
    assert ours == [address for address, _ in gdb[: len(ours)]]
    assert any(window.base < USER_END for window in sample.raw.windows[1:])
    named = analyzer.symbolize(sample).frames
    for (_, function), frame in zip(gdb, named, strict=False):
        if frame.address.address >= USER_END and function != SIGNAL_FRAME:
            assert frame.function == function


async def test_the_process_is_read_in_an_extra_window_where_nm_puts_cpu_current(
    analyzer: Analyzer,
) -> None:
    vcpu = in_user_code()
    sample = (await captured(analyzer, "capture_user"))[vcpu]
    assert sample.process == gdb_process(vcpu)
    cpu_current = nm_address(guest_setup.KERNEL, "cpu_current") + 8 * vcpu
    (extra,) = sample.raw.windows[1:]
    assert extra.base <= cpu_current < extra.end


async def test_user_code_is_unwound_with_its_program_as_gdb_does(analyzer: Analyzer) -> None:
    samples = await captured(analyzer, "capture_user")
    for sample in samples:
        assert sample.raw.user_module == oracle()[str(sample.raw.vcpu)]["program"]
        assert addresses(sample) == [address for address, _ in gdb_frames(sample.raw.vcpu)]


async def test_the_interrupted_vcpu_has_its_process(analyzer: Analyzer) -> None:
    vcpu = over_user_code()
    sample = (await captured(analyzer, "capture_user"))[vcpu]
    assert sample.process == gdb_process(vcpu)


async def test_cpus_selects_the_vcpus_captured(analyzer: Analyzer) -> None:
    vcpu = in_user_code()
    config = CaptureConfig(CAPTURE.stack_bytes, cpus=(vcpu,))
    (sample,) = await captured(analyzer, "capture_one_vcpu", config)
    assert sample.raw.vcpu == vcpu
    assert sample.process == gdb_process(vcpu)
    assert addresses(sample)[0] == gdb_frames(vcpu)[0][0]


async def test_no_window_beyond_max_extra_windows(
    analyzer: Analyzer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no extra window allowed, each sample keeps its first window: the interrupted
    vCPU's unwind stops at the user stack it would have read next, and no process is
    known (the adapter's memory is never read)."""
    monkeypatch.setattr(capture, "MAX_EXTRA_WINDOWS", 0)
    samples = await captured(analyzer, "capture_no_extra_window")
    assert [len(s.raw.windows) for s in samples] == [1, 1]
    assert [s.process for s in samples] == [None, None]
    interrupted = samples[over_user_code()]
    assert addresses(interrupted) == kernel_part(over_user_code())
    assert interrupted.stack.stop is StopReason.FAULT
    fault = interrupted.stack.fault_address
    assert fault is not None and fault < USER_END


async def test_a_vcpu_not_in_long_mode_is_not_read(analyzer: Analyzer) -> None:
    """QEMU held at the reset vector: every vCPU in 16-bit real mode, at IP 0xfff0 of a
    code segment based at 0xffff0000 (where an x86 CPU starts after reset): its pc is
    the linear 0xfffffff0; no memory is asked for (the replay checks it)."""
    samples = await captured(analyzer, "capture_at_reset")
    assert [s.raw.vcpu for s in samples] == [0, 1]
    for sample in samples:
        assert sample.raw.error == "vCPU in 16-bit segmented code: stack not read"
        assert sample.raw.windows == ()
        assert addresses(sample) == [0xFFFF_FFF0]
        assert sample.stack.stop is StopReason.NO_STACK
