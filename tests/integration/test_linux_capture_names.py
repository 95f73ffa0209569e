"""A capture of the Linux example guest recorded with no kernel file (the kernel's
symbols, ORC and BTF read from its memory, its programs' files from its page cache)
reports, in a fresh environment (another HOME: no cache of the recording's), the
recording's own folded stacks: from the recorded addresses, and with --reunwind from the
memory the capture kept. report has no guest memory: the names, the process of each
sample and the frames it cannot unwind again (no ORC, no copy of the guest's files)
come from the capture. The recorded kernel names are checked against an oracle nobody
here wrote: nm of the debug vmlinux, at the address less the slide the guest reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from qmpprof.model import KERNEL_HALF
from qmpprof.record.qmpcap import read_capture
from tests.elf_tools import nm_functions, nm_names_at
from tests.integration.conftest import run_cached, run_qmpprof
from tests.linux_vm import LinuxGuest, kernel_abis, kernel_slide, nm_symbols, running_linux

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def linux(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    workdir = tmp_path_factory.mktemp("linux-capture-names")
    with running_linux(
        workdir, "--smp", "2", "--workloads", "crunch,sysloop,pinned,dynwork", abi=kernel_abis()[0]
    ) as guest:
        yield guest


def test_report_names_the_kernel_frames_as_the_recording_did(
    linux: LinuxGuest, tmp_path: Path
) -> None:
    capture, live = tmp_path / "run.qmpcap", tmp_path / "live.folded"
    done = run_cached(
        "--qmp-socket", linux.qmp, "--duration", "10", "-o", str(capture), "-o", str(live),
        "-o", str(tmp_path / "live.svg"), "--capture-memory",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "from guest memory" in done.stderr, done.stderr
    recorded = sorted(live.read_text().splitlines())
    assert any("do_syscall_64" in line for line in recorded)  # kernel frames, named
    fresh = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "home")}
    for extra in ((), ("--reunwind",)):
        replayed = tmp_path / f"replayed{len(extra)}.folded"
        done = run_qmpprof("report", str(capture), "-o", str(replayed), *extra, env=fresh)
        assert done.returncode == 0, done.stderr
        assert sorted(replayed.read_text().splitlines()) == recorded, extra
    done = run_qmpprof("report", str(capture), "-o", str(tmp_path / "report.svg"), env=fresh)
    assert done.returncode == 0, done.stderr
    assert_kernel_names_are_nm_s(linux, capture)
    # The flame graphs' titles name the kernel the guest booted (Debian's ABI is its
    # `uname -r`), live and in the report: not "no kernel symbols".
    for graph in (tmp_path / "live.svg", tmp_path / "report.svg"):
        assert f"{kernel_abis()[0]} (from guest memory)" in graph.read_text(), graph


def assert_kernel_names_are_nm_s(guest: LinuxGuest, capture: Path) -> None:
    """Each kernel frame the capture names inside a function nm sizes, named as nm names
    its link address: that function, or a symbol nm lists inside it below the address
    (kallsyms names assembly labels too: entry_SYSCALL_64_after_hwframe)."""
    functions, symbols = nm_functions(guest.kernel), nm_symbols(guest.kernel)
    slide = kernel_slide(guest)
    checked = 0
    with read_capture(capture) as opened:
        for sample in opened.samples():
            for frame, name in zip(sample.stack.frames, sample.names, strict=False):
                if name is None or frame.address < KERNEL_HALF or name.module != "vmlinux":
                    continue
                truth = nm_names_at(functions, frame.lookup_address - slide)
                if not truth:
                    continue
                linked = frame.lookup_address - slide
                start = min(at for at, size, function in functions if function in truth
                            and at <= linked < at + size)  # fmt: skip
                inside = any(start <= at <= linked for at in symbols.get(name.function, ()))
                assert name.function in truth or inside, (hex(frame.address), name, truth)
                checked += 1
    assert checked > 100
