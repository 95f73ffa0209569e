"""`make demo` as the README has a newcomer run it (examples/demo.sh; 3 s instead of 10,
into a directory of the test's): the example guest and, with GUEST=linux, Debian's
kernel each end with a flame graph and the hottest stacks named from kernel to user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.guest_vm import ROOT


def run_demo(out: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DURATION": "3"}
    env |= {"DEMO_OUT": str(out), **environment}
    return subprocess.run(
        ["bash", str(ROOT / "examples" / "demo.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("guest", "expected"),
    [
        ("example", ("kernel_main",)),
        ("linux", ("do_syscall_64", "sysloop (", "main", "from guest memory")),
    ],
)
def test_the_demo_writes_a_flame_graph_and_prints_named_stacks(
    guest: str, expected: tuple[str, ...], tmp_path: Path
) -> None:
    done = run_demo(tmp_path / "demo", GUEST=guest, ACCEL="tcg")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "demo" / "flamegraph.svg").stat().st_size > 0
    assert (tmp_path / "demo" / "profile.folded").read_text().strip()
    for text in expected:
        assert text in done.stdout, done.stdout
    assert "not used:" not in done.stdout, done.stdout
