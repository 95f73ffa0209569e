"""The Linux example guest (examples/linux) as tests and benchmarks drive it."""

from __future__ import annotations

import functools
import os
import re
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

ROOT = Path(__file__).resolve().parents[1]
BOOT = ROOT / "examples" / "linux" / "boot.sh"
FETCH = ROOT / "examples" / "linux" / "fetch.sh"
BUILD = ROOT / "examples" / "linux" / "build"
#: The host release's initramfs (a kernel of an older release, bullseye's 5.10, boots
#: build/bullseye/'s, with that release's libc: LinuxGuest.initramfs). Each holds the
#: modules of every cached kernel.
INITRAMFS = BUILD / "initramfs.cpio"
#: The guest's root as the host's tools see it (examples/linux/mksysroot.py): /bin/dynwork,
#: /usr/lib/x86_64-linux-gnu/libqmpwork.so.1, Debian's libc6 files the guest has
#: (/lib/x86_64-linux-gnu/{libc.so.6,ld-linux-x86-64.so.2}, /lib64/ld-linux-x86-64.so.2)
#: and libc6-dbg's /usr/lib/debug/.build-id/xx/yyyy.debug for them. This is the host
#: release's; LinuxGuest.sysroot is the one of the kernel a guest booted.
SYSROOT = BUILD / "sysroot"
#: Beside a sysroot: the same with another version of libc6 (the wrong libc), if the
#: archive offered one.
OTHER_LIBC_SYSROOT = "sysroot-other-libc"
#: Where a context switch has loaded the next task's CR3 or stack but `current` is still
#: the task switched out (switch_mm_irqs_off's CR3 write, then switch_to): a sample there
#: has the next task's frames under the old task's name. switch_ldt runs at the end of
#: switch_mm_irqs_off, after the CR3 write (6.12 tail-calls it: GDB shows it straight
#: under context_switch; seen with pinned's user pc left unnamed, as qmpprof promises).
MID_SWITCH = frozenset({"switch_mm_irqs_off", "switch_ldt", "__switch_to_asm", "__switch_to"})
#: Beside a sysroot: what fetch.sh --libc said (libc=DIR version=V other_libc=DIR
#: other_version=V).
LIBC_ENV = "libc.env"
#: Booting Debian's kernel under TCG on a busy 2-core host, after a first download.
BOOT_TIMEOUT_S = 900


@dataclass(frozen=True)
class LinuxGuest:
    """A running Linux example guest: what boot.sh printed."""

    pid: int
    kernel: Path  # the debug vmlinux
    vmlinuz: Path
    abi: str  # Debian's name for the kernel: 6.1.0-50-amd64
    qmp: str
    serial: str
    initramfs: Path  # the one booted: build/initramfs.cpio, or bullseye's for its kernel
    sysroot: Path  # its files for qmpprof --sysroot: SYSROOT, or build/bullseye/sysroot


def kernel_abis() -> list[str]:
    """The Debian kernels the tests boot (bookworm's 6.1 first, then backports' 6.12 and
    bullseye's 5.10): fetch.sh's list, which `make linux-guest` fetches."""
    done = subprocess.run([str(FETCH), "--list"], capture_output=True, text=True, check=True)
    return done.stdout.split()


#: A kernel that panics while booting (seen once in some fifty 6.12 boots under
#: TCG: "Oops: int3" in sched_clock_cpu, a text-patching breakpoint taken on another
#: vCPU) is booted once more; any other failure, or a second panic, is the test's.
BOOT_ATTEMPTS = 2
PANIC = re.compile(r"Kernel panic|Oops:")


