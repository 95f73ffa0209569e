"""Issue 16's acceptance on the Linux guest running dynwork (a PIE calling into libc and
libqmpwork.so.1), KASLR and ASLR on, as a user runs qmpprof: with the wrong libc in the
sysroot, with no sysroot, and the pprof a recording writes, read by `go tool pprof`.

Bookworm's 6.1 only: the process maps are read the same way on 6.12
(test_linux_maps.py), and so are the files found from them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.elf_tools import build_id_of
from tests.guest_vm import qmp_call
from tests.integration.conftest import record_args, run_cached
from tests.integration.gdb_mi import same_function, text_aliases
from tests.linux_vm import LinuxGuest, guest_sysroot, other_libc_sysroot, running_linux

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
#: Functions of libc that dynwork's samples run in (qsort's merge sort, memcpy's and
#: snprintf's implementations, the start code): a wrong libc must name none of them.
LIBC_FUNCTIONS = (
    "msort_with_tmp",
    "__qsort_r",
    "__libc_start_call_main",
    "__memcpy_sse2_unaligned_erms",
    "__memmove_sse2_unaligned_erms",
    "__vfprintf_internal",
)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinuxGuest]:
    workdir = tmp_path_factory.mktemp("linux-sysroot")
    with running_linux(workdir, "--smp", "2", "--workloads", "dynwork") as booted:
        yield booted


def build_id(path: Path) -> str:
    return build_id_of(path).hex()


def record(guest: LinuxGuest, output: Path, *extra: str) -> str:
    done = run_cached(*record_args(guest.qmp, guest.kernel, 3, output, *extra))
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_a_wrong_libc_is_reported_and_names_nothing(guest: LinuxGuest, tmp_path: Path) -> None:
    other = other_libc_sysroot(guest)
    if other is None:
        pytest.skip("the package archive offers one version of libc6 only")
    folded = tmp_path / "p.folded"
    out = record(guest, folded, "--sysroot", str(other))
    said = next((line for line in out.splitlines() if line.startswith(f"{LIBC}: not used")), "")
    assert build_id(other / LIBC.lstrip("/")) in said, out
    assert build_id(guest_sysroot(guest) / LIBC.lstrip("/")) in said, out
    frames = {
        f for line in folded.read_text().splitlines() for f in line.rsplit(" ", 1)[0].split(";")
    }
    assert any(f.startswith("libc.so.6+0x") for f in frames), sorted(frames)
    named_from_libc = {f for f in frames if f.split(".part")[0] in LIBC_FUNCTIONS}
    assert not named_from_libc, named_from_libc
    assert "compare_keys" in frames  # dynwork's own file is the guest's: still named


def dumps_of_one_pause(guest: LinuxGuest) -> tuple[dict[str, Any], dict[str, Any]]:
    """`dump --json` without, then with, the sysroot, of the same paused guest."""
    qmp_call(guest.qmp, "stop")
    try:
        base = ["dump", "--json", "--qmp-socket", guest.qmp, "--kernel", str(guest.kernel)]
        bare, full = (
            run_cached(*base, *extra) for extra in ([], ["--sysroot", str(guest_sysroot(guest))])
        )
        assert bare.returncode == 0 and full.returncode == 0, bare.stderr + full.stderr
        return json.loads(bare.stdout), json.loads(full.stdout)
    finally:
        qmp_call(guest.qmp, "cont")


def user_frames(dump: dict[str, Any], vcpu: int) -> list[dict[str, Any]]:
    vcpus = dump["vcpus"]
    assert isinstance(vcpus, list)
    frames = next(v["frames"] for v in vcpus if v["vcpu"] == vcpu)
    return [f for f in frames if int(f["address"], 16) < 1 << 47 and not f["inlined"]]


def library_aliases(sysroot: Path) -> dict[str, str]:
    """One name per address of each library of the sysroot with its debug file (found by
    build-id), so that a name from the guest's .dynsym and one from the debug file for
    the same address count as one."""
    debug_files = {
        path.parent.name + path.stem: path
        for path in (sysroot / "usr/lib/debug/.build-id").glob("*/*.debug")
    }
    aliases: dict[str, str] = {}
    for library in sysroot.glob("lib/x86_64-linux-gnu/*.so*"):
        debug = debug_files.get(build_id(library))
        aliases.update(text_aliases(library, *([debug] if debug else [])))
    return aliases


def test_without_a_sysroot_user_frames_are_files_and_offsets_never_wrong_names(
    guest: LinuxGuest,
) -> None:
    aliases = library_aliases(guest_sysroot(guest))
    files = {"dynwork", "libc.so.6", "libqmpwork.so.1", "ld-linux-x86-64.so.2"}
    compared = 0
    for _ in range(8):
        bare, full = dumps_of_one_pause(guest)
        for vcpu in (0, 1):
            without, with_sysroot = user_frames(bare, vcpu), user_frames(full, vcpu)
            if not with_sysroot or with_sysroot[-1]["function"] != "_start":
                continue  # not dynwork in user code (the other vCPU idles)
            compared += 1
            assert without[0]["address"] == with_sysroot[0]["address"]
            assert without[0]["module"] in files, without[0]
            for frame, truth in zip(without, with_sysroot, strict=False):
                if frame["address"] != truth["address"]:
                    break  # the unwind without the files went astray: no truth below
                name = frame["function"]
                if name is not None:  # named from what the guest loaded: the same function
                    assert same_function(name, aliases) == same_function(truth["function"], aliases)
    assert compared, "dynwork was never seen in user code"


def test_pprof_names_libc_with_its_mapping_path_and_build_id(
    guest: LinuxGuest, tmp_path: Path
) -> None:
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is needed (make consumers installs golang-go)")
    profile, folded = tmp_path / "p.pb.gz", tmp_path / "p.folded"
    record(guest, profile, "--sysroot", str(guest_sysroot(guest)), "-o", str(folded))
    for line in folded.read_text().splitlines():
        stack = line.rsplit(" ", 1)[0].split(";")
        if stack[0].startswith("dynwork (") and any(f.startswith("asm_") for f in stack):
            # a kernel sample of the process (an interrupt taken in user mode): its user
            # frames below the kernel's, down to _start (under the process and its thread)
            assert stack[1].startswith("thread ") and stack[2] == "_start", line
    raw = subprocess.run(
        [go, "tool", "pprof", "-raw", str(profile)], capture_output=True, text=True, check=True
    ).stdout
    mapping = next(line for line in raw.splitlines() if LIBC in line)
    assert build_id(guest_sysroot(guest) / LIBC.lstrip("/")) in mapping, mapping
    top = subprocess.run(
        [go, "tool", "pprof", "-top", "-sample_index=samples", str(profile)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "msort_with_tmp" in top and "compare_keys" in top, top
