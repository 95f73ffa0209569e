"""Hostile `perf script` text (`record --host`): the reader returns host samples within
its bounds or raises HostProfileFailed, and the merge takes whatever it returned."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qmpprof.errors import HostProfileFailed
from qmpprof.host.merge import QemuThreads, merge
from qmpprof.host.perf_script import MAX_FRAMES, parse_samples
from tests.fuzz.budget import cases, counted

LISTING = (Path(__file__).parents[1] / "unit" / "data" / "host" / "perf_script.txt").read_text()
LOOKALIKE = "qemu-sytx 0123456789abcdef/.:()[]\t\n"
THREADS = QemuThreads(28961, "qemu-system-x86", {28964: (0,)})


def read_or_refuse(text: str) -> None:
    try:
        samples = list(parse_samples(text.splitlines(keepends=True)))
    except HostProfileFailed as error:
        assert "\n" not in str(error)
        return
    assert all(len(s.frames) <= MAX_FRAMES for s in samples)
    merged, split = merge(samples, THREADS, [], 0.0, 1.0)
    assert len(merged) == split.samples <= len(samples)


@settings(max_examples=cases(300))
@given(
    cut=st.tuples(st.floats(0, 1), st.integers(0, 300)),
    inserted=st.text(alphabet=LOOKALIKE, max_size=80) | st.text(max_size=40),
)
@counted
def test_perf_script_spliced(cut: tuple[float, int], inserted: str) -> None:
    start = int(cut[0] * len(LISTING))
    read_or_refuse(LISTING[:start] + inserted + LISTING[start + cut[1] :])


@settings(max_examples=cases(200))
@given(text=st.text(alphabet=LOOKALIKE, max_size=2000) | st.text(max_size=300))
@counted
def test_perf_script_random(text: str) -> None:
    read_or_refuse(text)