def boot_linux(workdir: Path, *extra: str, abi: str | None = None) -> LinuxGuest:
    """Boot the guest on kernel `abi` (boot.sh's default if None), fetching Debian's
    kernel first if this machine has not yet."""
    qmp, serial = workdir / "qmp.sock", workdir / "serial.log"
    command = [str(BOOT), "--qmp", str(qmp), "--serial", str(serial), *extra]
    command += ["--abi", abi] if abi else []
    for attempt in range(BOOT_ATTEMPTS):
        done = subprocess.run(command, capture_output=True, text=True, timeout=BOOT_TIMEOUT_S)
        log = serial.read_text(errors="replace") if serial.exists() else ""
        if done.returncode == 0 or not PANIC.search(log) or attempt == BOOT_ATTEMPTS - 1:
            break
        print(f"the guest's kernel panicked while booting under TCG, booting again:\n{log}")
    if done.returncode != 0:
        raise RuntimeError(f"examples/linux/boot.sh failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return LinuxGuest(
        int(values["pid"]),
        Path(values["kernel"]),
        Path(values["vmlinuz"]),
        values["abi"],
        values["qmp"],
        values["serial"],
        Path(values["initramfs"]),
        Path(values["sysroot"]),
    )


@contextmanager
def running_linux(workdir: Path, *extra: str, abi: str | None = None) -> Iterator[LinuxGuest]:
    """The Linux guest booted on kernel `abi` with boot.sh's `extra` arguments, stopped
    however the block ends."""
    guest = boot_linux(workdir, *extra, abi=abi)
    try:
        yield guest
    finally:
        subprocess.run([str(BOOT), "stop", str(guest.pid)], check=False, timeout=60)


def initramfs_file(name: str, guest: LinuxGuest | None = None) -> bytes:
    """A file of the initramfs `guest` booted, else of INITRAMFS (newc: a 110-byte header,
    the name and the data, each padded to 4 bytes)."""
    archive = (guest.initramfs if guest else INITRAMFS).read_bytes()
    at = 0
    while archive.startswith(b"070701", at):
        size, name_size = int(archive[at + 54 : at + 62], 16), int(archive[at + 94 : at + 102], 16)
        start = at + 110 + name_size + (-(110 + name_size) % 4)
        if archive[at + 110 : at + 110 + name_size - 1].decode() == name:
            return archive[start : start + size]
        at = start + size + (-size % 4)
    raise AssertionError(f"{name} is not in the initramfs")


def guest_sysroot(guest: LinuxGuest) -> Path:
    """The sysroot of the kernel `guest` booted, which `make -C examples/linux` (and so
    boot.sh) builds: `qmpprof --sysroot` and GDB's `set sysroot` find every file of
    dynwork's process there."""
    if not (guest.sysroot / "bin" / "dynwork").is_file():
        raise AssertionError(f"no {guest.sysroot}: run make -C examples/linux")
    return guest.sysroot


def mapped_path(sysroot: Path, path: str) -> str:
    """The guest path the maps name for `path`: its symbolic link followed in the guest's
    root (glibc 2.31's libc.so.6 is a link to libc-2.31.so)."""
    target = (sysroot / path.lstrip("/")).resolve()
    return "/" + str(target.relative_to(sysroot.resolve()))


def other_libc_sysroot(guest: LinuxGuest) -> Path | None:
    """OTHER_LIBC_SYSROOT beside guest_sysroot(guest) (its files, but libc6 and libc6-dbg
    of another version: its libc.so.6 and ld.so have other build-ids), or None when apt
    offered only one version of libc6 (and for bullseye's guest: fetch.sh gives one)."""
    other = guest_sysroot(guest).parent / OTHER_LIBC_SYSROOT
    return other if (other / "bin" / "dynwork").is_file() else None


def libc_versions(guest: LinuxGuest) -> tuple[str, str | None]:
    """The version of libc6 in guest_sysroot(guest) (and the guest), and in
    other_libc_sysroot(guest)."""
    env = guest_sysroot(guest).parent / LIBC_ENV
    values = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line)
    return values["version"], values.get("other_version") or None


#: The kernel symbol examples/linux/init.c looks up in the guest's /proc/kallsyms and
#: prints as "qmpprof-linux: kallsyms ADDRESS asm_exc_divide_error".
KALLSYMS_ANCHOR = "asm_exc_divide_error"


def nm_symbols(elf: Path) -> dict[str, set[int]]:
    """Every symbol nm lists in `elf`, by name: its addresses (a static name may repeat)."""
    listed = subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True)
    symbols: dict[str, set[int]] = {}
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3:
            symbols.setdefault(fields[2], set()).add(int(fields[0], 16))
    return symbols


