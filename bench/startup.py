"""Start-up cost: from `qmpprof dump --kernel ELF` being started to its one sample.

Boots the Linux example guest (Debian 12's kernel, 2 vCPUs, nokaslr; --abi ABI, given
once or more, picks Debian kernels: `examples/linux/fetch.sh --list`; --arm64-abi ABI
boots the AArch64 Linux guest on that arm64 kernel too), then the example
guest, and runs `qmpprof dump` against each --runs times as a user would: a fresh
process, its kernel ELF given. The first run is cold: an empty derived cache (a fresh
QMPPROF_DERIVED_CACHE directory: symbols, CFI entries and layouts read from the ELF) and the
ELF's pages dropped from the page cache (posix_fadvise); the others are warm (what the
first stored, the ELF's pages in memory). For each run:
  first_s     from the process's start to QEMU's STOP event for its sample (QEMU's
              time stamp, read on a second QMP monitor): loading the ELF, choosing
              the OS adapter, connecting
  dump_s      from the process's start to its exit: the above, the sample (registers,
              memory, cont), unwinding, source lines, printing; and its CPU seconds
              (wait4), which the guest's own vCPU threads do not inflate
  load_s      inside a fresh process, only loading the kernel and choosing the OS
              adapter (build_analyzer): the part that grows with the ELF
  peak_mb     the dump process's peak resident memory (wait4's ru_maxrss), and the
              load-only process's (what is held when sampling starts)
Each Linux guest is measured twice: with its debug vmlinux (`--kernel`), and with none
(`linux ABI, memory`): the kernel read from the guest's memory (VMCOREINFO found in RAM,
kallsyms, ORC, BTF). There the cold run also forgets where VMCOREINFO was (a whole scan
of guest RAM), and the guest has --ram (2 GiB by default) as issue 24 asks.
The medians are printed as a table with the cold run's first sample and the warm runs'
median, against issue 15's targets on a Debian debug vmlinux (first sample within 3 s
cold and 1 s warm, peak RSS under 300 MB) and issue 24's with no vmlinux (1.5 s cold,
0.5 s warm, 150 MB); with no vmlinux, the warm runs' whole dump too (`warm_dump_s`, from
the process's start to its exit) against issue 27's 0.5 s. The last line is one JSON
object. qmpprof's bytecode is written first, as `pip install` writes an installed
package's (see compile_package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest_vm import running_guest
from tests.integration.watcher import Watcher
from tests.linux_vm import LinuxGuest, running_linux
from tests.linux_vm_aarch64 import running_linux_aarch64

COLD_TARGET_S = 3.0
WARM_TARGET_S = 1.0
PEAK_TARGET_MB = 300
#: No vmlinux: the kernel read from the guest's memory (issue 24); and issue 27's for a
#: whole warm `qmpprof dump`, from the process's start to its exit.
MEMORY_TARGETS = {"cold_s": 1.5, "warm_s": 0.5, "peak_mb": 150, "warm_dump_s": 0.5}
#: Boots a guest in a directory with a second QMP monitor: (its QMP socket, its kernel).
Boot = Callable[[Path, str], AbstractContextManager[tuple[str, Path]]]
#: Timed inside a fresh interpreter: the imports it needs, then build_analyzer.
LOAD_ONLY = """
import sys, time
from pathlib import Path
from qmpprof.commands.common import TargetOptions, build_analyzer
started = time.perf_counter()
analyzer = build_analyzer(TargetOptions("unused", Path(sys.argv[1])))
print(time.perf_counter() - started, analyzer.adapter.name)
"""


@dataclass(frozen=True)
class Run:
    first_s: float
    dump_s: float
    cpu_s: float
    load_s: float
    peak_mb: float
    load_peak_mb: float
    exit: int
    vcpus: int
    adapter: str


def timed(command: list[str], cache: Path) -> tuple[float, float, float, int, str]:
    """(seconds, CPU seconds, peak MB, exit code, stdout) of `command` as a child process
    whose derived cache is `cache`."""
    started = time.perf_counter()
    environment = {**os.environ, "QMPPROF_DERIVED_CACHE": str(cache)}
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment
    )
    assert child.stdout is not None
    output = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return time.perf_counter() - started, cpu_s, usage.ru_maxrss / 1024, child.returncode, output


def one_run(qmp: str, watch: str, kernel: Path, cache: Path, cold: bool, memory: bool) -> Run:
    """One dump and one load-only process; `cold`: each with the cache emptied and the
    ELF evicted first. `memory`: the dump is given no kernel file (and there is nothing to
    load before connecting)."""
    dump = [sys.executable, "-m", "qmpprof", "dump", "--qmp-socket", qmp]
    dump += [] if memory else ["--kernel", str(kernel)]
    if cold:
        make_cold(kernel, cache)
    watcher = Watcher(watch)
    started = time.time()
    dump_s, cpu_s, peak_mb, code, output = timed(dump, cache)
    first_s = watcher.wait_for("STOP").stamp_us / 1e6 - started  # QEMU's own time stamp
    watcher.close()
    vcpus = sum(line.startswith("vCPU ") for line in output.splitlines())
    if memory:
        return Run(first_s, dump_s, cpu_s, 0.0, peak_mb, 0.0, code, vcpus, "linux")
    if cold:
        make_cold(kernel, cache)
    load_only = [sys.executable, "-c", LOAD_ONLY, str(kernel)]
    _, _, load_peak_mb, _, load_out = timed(load_only, cache)
    load_s, adapter = load_out.split()
    return Run(first_s, dump_s, cpu_s, float(load_s), peak_mb, load_peak_mb, code, vcpus, adapter)


def evict(path: Path) -> None:
    """Drop `path`'s pages from the page cache: the next run reads it from disk (cold)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def make_cold(kernel: Path, cache: Path) -> None:
    """An empty derived cache (VMCOREINFO's place forgotten with it:
    record/guest_kernel.py), the ELF out of the page cache."""
    shutil.rmtree(cache, ignore_errors=True)
    evict(kernel)


