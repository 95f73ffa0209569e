"""Whether qmpprof finds the KASLR slide of the Linux example guest on every boot.

Boots examples/linux (Debian's kernel, 2 vCPUs, every workload, KASLR on as boot.sh
boots it) --boots times per kernel (--abi, repeatable; default every kernel of
`examples/linux/fetch.sh --list`), one guest at a time, and on each runs qmpprof as a
user would: `qmpprof record --verbose --kernel VMLINUX` for --seconds into a speedscope
file. A boot counts as found when the slide qmpprof prints, both with --verbose and in
its summary (`kernel: vmlinux, KASLR slide 0x…`), equals the guest's own: where its
/proc/kallsyms puts asm_exc_divide_error (init prints it on the console) minus where
nm says the vmlinux links it; and record exits 0 (it refuses a kernel whose samples
do not match). For each boot it also counts the recording's kernel frames that carry
a name nm gives the vmlinux, and whether do_syscall_64 is among them (sysloop is in a
system call most of the time).

Prints a row per boot (the guest's slide, qmpprof's, named kernel frames, seconds to
boot and to run qmpprof), then per kernel: found N of N, distinct slides among the
boots (KASLR really moved the kernel), median times. The last line is one JSON object.
On 2 busy host cores a boot takes 20-40 s.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median
from tests.linux_vm import (
    LinuxGuest,
    kallsyms_slide,
    kernel_abis,
    nm_symbols,
    running_linux,
)

#: qmpprof's words for where the kernel runs (console/summary.py's kernel_line).
SLIDE_LINE = re.compile(r"^kernel: \S+, (?:KASLR slide (0x[0-9a-f]+)|at its link address)$")
#: The system call's kernel function every recording of sysloop should name.
SYSCALL = "do_syscall_64"
#: A 2 s recording after loading the vmlinux, on a busy host.
QMPPROF_TIMEOUT_S = 300


@dataclass(frozen=True)
class Boot:
    """One boot: the slides (None: not said), kernel frames, seconds."""

    abi: str
    guest_slide: int | None
    verbose_slide: int | None
    summary_slide: int | None
    exit_code: int
    kernel_frames: int
    named_frames: int
    syscall_named: bool
    boot_s: float
    qmpprof_s: float

    @property
    def found(self) -> bool:
        """Both of qmpprof's lines say the guest's slide (the summary has none for 0)."""
        summary = 0 if self.summary_slide is None else self.summary_slide
        return self.exit_code == 0 and self.guest_slide == self.verbose_slide == summary


def said_slide(text: str) -> int | None:
    """The slide in qmpprof's kernel line of `text` (0: at its link address), None if none."""
    for line in text.splitlines():
        said = SLIDE_LINE.match(line.strip())
        if said:
            return int(said.group(1), 16) if said.group(1) else 0
    return None


def kernel_frames(document: dict[str, Any], kernel: Path) -> list[str]:
    """The names of the speedscope recording's frames in `kernel`'s file, sample by sample."""
    entries = document["shared"]["frames"]
    files = [entry.get("file") for entry in entries]
    return [
        entries[i]["name"]
        for profile in document["profiles"]
        for sample in profile["samples"]
        for i in sample
        if files[i] == kernel.name
    ]


def profile_boot(guest: LinuxGuest, boot_s: float, seconds: float, names: frozenset[str]) -> Boot:
    """Run `qmpprof record --verbose` on the booted guest and compare its slide."""
    output = Path(guest.serial).with_name("boot.speedscope.json")
    command = [sys.executable, "-m", "qmpprof", "record", "--verbose", "--qmp-socket", guest.qmp]
    command += ["--kernel", str(guest.kernel), "--duration", str(seconds), "-o", str(output)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=QMPPROF_TIMEOUT_S)
    took = time.monotonic() - started
    frames = []
    if done.returncode == 0:
        frames = kernel_frames(json.loads(output.read_text()), guest.kernel)
    else:
        print(f"  qmpprof exited {done.returncode}: {done.stderr.strip()[-300:]}", flush=True)
    return Boot(
        abi=guest.abi,
        guest_slide=kallsyms_slide(Path(guest.serial).read_text(), guest.kernel),
        verbose_slide=said_slide(done.stderr),
        summary_slide=said_slide(done.stdout),
        exit_code=done.returncode,
        kernel_frames=len(frames),
        named_frames=sum(name in names for name in frames),
        syscall_named=SYSCALL in frames,
        boot_s=round(boot_s, 1),
        qmpprof_s=round(took, 1),
    )


