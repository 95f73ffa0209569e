"""`record --host`'s pure half on real bytes: perf script's listing of a TCG QEMU (the
example guest, 2 vCPUs, vCPU 0 busy; `perf record -k CLOCK_MONOTONIC -e cpu-clock -c
4000000 --call-graph dwarf,8192 -p PID`, trimmed to 40 samples in generated code and every
other), read and merged with guest samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmpprof.errors import HostProfileFailed
from qmpprof.host.merge import GUEST_FRAME, NOT_SAMPLED, HostPart, QemuThreads, merge, part_of
from qmpprof.host.perf_script import HostSample, parse_samples
from qmpprof.model import (
    Frame,
    FrameAddress,
    FrameKind,
    Mode,
    Process,
    Recording,
    Sample,
    StopReason,
)
from qmpprof.output.flamegraph import build_tree
from qmpprof.output.speedscope import speedscope_document
from qmpprof.profile import Scope

LISTING = Path(__file__).parent / "data" / "host" / "perf_script.txt"
QEMU_PID, VCPU0_THREAD, PERIOD = 28961, 28964, 4_000_000
THREADS = QemuThreads(QEMU_PID, "qemu-system-x86", {VCPU0_THREAD: (0,), 28965: (1,)})
#: What a plain reading of the text says (a header per sample, a tab before each frame).
LINES = LISTING.read_text().splitlines()
HEADERS = [line for line in LINES if line and not line.startswith("\t")]
FRAME_LINES = [line for line in LINES if line.startswith("\t")]
RECORDING = Recording(started=0.0, duration_s=1.0, period_s=PERIOD / 1e9, qmp_socket="qmp")


def host_samples() -> list[HostSample]:
    return list(parse_samples(LISTING.open()))


def guest_sample(time: float, leaf: str) -> Sample:
    frames = tuple(
        Frame(FrameAddress(0xFFFF_FFFF_8010_0000 + i, FrameKind.INSTRUCTION), name, 0, "k.elf")
        for i, name in enumerate((leaf, "kernel_main"))
    )
    return Sample(
        time, 0, Mode.KERNEL, frames, StopReason.END_OF_STACK, 0, Process(None, "[kernel]")
    )


def test_every_sample_and_frame_of_the_listing_is_read() -> None:
    samples = host_samples()
    assert len(samples) == len(HEADERS) == 49
    assert sum(len(s.frames) for s in samples) == len(FRAME_LINES)
    assert {(s.pid, s.tid) for s in samples} == {(QEMU_PID, QEMU_PID), (QEMU_PID, VCPU0_THREAD)}
    assert all(s.comm == "qemu-system-x86" and s.period == PERIOD for s in samples)
    main = next(s for s in samples if s.tid == QEMU_PID and len(s.frames) == 12)
    assert [f.symbol for f in main.frames][:2] == ["do_sys_poll", "__x64_sys_ppoll"]
    assert (
        main.frames[0].address == 0xFFFFFFFF816D9E3D and main.frames[0].dso == "[kernel.kallsyms]"
    )
    assert (main.frames[-1].symbol, main.frames[-1].dso) == (
        "_start",
        "/usr/bin/qemu-system-x86_64",
    )


def test_generated_code_is_the_guest_and_the_leaf_decides_the_rest() -> None:
    parts = [part_of(s.frames) for s in host_samples()]
    jit_leaves = sum("/tmp/perf-28961.map" in LINES[LINES.index(h) + 1] for h in HEADERS)
    assert parts.count(HostPart.GUEST) == jit_leaves == 40
    assert parts.count(HostPart.HOST_KERNEL) == 5 and parts.count(HostPart.QEMU) == 4


def test_guest_code_takes_the_nearest_guest_sample_of_its_vcpu() -> None:
    samples = host_samples()
    jit = [s for s in samples if part_of(s.frames) is HostPart.GUEST]
    offset = 1000.0  # the guest's clock, ahead of perf's
    early, late = jit[0].time_s + offset, jit[-1].time_s + offset
    guest = [guest_sample(early, "early_leaf"), guest_sample(late, "late_leaf")]
    merged, split = merge(samples, THREADS, guest, offset, within_s=1e6)
    assert len(merged) == split.samples == 49
    assert split.vcpu_ns[HostPart.GUEST] == 40 * PERIOD and split.unmatched == 0
    assert sum(split.vcpu_ns.values()) + split.other_ns == 49 * PERIOD
    first = next(m for m in merged if m.time == early)
    assert [f.label() for f in first.frames] == [
        "early_leaf",
        "kernel_main",
        "[kernel]",
        GUEST_FRAME,
    ]
    last = next(m for m in merged if m.time == late)
    assert last.frames[0].label() == "late_leaf"
    assert first.process == Process(QEMU_PID, "qemu-system-x86", VCPU0_THREAD, "vCPU 0")
    assert first.vcpu == 0 and first.process.thread_label() == "vCPU 0 (28964)"
    main_thread = [m for m in merged if m.process is not None and m.process.tid == QEMU_PID]
    assert len(main_thread) == 4 and all(m.vcpu == -1 for m in main_thread)
    assert split.other_ns == 4 * PERIOD
    assert "guest 88.9%" in split.describe()  # 40 of the vCPU thread's 45 samples


def test_guest_code_far_from_any_guest_sample_says_so() -> None:
    merged, split = merge(host_samples(), THREADS, [], 0.0, within_s=0.01)
    assert split.unmatched == 40
    unmatched = [m for m in merged if m.frames and m.frames[0].label() == NOT_SAMPLED]
    assert len(unmatched) == 40 and all(m.frames[1].label() == GUEST_FRAME for m in unmatched)


def test_another_process_in_the_listing_is_left_out() -> None:
    merged, split = merge(host_samples(), QemuThreads(1, "other", {}), [], 0.0, 1.0)
    assert merged == [] and split.samples == 0


@pytest.mark.parametrize(
    "text",
    [
        "\t    7fa5 [unknown] (/tmp/perf-1.map)\n",  # a frame before any sample
        "not perf at all\n",
        "qemu 1/2 3.4: 5\n\tnot a frame\n",
        "x" * 70_000 + "\n",
    ],
)
def test_text_that_is_not_perf_script_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(HostProfileFailed) as raised:
        list(parse_samples(text.splitlines(keepends=True)))
    assert "\n" not in str(raised.value)


def test_every_format_names_the_qemu_threads() -> None:
    """speedscope's profiles and the flame graph's levels name a vCPU thread by its vCPU."""
    merged, _ = merge(host_samples(), THREADS, [], 0.0, within_s=1.0)
    document = speedscope_document(merged, RECORDING, Scope.ALL, include_idle=False)
    names = {profile["name"] for profile in document["profiles"]}
    assert names == {
        "qemu-system-x86 (28961), vCPU 0 (28964)",
        "qemu-system-x86 (28961)",  # the main thread
    }
    tree = build_tree(merged, Scope.ALL, include_idle=False)
    (process,) = tree.children.values()
    assert {child.name for child in process.children.values()} == {"vCPU 0 (28964)", "thread 28961"}