def measured(
    qmp: str, watch: str, kernel: Path, count: int, cache: Path, memory: bool = False
) -> list[Run]:
    """`count` runs, the first cold."""
    return [
        one_run(qmp, watch, kernel, cache, cold=number == 0, memory=memory)
        for number in range(count)
    ]


def summary(name: str, kernel: Path, runs: list[Run]) -> dict[str, object]:
    warm = runs[1:] or runs
    memory = name.endswith(", memory")
    return {
        "guest": name,
        "kernel": "guest memory" if memory else str(kernel),
        "kernel_mb": 0.0 if memory else round(kernel.stat().st_size / 1e6, 1),
        "adapter": runs[0].adapter,
        "load_s": statistics.median(run.load_s for run in runs),
        "first_s": statistics.median(run.first_s for run in runs),
        "cold_first_s": runs[0].first_s,
        "warm_first_s": statistics.median(run.first_s for run in warm),
        "dump_s": statistics.median(run.dump_s for run in runs),
        "warm_dump_s": statistics.median(run.dump_s for run in warm),
        "dump_cpu_s": statistics.median(run.cpu_s for run in runs),
        "peak_mb": statistics.median(run.peak_mb for run in runs),
        "load_peak_mb": statistics.median(run.load_peak_mb for run in runs),
        "exits": sorted({run.exit for run in runs}),
        "vcpus": runs[0].vcpus,
    }


def linux_guest(
    abi: str | None,
    ram: str,
    running: Callable[..., AbstractContextManager[LinuxGuest]] = running_linux,
) -> Boot:
    """Boots a Linux example guest (`running`: tests.linux_vm's, or the AArch64 one's) on
    kernel `abi` (boot.sh's default if None) with `ram` of memory."""

    @contextmanager
    def boot(workdir: Path, watch: str) -> Iterator[tuple[str, Path]]:
        extra = ("--smp", "2", "--nokaslr", "--ram", ram, "--extra-qmp", watch)
        with running(workdir, *extra, abi=abi) as guest:
            yield guest.qmp, guest.kernel

    return boot