def boot_and_profile(abi: str, seconds: float) -> Boot:
    """One boot of the guest on kernel `abi`, profiled, the guest stopped after."""
    with tempfile.TemporaryDirectory(prefix="qmpprof-kaslr-") as directory:
        started = time.monotonic()
        with running_linux(Path(directory), abi=abi) as guest:
            boot_s = time.monotonic() - started
            return profile_boot(guest, boot_s, seconds, kernel_names(guest.kernel))


@cache
def kernel_names(kernel: Path) -> frozenset[str]:
    return frozenset(nm_symbols(kernel))


def hex_or_dash(value: int | None) -> str:
    return "-" if value is None else f"{value:#x}"


def row(number: int, boot: Boot) -> str:
    named = f"{boot.named_frames}/{boot.kernel_frames}"
    return (
        f"{boot.abi:<22} {number:>4} {hex_or_dash(boot.guest_slide):>12} "
        f"{hex_or_dash(boot.verbose_slide):>12} {hex_or_dash(boot.summary_slide):>12} "
        f"{named:>11} {'yes' if boot.syscall_named else 'no':>7} {boot.boot_s:>7.1f} "
        f"{boot.qmpprof_s:>7.1f} {'found' if boot.found else 'MISSED':>6}"
    )


HEADER = (
    f"{'kernel':<22} {'boot':>4} {'guest slide':>12} {'--verbose':>12} {'summary':>12} "
    f"{'named/kfr':>11} {SYSCALL[:7]:>7} {'boot s':>7} {'qmpprof':>7} {'':>6}"
)


def summary(abi: str, boots: list[Boot]) -> dict[str, Any]:
    slides = {boot.guest_slide for boot in boots if boot.guest_slide is not None}
    frames = sum(boot.kernel_frames for boot in boots)
    return {
        "abi": abi,
        "boots": len(boots),
        "found": sum(boot.found for boot in boots),
        "distinct_slides": len(slides),
        "zero_slides": sum(boot.guest_slide == 0 for boot in boots),
        "kernel_frames_named": round(sum(b.named_frames for b in boots) / frames, 4)
        if frames
        else None,
        "syscall_named": sum(boot.syscall_named for boot in boots),
        "boot_s_median": round(median([boot.boot_s for boot in boots]), 1),
        "qmpprof_s_median": round(median([boot.qmpprof_s for boot in boots]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boots", type=int, default=20, help="boots per kernel (default 20)")
    parser.add_argument("--abi", action="append", help="a Debian kernel to boot (default: all)")
    parser.add_argument("--seconds", type=float, default=2.0, help="qmpprof record's --duration")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    for abi in args.abi or kernel_abis():
        print(HEADER, flush=True)
        boots = []
        for number in range(1, args.boots + 1):
            boots.append(boot_and_profile(abi, args.seconds))
            print(row(number, boots[-1]), flush=True)
        results.append(summary(abi, boots))
        figures = results[-1]
        print(
            f"{abi}: found {figures['found']} of {figures['boots']}, "
            f"{figures['distinct_slides']} distinct slides, kernel frames named "
            f"{figures['kernel_frames_named']}, median boot {figures['boot_s_median']} s, "
            f"qmpprof {figures['qmpprof_s_median']} s\n",
            flush=True,
        )
    print(json.dumps({"kernels": results}))


if __name__ == "__main__":
    main()
