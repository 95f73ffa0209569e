"""`qmpprof record` against the example guest, run as a user runs it."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Guest, record_args, record_folded

#: The guest's documented chains (examples/guest/README.md), heaviest first, root first.
CHAINS = [
    "kernel_entry;kernel_main;workload_loop;run_physics;physics_step;"
    "physics_compute_forces;physics_leaf",
    "kernel_entry;kernel_main;workload_loop;run_render;render_frame;render_draw_scene;"
    "render_rasterize;render_leaf",
    "kernel_entry;kernel_main;workload_loop;run_audio;audio_mix;audio_leaf",
]
ENTRY = "kernel_entry"
_ACCOUNTING = re.compile(
    r"^(\d+) ticks .*; requested (\d+), late \d+, missed (\d+), failed (\d+)", re.MULTILINE
)


def folded(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines()
    return [(stack, int(count)) for stack, count in (line.rsplit(" ", 1) for line in lines)]


def test_ten_seconds_give_the_documented_chains_in_order(guest: Guest, workdir: Path) -> None:
    out, recorded = record_folded(guest, workdir / "p.folded", 10)
    # Every slot of the schedule is accounted for (how many ticks a loaded host manages
    # is bench/'s business, not a test's).
    counts = _ACCOUNTING.search(out)
    assert counts is not None, out
    ticks, requested, missed, failed = map(int, counts.groups())
    others = sum(int(n) for n in re.findall(r"(\d+) ticks (?:skipped|abandoned)", out))
    assert ticks > 0 and requested == ticks + missed + failed + others, out
    assert "torn" not in out  # a paused VM's stacks are consistent
    stacks = [(frames[0], ";".join(frames[1:])) for frames, _ in recorded]
    assert [chain for _, chain in stacks[:3]] == CHAINS
    assert all(chain.split(";")[0] == ENTRY for _, chain in stacks)
    assert guest.status() == "running"


def start_record(guest: Guest, output: Path) -> subprocess.Popen[str]:
    """Start a long recording and return once it says it is recording."""
    process = subprocess.Popen(
        [sys.executable, "-m", "qmpprof", *record_args(guest.qmp, guest.kernel, 300, output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], 60)
    assert ready, "qmpprof did not start recording"
    assert process.stderr.readline().startswith("recording ")
    return process


def test_ctrl_c_writes_what_was_collected_and_leaves_the_vm_running(
    guest: Guest, workdir: Path
) -> None:
    output = workdir / "p.folded"
    process = start_record(guest, output)
    wait_for_progress(process)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "interrupted" in stdout
    assert sum(count for _, count in folded(output)) > 0
    assert guest.status() == "running"


def wait_for_progress(process: subprocess.Popen[str]) -> None:
    """Block until qmpprof reports a progress line with samples taken."""
    assert process.stderr is not None
    for _ in range(120):
        ready, _, _ = select.select([process.stderr], [], [], 60)
        assert ready, "no progress line from qmpprof"
        line = process.stderr.readline()
        if line.startswith("progress: ") and not line.startswith("progress: 0 samples"):
            return
    raise AssertionError("qmpprof reported no samples")


def test_qemu_exiting_during_a_record_keeps_the_profile(guest: Guest, workdir: Path) -> None:
    output = workdir / "p.folded"
    process = start_record(guest, output)
    wait_for_progress(process)
    subprocess.run(["kill", "-KILL", str(guest.pid)], check=True)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "QEMU exited" in stdout
    assert sum(count for _, count in folded(output)) > 0
