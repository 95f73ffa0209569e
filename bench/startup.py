"""Start-up cost: from `qmpprof dump --kernel ELF` being started to its one sample.

Boots the Linux example guest (Debian 12's kernel, 2 vCPUs, nokaslr) and the example
guest, then runs `qmpprof dump` against each --runs times, alternating, as a user
would: a fresh process, its kernel ELF given. For each run:
  first_s     from the process's start to QEMU's STOP event for its sample, seen on a
              second QMP monitor: loading the ELF, choosing the OS adapter, connecting
  dump_s      from the process's start to its exit: the above, the sample (registers,
              memory, cont), unwinding, source lines, printing
  load_s      inside a fresh process, only loading the kernel and choosing the OS
              adapter (build_analyzer): the part that grows with the ELF
  peak_mb     the dump process's peak resident memory (wait4's ru_maxrss)
The medians are printed as a table, the target (first sample within 5 s on the Debian
debug vmlinux) beside them; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest_vm import running_guest
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


class StopWatch:
    """A second QMP monitor, read by a thread: when QEMU announces the next STOP."""

    def __init__(self, path: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.settimeout(300)
        self._sock.connect(path)
        self._stream = self._sock.makefile("rw")
        self._stream.readline()  # the greeting
        self._stream.write('{"execute":"qmp_capabilities"}\n')
        self._stream.flush()
        self._stream.readline()
        self.stopped_at: float | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in self._stream:
                if json.loads(line).get("event") == "STOP":
                    self.stopped_at = time.perf_counter()
                    return

    def close(self) -> float | None:
        self._thread.join(timeout=10)
        self._stream.close()
        self._sock.close()
        return self.stopped_at


@dataclass(frozen=True)
class Run:
    first_s: float
    dump_s: float
    load_s: float
    peak_mb: float
    exit: int
    vcpus: int
    adapter: str


def timed(command: list[str]) -> tuple[float, float, int, str]:
    """(seconds, peak MB, exit code, stdout) of `command` as a child process."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    output = child.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - started, usage.ru_maxrss / 1024, child.returncode, output


def one_run(qmp: str, watch: str, kernel: Path) -> Run:
    dump = [sys.executable, "-m", "qmpprof", "dump", "--qmp-socket", qmp, "--kernel", str(kernel)]
    watcher = StopWatch(watch)
    started = time.perf_counter()
    dump_s, peak_mb, code, output = timed(dump)
    stopped_at = watcher.close()
    first_s = stopped_at - started if stopped_at is not None else float("nan")
    *_, load_out = timed([sys.executable, "-c", LOAD_ONLY, str(kernel)])
    load_s, adapter = load_out.split()
    vcpus = sum(line.startswith("vCPU ") for line in output.splitlines())
    return Run(first_s, dump_s, float(load_s), peak_mb, code, vcpus, adapter)


def summary(name: str, kernel: Path, runs: list[Run]) -> dict[str, object]:
    return {
        "guest": name,
        "kernel": str(kernel),
        "kernel_mb": round(kernel.stat().st_size / 1e6, 1),
        "adapter": runs[0].adapter,
        "load_s": statistics.median(run.load_s for run in runs),
        "first_s": statistics.median(run.first_s for run in runs),
        "dump_s": statistics.median(run.dump_s for run in runs),
        "peak_mb": statistics.median(run.peak_mb for run in runs),
        "exits": sorted({run.exit for run in runs}),
        "vcpus": runs[0].vcpus,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qmpprof-su-")))
        (workdir / "linux").mkdir()
        (workdir / "example").mkdir()
        watches = {name: str(workdir / name / "watch.sock") for name in ("linux", "example")}
        linux = stack.enter_context(
            running_linux(
                workdir / "linux", "--smp", "2", "--nokaslr", "--extra-qmp", watches["linux"]
            )
        )
        example = stack.enter_context(
            running_guest(workdir / "example", "--accel", "tcg", "--extra-qmp", watches["example"])
        )
        guests = {"linux": (linux.qmp, linux.kernel), "example": (example.qmp, example.kernel)}
        runs: dict[str, list[Run]] = {name: [] for name in guests}
        for _ in range(args.runs):  # alternating, so both see the same host load
            for name, (qmp, kernel) in guests.items():
                runs[name].append(one_run(qmp, watches[name], kernel))
    rows = [summary(name, guests[name][1], runs[name]) for name in guests]
    print(
        f"{'guest':8} {'kernel MB':>9} {'adapter':>14} {'load s':>7} {'first sample s':>14} "
        f"{'dump s':>7} {'peak MB':>8}"
    )
    for row in rows:
        print(
            f"{row['guest']:8} {row['kernel_mb']:9.0f} {row['adapter']:>14} {row['load_s']:7.2f} "
            f"{row['first_s']:14.2f} {row['dump_s']:7.2f} {row['peak_mb']:8.0f}"
        )
    first = statistics.median(run.first_s for run in runs["linux"])
    verdict = "within" if first <= TARGET_S else "OVER"
    print(f"Debian debug vmlinux: first sample after {first:.2f} s, {verdict} the {TARGET_S:.0f} s")
    print(json.dumps({"target_s": TARGET_S, "runs": args.runs, "guests": rows}))


if __name__ == "__main__":
    main()
