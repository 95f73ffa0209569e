"""What one vCPU sample costs qmpprof as the Linux guest grows from 1 to 16 vCPUs.

Boots examples/linux (Debian's kernel, TCG, KASLR, RAM file) with --counts vCPUs in
turn, each under two loads: `busy`, the five default workloads (five CPU-bound threads:
every vCPU busy up to five, the rest idle) and `idle`, a sleeper alone (every vCPU
halted nearly always). On each guest, in --rounds rounds, for --seconds at --hz, taking
turns:
  floor        a bare-socket loop of stop, info registers -a, cont on qmpprof's schedule
               (bench.common.floor_loop): QEMU's part, no memory, no unwind
  stop         qmpprof's stop-mode loop (sampler.sample_loop, connected as `record` is
               with no kernel file: the kernel read from guest memory), each sample
               symbolized and added to a profile, as `record` does
  nonblocking  the same with --nonblocking
Printed per guest: ticks a second of each, and this process's CPU time per vCPU sample
(the whole loop's CPU over the vCPU samples it took: stop's and nonblocking's include
the floor's own share); the busy share (vCPUs not halted at a sample). The cost per vCPU
sample should not grow with the vCPU count (issue 47): a halted vCPU unchanged since its
last sample is neither read nor unwound nor symbolized again. Compare rows of one run
only. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import floor_loop, median
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import CapturedSample, Mode
from qmpprof.profile import Profile
from qmpprof.record.sampler import LoopConfig, sample_loop
from tests.guest_vm import BareQmp, scratch_ram_file
from tests.linux_vm import running_linux

COUNTS = (1, 2, 4, 8, 16)
LOADS = {"busy": (), "idle": ("--workloads", "sleeper")}
METHODS = ("floor", "stop", "nonblocking")


def floor_run(socket: str, hz: float, seconds: float, vcpus: int) -> tuple[float, float]:
    """(ticks a second, CPU seconds per vCPU sample) of the bare-socket loop."""
    qmp = BareQmp(socket)
    try:
        started = time.process_time()
        stats = asyncio.run(floor_loop(qmp, hz, "stop", seconds))
        cpu = time.process_time() - started
    finally:
        qmp.close()
    return stats.ticks / stats.elapsed_s, cpu / max(stats.ticks * vcpus, 1)


async def qmpprof_run(
    options: TargetOptions, hz: float, seconds: float, nonblocking: bool
) -> tuple[float, float, float]:
    """(ticks a second, CPU seconds per vCPU sample, busy share) of qmpprof's loop."""
    analyzer = build_analyzer(options)
    profile = Profile()
    busy = [0, 0]

    def take(captured: list[CapturedSample]) -> None:
        for one in captured:
            sample = analyzer.symbolize(one)
            profile.add(sample)
            busy[0] += sample.mode is not Mode.IDLE
            busy[1] += 1

    async with connected(options, analyzer) as (session, _, capturer):
        config = LoopConfig(1 / hz, seconds, nonblocking=nonblocking)
        started = time.process_time()
        stats = await sample_loop(session, capturer, config, asyncio.Event(), take)
        cpu = time.process_time() - started
    return stats.ticks / stats.elapsed_s, cpu / max(stats.samples, 1), busy[0] / max(busy[1], 1)


def measure(count: int, load: str, args: argparse.Namespace) -> dict[str, float]:
    """Medians over the rounds on a guest with `count` vCPUs under `load`."""
    rates: dict[str, list[float]] = {method: [] for method in METHODS}
    costs: dict[str, list[float]] = {method: [] for method in METHODS}
    shares: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory,
        scratch_ram_file() as ram,
        running_linux(
            Path(directory), "--smp", str(count), "--memory-backend", ram, *LOADS[load]
        ) as guest,
    ):
        options = TargetOptions(guest.qmp, None, memory="direct", mem_path=ram)
        for _ in range(args.rounds):
            hz, cost = floor_run(guest.qmp, args.hz, args.seconds, count)
            rates["floor"].append(hz)
            costs["floor"].append(cost)
            for method in ("stop", "nonblocking"):
                run = qmpprof_run(options, args.hz, args.seconds, method == "nonblocking")
                hz, cost, share = asyncio.run(run)
                rates[method].append(hz)
                costs[method].append(cost)
                shares.append(share)
    row = {f"{method}_hz": median(rates[method]) for method in METHODS}
    row |= {f"{method}_cpu_ms": median(costs[method]) * 1000 for method in METHODS}
    row["busy_share"] = median(shares)
    return row


def table(rows: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    heading = "load  vCPUs   busy" + "".join(f"{m + ' Hz':>15}" for m in METHODS)
    heading += "".join(f"{m + ' ms':>15}" for m in METHODS) + "   (CPU ms per vCPU sample)"
    lines = [heading]
    for (load, count), row in rows.items():
        line = f"{load:<5} {count:>5} {row['busy_share']:>6.0%}"
        line += "".join(f"{row[f'{m}_hz']:>15.1f}" for m in METHODS)
        line += "".join(f"{row[f'{m}_cpu_ms']:>15.3f}" for m in METHODS)
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="each method's run")
    parser.add_argument("--hz", type=float, default=99.0)
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)), help="vCPU counts")
    parser.add_argument("--loads", default=",".join(LOADS), help="busy, idle or both")
    args = parser.parse_args()
    counts = [int(count) for count in args.counts.split(",")]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for load in args.loads.split(","):
        for count in counts:
            rows[(load, count)] = measure(count, load, args)
            print(table({(load, count): rows[(load, count)]})[-1], flush=True)
    print("\n".join(table(rows)))
    print(
        json.dumps(
            {
                f"{load}_{count}": {key: round(value, 4) for key, value in row.items()}
                for (load, count), row in rows.items()
            }
        )
    )


if __name__ == "__main__":
    main()
