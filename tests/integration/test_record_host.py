"""`record --host` against real perf on a real QEMU (the example guest under TCG, two
vCPUs): one profile of QEMU's threads with the guest's stacks where its vCPU threads ran
guest code; perf missing or refused: one line, exit 1, no output."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest_vm import Guest, running_guest
from tests.integration.conftest import record_args, run_qmpprof

SVG = "{http://www.w3.org/2000/svg}"
_SPLIT = re.compile(
    r"vCPU threads on a host CPU ([\d.]+) s \(the kernel's schedstat: [\d.]+ s\): "
    r"guest ([\d.]+)% \(([\d.]+) s\), "
    r"QEMU user space ([\d.]+)% \(([\d.]+) s\), host kernel ([\d.]+)% \(([\d.]+) s\)"
)

PARANOID = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())

pytestmark = pytest.mark.skipif(shutil.which("perf") is None, reason="needs Linux perf")


@pytest.fixture(scope="module")
def two_vcpus() -> Iterator[Guest]:
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-host-") as name,
        running_guest(Path(name), "--accel", "tcg", "--smp", "2") as booted,
    ):
        yield booted


def vcpu_threads(guest: Guest) -> dict[int, int]:
    cpus = guest.qmp_call("query-cpus-fast")
    assert isinstance(cpus, list)
    return {int(cpu["thread-id"]): int(cpu["cpu-index"]) for cpu in cpus}


def test_vcpu_threads_hold_host_frames_and_the_guests_named_stacks(
    two_vcpus: Guest, tmp_path: Path
) -> None:
    folded, svg = tmp_path / "host.folded", tmp_path / "host.svg"
    args = record_args(two_vcpus.qmp, two_vcpus.kernel, 3, folded, "-o", str(svg), "--host")
    done = run_qmpprof(*args)
    assert done.returncode == 0, done.stderr
    split = _SPLIT.search(done.stdout)
    assert split is not None, done.stdout
    total, *parts = map(float, split.groups())
    shares, seconds = parts[0::2], parts[1::2]
    assert sum(shares) == pytest.approx(100, abs=0.2)
    assert sum(seconds) == pytest.approx(total, abs=0.02)
    pid = two_vcpus.pid
    stacks = [line.rsplit(" ", 1)[0].split(";") for line in folded.read_text().splitlines()]
    assert all(stack[0].endswith(f"({pid})") for stack in stacks)
    threads = vcpu_threads(two_vcpus)
    busy = f"vCPU 0 ({next(t for t, i in threads.items() if i == 0)})"
    guest = [s for s in stacks if s[1] == busy and s[2] == "[guest]"]
    assert any("physics_leaf" in s and s[3] == "[kernel]" for s in guest)
    host = [s for s in stacks if s[1] == busy and "[guest]" not in s]
    assert host, "the busy vCPU thread spent no time in QEMU or the host kernel"
    assert any(s[1].startswith("thread ") for s in stacks)  # QEMU's other threads
    names = {g.attrib["data-n"] for g in ET.parse(svg).iter(f"{SVG}g") if "data-n" in g.attrib}
    assert {busy, "[guest]", "physics_leaf"} <= names
    assert two_vcpus.status() == "running"


def test_no_perf_is_one_line_and_no_output(two_vcpus: Guest, tmp_path: Path) -> None:
    output = tmp_path / "none.folded"
    args = record_args(two_vcpus.qmp, two_vcpus.kernel, 1, output, "--host")
    missing = run_qmpprof(*args, env={"PATH": str(tmp_path)})
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert "--host needs Linux perf, which is not installed" in missing.stderr
    assert not output.exists()
    assert two_vcpus.status() == "running"


@pytest.mark.skipif(PARANOID < 2, reason="perf_event_paranoid below 2 lets anyone record")
def test_perf_refused_is_one_line_and_no_output(two_vcpus: Guest, tmp_path: Path) -> None:
    output = tmp_path / "none.folded"
    args = record_args(two_vcpus.qmp, two_vcpus.kernel, 1, output, "--host")
    # uid 0 without capabilities: perf_event_paranoid applies to it as to any user (and
    # /proc/PID/mem may be refused to it: the monitor reads memory instead, silently)
    args.extend(["--memory", "hmp"])
    no_capabilities = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    refused = subprocess.run(
        [
            *no_capabilities,
            "--securebits=+noroot,+noroot_locked",
            sys.executable,
            "-m",
            "qmpprof",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("qmpprof: error: perf did not start recording: not permitted")
    assert not output.exists()
    assert two_vcpus.status() == "running"
