"""Record the samples tests/unit/saved_samples.py loads: `python -m
tests.unit.data.samples.record` (from the repository root, after `make guest`).

It boots the example guest on two vCPUs running its user workload (tests/guest_vm.py),
records it with `qmpprof record` into a capture, analyses the capture with the same
kernel and user ELFs, and saves every sample as example_user.jsonl beside this file.
Re-record when the example guest changes; the snapshot tests that draw from it then
need their golden files regenerated and reviewed (tests/unit/test_snapshots.py).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.model import Sample
from qmpprof.record.qmpcap import read_capture
from tests.guest_vm import Guest, running_guest
from tests.unit.saved_samples import save_samples

DURATION_S, RATE_HZ = "1.5", "40"


def capture(guest: Guest, path: Path) -> None:
    assert guest.user_dir is not None
    command = [sys.executable, "-m", "qmpprof", "record", "--qmp-socket", guest.qmp]
    command += ["--kernel", str(guest.kernel), "--user-dir", str(guest.user_dir)]
    command += ["--duration", DURATION_S, "--rate", RATE_HZ, "-o", str(path)]
    subprocess.run(command, check=True, timeout=120)


def analysed(path: Path, kernel: Path, user_dir: Path) -> list[Sample]:
    options = TargetOptions(qmp_socket="", kernel=kernel, user_dirs=(user_dir,))
    analyzer = build_analyzer(options)
    with read_capture(path) as opened:
        return [analyzer.symbolize(e) for e in opened.samples()]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="qmpsamples-") as work:
        with running_guest(Path(work), "--smp", "2", "--workload", "user") as guest:
            path = Path(work) / "example.qmpcap"
            capture(guest, path)
        assert guest.user_dir is not None
        samples = analysed(path, guest.kernel, guest.user_dir)
    save_samples("example_user", samples)
    print(f"saved {len(samples)} samples")


if __name__ == "__main__":
    main()
