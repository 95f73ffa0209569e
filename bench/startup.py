"""Start-up cost: from `qmpprof dump --kernel ELF` being started to its one sample.

Boots the Linux example guest (Debian 12's kernel, 2 vCPUs, nokaslr), then the example
guest, and runs `qmpprof dump` against each --runs times as a user would: a fresh
process, its kernel ELF given. For each run:
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
The medians are printed as a table, the target (first sample within 5 s on the Debian
debug vmlinux) beside them; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest_vm import running_guest
from tests.integration.watcher import Watcher
from tests.linux_vm import running_linux

TARGET_S = 5.0
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


def timed(command: list[str]) -> tuple[float, float, float, int, str]:
    """(seconds, CPU seconds, peak MB, exit code, stdout) of `command` as a child process."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    output = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return time.perf_counter() - started, cpu_s, usage.ru_maxrss / 1024, child.returncode, output


def one_run(qmp: str, watch: str, kernel: Path) -> Run:
    dump = [sys.executable, "-m", "qmpprof", "dump", "--qmp-socket", qmp, "--kernel", str(kernel)]
    watcher = Watcher(watch)
    started = time.time()
    dump_s, cpu_s, peak_mb, code, output = timed(dump)
    first_s = watcher.wait_for("STOP").stamp_us / 1e6 - started  # QEMU's own time stamp
    watcher.close()
    _, _, load_peak_mb, _, load_out = timed([sys.executable, "-c", LOAD_ONLY, str(kernel)])
    load_s, adapter = load_out.split()
    vcpus = sum(line.startswith("vCPU ") for line in output.splitlines())
    return Run(first_s, dump_s, cpu_s, float(load_s), peak_mb, load_peak_mb, code, vcpus, adapter)


def summary(name: str, kernel: Path, runs: list[Run]) -> dict[str, object]:
    return {
        "guest": name,
        "kernel": str(kernel),
        "kernel_mb": round(kernel.stat().st_size / 1e6, 1),
        "adapter": runs[0].adapter,
        "load_s": statistics.median(run.load_s for run in runs),
        "first_s": statistics.median(run.first_s for run in runs),
        "dump_s": statistics.median(run.dump_s for run in runs),
        "dump_cpu_s": statistics.median(run.cpu_s for run in runs),
        "peak_mb": statistics.median(run.peak_mb for run in runs),
        "load_peak_mb": statistics.median(run.load_peak_mb for run in runs),
        "exits": sorted({run.exit for run in runs}),
        "vcpus": runs[0].vcpus,
    }


@contextmanager
def linux_guest(workdir: Path, watch: str) -> Iterator[tuple[str, Path]]:
    extra = ("--smp", "2", "--nokaslr", "--extra-qmp", watch)
    with running_linux(workdir, *extra) as guest:
        yield guest.qmp, guest.kernel


@contextmanager
def example_guest(workdir: Path, watch: str) -> Iterator[tuple[str, Path]]:
    with running_guest(workdir, "--accel", "tcg", "--extra-qmp", watch) as guest:
        yield guest.qmp, guest.kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[Run]] = {}
    kernels: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="qmpprof-su-") as directory:
        # One guest at a time: a busy TCG guest takes a host core per vCPU.
        for name, boot in (("linux", linux_guest), ("example", example_guest)):
            workdir = Path(directory) / name
            workdir.mkdir()
            watch = str(workdir / "watch.sock")
            with boot(workdir, watch) as (qmp, kernel):
                kernels[name] = kernel
                runs[name] = [one_run(qmp, watch, kernel) for _ in range(args.runs)]
    rows = [summary(name, kernels[name], runs[name]) for name in runs]
    print(
        f"{'guest':8} {'kernel MB':>9} {'adapter':>14} {'load s':>7} {'first sample s':>14} "
        f"{'dump s':>7} {'dump CPU s':>10} {'peak MB':>8} {'load peak MB':>12}"
    )
    for row in rows:
        print(
            f"{row['guest']:8} {row['kernel_mb']:9.0f} {row['adapter']:>14} {row['load_s']:7.2f} "
            f"{row['first_s']:14.2f} {row['dump_s']:7.2f} {row['dump_cpu_s']:10.2f} "
            f"{row['peak_mb']:8.0f} {row['load_peak_mb']:12.0f}"
        )
    first = statistics.median(run.first_s for run in runs["linux"])
    verdict = "within" if first <= TARGET_S else "OVER"
    print(f"Debian debug vmlinux: first sample after {first:.2f} s, {verdict} the {TARGET_S:.0f} s")
    print(json.dumps({"target_s": TARGET_S, "runs": args.runs, "guests": rows}))


if __name__ == "__main__":
    main()