@contextmanager
def example_guest(workdir: Path, watch: str) -> Iterator[tuple[str, Path]]:
    with running_guest(workdir, "--accel", "tcg", "--extra-qmp", watch) as guest:
        yield guest.qmp, guest.kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--abi", action="append", help="a Debian kernel to boot (repeatable)")
    parser.add_argument(
        "--arm64-abi", action="append", default=[], help="a Debian arm64 kernel (repeatable)"
    )
    parser.add_argument("--ram", default="2G", help="the Linux guest's memory (boot.sh --ram)")
    args = parser.parse_args()
    compile_package()
    guests = [
        (f"linux {abi or ''}".strip(), linux_guest(abi, args.ram)) for abi in args.abi or [None]
    ]
    arm64 = running_linux_aarch64
    guests += [(f"linux {abi}", linux_guest(abi, args.ram, arm64)) for abi in args.arm64_abi]
    runs: dict[str, list[Run]] = {}
    kernels: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="qmpprof-su-") as directory:
        # One guest at a time: a busy TCG guest takes a host core per vCPU.
        for number, (name, boot) in enumerate([*guests, ("example", example_guest)]):
            workdir = Path(directory) / str(number)
            workdir.mkdir()
            watch = str(workdir / "watch.sock")
            with boot(workdir, watch) as (qmp, kernel):
                kernels[name] = kernel
                runs[name] = measured(qmp, watch, kernel, args.runs, workdir / "cache")
                if name.startswith("linux"):
                    kernels[f"{name}, memory"] = kernel
                    runs[f"{name}, memory"] = measured(
                        qmp, watch, kernel, args.runs, workdir / "cache", memory=True
                    )
    rows = [summary(name, kernels[name], runs[name]) for name in runs]
    print_table(rows)
    for row in rows:
        if str(row["guest"]).startswith("linux"):
            print(verdicts(row))
    targets = {"cold_s": COLD_TARGET_S, "warm_s": WARM_TARGET_S, "peak_mb": PEAK_TARGET_MB}
    result = {"targets": targets, "memory_targets": MEMORY_TARGETS, "runs": args.runs}
    print(json.dumps({**result, "guests": rows}))


def compile_package() -> None:
    """qmpprof's bytecode written (`make deps` does the same), as an installed package
    has it: with PYTHONDONTWRITEBYTECODE set, an editable install's every run would
    compile the whole package again, and warm runs would time that."""
    package = Path(__file__).resolve().parents[1] / "qmpprof"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True)


def verdicts(row: dict[str, object]) -> str:
    """One line: the cold and warm first sample and the peak memory against the targets;
    with no vmlinux, the warm dumps' time too."""
    memory = str(row["guest"]).endswith(", memory")
    targets = MEMORY_TARGETS if memory else {}
    cold = targets.get("cold_s", COLD_TARGET_S)
    warm = targets.get("warm_s", WARM_TARGET_S)
    peak = targets.get("peak_mb", PEAK_TARGET_MB)
    checks = [
        ("cold first sample", float(str(row["cold_first_s"])), cold, "s"),
        ("warm first sample", float(str(row["warm_first_s"])), warm, "s"),
        ("peak RSS", float(str(row["peak_mb"])), peak, " MB"),
    ]
    if memory:
        warm_dump = float(str(row["warm_dump_s"]))
        checks.append(("warm dump_s", warm_dump, MEMORY_TARGETS["warm_dump_s"], "s"))
    said = [
        f"{what} {value:.2f}{unit} ({'within' if value <= target else 'OVER'} {target:g}{unit})"
        for what, value, target, unit in checks
    ]
    return f"{row['guest']}: " + ", ".join(said)


def print_table(rows: list[dict[str, object]]) -> None:
    width = max(len(str(row["guest"])) for row in rows)
    print(
        f"{'guest':{width}} {'kernel MB':>9} {'adapter':>8} {'load s':>7} {'first sample s':>14} "
        f"{'cold':>6} {'warm':>6} {'dump s':>7} {'warm':>6} {'dump CPU s':>10} {'peak MB':>8} "
        f"{'load peak MB':>12}"
    )
    for row in rows:
        print(
            f"{row['guest']!s:{width}} {row['kernel_mb']:9.0f} {row['adapter']!s:>8} "
            f"{row['load_s']:7.2f} {row['first_s']:14.2f} {row['cold_first_s']:6.2f} "
            f"{row['warm_first_s']:6.2f} {row['dump_s']:7.2f} {row['warm_dump_s']:6.2f} "
            f"{row['dump_cpu_s']:10.2f} "
            f"{row['peak_mb']:8.0f} {row['load_peak_mb']:12.0f}"
        )


if __name__ == "__main__":
    main()