@functools.cache
def vdso_image(vmlinux: Path) -> bytes:
    """The 64-bit vDSO the kernel maps into every process, as its build embeds it
    (`vdso_image_64`: the image's address and size), read from the vmlinux's file."""
    address = min(nm_symbols(vmlinux)["vdso_image_64"])
    with vmlinux.open("rb") as stream:
        sections = [
            (s["sh_addr"], s["sh_size"], s["sh_offset"])
            for s in ELFFile(stream).iter_sections()
            if s["sh_type"] == "SHT_PROGBITS" and s["sh_addr"]
        ]

        def read(at: int, size: int) -> bytes:
            start, _, offset = next(s for s in sections if s[0] <= at < s[0] + s[1])
            stream.seek(offset + at - start)
            return stream.read(size)

        data, size = struct.unpack("<QQ", read(address, 16))
        return read(data, size)


def kallsyms_slide(serial_text: str, kernel: Path) -> int | None:
    """The guest kernel's KASLR slide in its own words: where its /proc/kallsyms put
    KALLSYMS_ANCHOR (init's console line) minus where nm says `kernel` links it; None
    when init has not said it."""
    said = re.search(rf"qmpprof-linux: kallsyms ([0-9a-f]+) {KALLSYMS_ANCHOR}\b", serial_text)
    if said is None:
        return None
    (linked,) = nm_symbols(kernel)[KALLSYMS_ANCHOR]
    return int(said.group(1), 16) - linked


def started_pids(serial_text: str) -> dict[str, int]:
    """Each workload init started, by name: the pid init printed for it."""
    return {name: int(pid) for name, pid in re.findall(r"started (\w+) pid (\d+)", serial_text)}


def serial_says(guest: LinuxGuest, what: str) -> list[list[str]]:
    """The words after `qmpprof-linux: WHAT` of each such line of the guest's serial log."""
    prefix = f"qmpprof-linux: {what} "
    lines = Path(guest.serial).read_text(errors="replace").splitlines()
    return [line.strip()[len(prefix) :].split() for line in lines if line.startswith(prefix)]


def kernel_slide(guest: LinuxGuest) -> int:
    """The KASLR slide the guest itself says (kallsyms_slide); init must have said it."""
    slide = kallsyms_slide(Path(guest.serial).read_text(errors="replace"), guest.kernel)
    assert slide is not None, "the guest's init did not print its kallsyms line"
    return slide


def module_sections(guest: LinuxGuest, module: str) -> dict[str, int]:
    """Where the guest put each section of `module`, as the workload that loaded it said
    (`qmpprof-linux: section MODULE NAME ADDRESS`, from /sys/module/MODULE/sections)."""
    return {
        words[1]: int(words[2], 16)
        for words in serial_says(guest, "section")
        if len(words) == 3 and words[0] == module
    }


def module_debug_file(abi: str, module: str) -> Path:
    """`module`'s debug file (DWARF, .debug_frame) from the kernel's -dbg .deb fetch.sh
    cached, extracted once beside the vmlinux: lib/modules/ABI/kernel/MODULE.ko, with
    `module` its path under kernel/ (drivers/block/loop)."""
    cache = Path(os.environ.get("QMPPROF_CACHE", Path.home() / ".cache" / "qmpprof"))
    target = cache / "linux" / abi / "modules-dbg" / f"{module}.ko"
    if target.is_file():
        return target
    (deb,) = (cache / "debian").glob(f"linux-image-{abi}-dbg_*.deb")
    member = f"./usr/lib/debug/lib/modules/{abi}/kernel/{module}.ko"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".part{os.getpid()}")
    with (
        subprocess.Popen(
            ["dpkg-deb", "--fsys-tarfile", str(deb)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        ) as tar,
        partial.open("wb") as out,
    ):  # streamed: the package holds gigabytes
        subprocess.run(
            ["tar", "-xO", "--occurrence=1", member], stdin=tar.stdout, stdout=out, check=True
        )
    partial.replace(target)
    return target
