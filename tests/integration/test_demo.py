"""`make demo` as the README has a newcomer run it (examples/demo.sh; 3 s instead of 10,
into a directory of the test's): the example guest and, with GUEST=linux, Debian's
kernel each end with a flame graph and the hottest stacks named from kernel to user.
The Linux demo fetches what it boots only (fetch.sh --demo): no debug package, one libc."""

from __future__ import annotations

import os
import re
import shutil
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


FETCH = ROOT / "examples" / "linux" / "fetch.sh"


def test_the_linux_demo_fetches_the_kernel_image_and_libc6_only(tmp_path: Path) -> None:
    """fetch.sh --demo and --demo --libc, as boot.sh --demo runs them for `GUEST=linux make
    demo`, against a cache holding every .deb the tests fetched (links to the real cache's:
    -dbg packages, the second libc): they use the default kernel's linux-image-ABI-unsigned
    and libc6 alone, extract no debug vmlinux and no libc6-dbg, and name no second libc.
    apt's downloads go to a closed port, so a package asked for that is not cached fails
    the test (its name in fetch.sh's "downloading" line) instead of fetching a gigabyte."""
    cache = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof"))
    listed = subprocess.run(["bash", str(FETCH), "--list"], capture_output=True, text=True)
    abi = listed.stdout.split()[0]
    debs = sorted((cache / "debian").glob("*.deb"))
    names = {deb.name.split("_")[0] for deb in debs}
    if not {f"linux-image-{abi}-unsigned", "libc6"} <= names:
        pytest.skip(f"no linux-image-{abi}-unsigned or libc6 .deb in {cache} (make demo)")
    madison = ["apt-cache", "madison", "libc6"]
    if shutil.which("apt-cache") is None or not subprocess.run(madison, capture_output=True).stdout:
        pytest.skip("apt's package lists know no libc6")
    seeded = tmp_path / "cache"
    (seeded / "debian").mkdir(parents=True)
    for deb in debs:
        (seeded / "debian" / deb.name).symlink_to(deb)
    env = {key: value for key, value in os.environ.items() if key != "KERNEL_ABI"}
    env |= {"QMPPROF_CACHE": str(seeded), "http_proxy": "http://127.0.0.1:9"}
    used: list[str] = []
    lines: dict[str, str] = {}
    for arguments in (["--demo"], ["--demo", "--libc"]):
        done = subprocess.run(
            ["bash", str(FETCH), *arguments], capture_output=True, text=True, env=env, timeout=300
        )
        assert "downloading" not in done.stderr, done.stderr
        assert done.returncode == 0, done.stderr
        used += re.findall(r"([^ /]+\.deb)$", done.stderr, re.MULTILINE)
        lines |= dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert sorted(deb.split("_")[0] for deb in used) == ["libc6", f"linux-image-{abi}-unsigned"]
    assert lines["abi"] == abi and lines["vmlinux"] == "" and Path(lines["vmlinuz"]).is_file()
    assert not (seeded / "linux" / abi / "vmlinux").exists()
    assert lines["other_libc"] == lines["other_version"] == ""
    libc = Path(lines["libc"])
    assert [path.name for path in (seeded / "sysroot").iterdir()] == [libc.name]
    assert libc.name == f"libc6-nodbg_{lines['version']}"
    assert (libc / "lib" / "x86_64-linux-gnu" / "libc.so.6").exists()
    assert not (libc / "usr" / "lib" / "debug").exists()
