"""What one stop-mode sample costs on the Linux example guest, against its floor.

Boots examples/linux (Debian's kernel, 2 vCPUs, KASLR on; --abi picks the kernel,
`examples/linux/fetch.sh --list`; --smp and --workloads make a lightly loaded guest, as
`--smp 4 --workloads crunch`: most samples then of halted vCPUs) and measures side by
side, in --rounds rounds, as
sample_cost.py does on the example guest:
  floor_ms     a bare-socket loop of stop, info registers -a, cont: no memory, no unwind
  stop_ms      qmpprof's stop-mode sampling path (primed `stop`, registers, a copy of the
               memory the unwind reads, `cont`) with the analyzer `qmpprof record` builds:
               with --kernel memory (the default, as a user with no debug files runs
               it) the kernel read from the guest's memory and each process's files from
               its maps; with --kernel vmlinux the debug vmlinux with the OS adapter
               registry.py picks, --user for each workload in examples/linux/build, and
               the KASLR slide found as connect.py finds it; memory `direct`: with
               --ram file (the default, as sample_cost.py on the example guest) the
               guest's RAM is a shared file qmpprof maps (boot.sh --memory-backend,
               qmpprof --mem-path), with --ram proc it is read through QEMU's
               /proc/PID/mem (a QEMU started without a RAM file)
  analysis_ms  what is left of one tick after the VM runs again (the unwind of the
               copied stacks, symbols)
  paused_stop_ms  the stop path of `record --unwind-paused`: memory read on demand and
               unwound with the VM paused (exact at any stack depth)
  *_pause_ms   the VM's pause per tick by QEMU's own clock (its STOP and RESUME
               events' timestamps): what the guest loses, without our round trips
  *_cpu_ms     this process's CPU time per tick of the floor and of the stop path
               (analysis included), median of the rounds: on a loaded host the wall
               times follow QEMU's scheduling, this follows only our own work
  cpu_per_vcpu_sample_ms  the stop path's CPU per tick over the vCPUs it sampled: what
               one vCPU sample costs this process (issue 27's figure)
  connect_cpu_ms  the CPU time of opening the connection as `record` does (once a run)
  baseline_cpu_per_vcpu_sample_ms, tree_cpu_per_vcpu_sample_ms  with --baseline REV
               (issue 27's baseline, 267d6a9, by default; `none`: not measured) and
               the default --kernel memory --ram file: the CPU per vCPU sample of the
               stop path of commit REV's qmpprof and of this tree's, each in a process
               of its own (bench/tree_cost.py), taking turns in every round on the same
               guest; after_over_before is their ratio (issue 27's target: 0.25)
the least and greatest stop/floor ratio of the tick and of the pause over the rounds
(each round's medians: how far the host's noise moves the ratio), and, over every
captured sample, the memory windows read per sample and the share of kernel-mode
samples whose stack reaches a user-space frame. --profile N prints the N functions of
the stop path that take the most time (cProfile, one extra round, not counted in the
medians). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import median
from bench.linux_rates import floor_run, qmpprof_run, vcpu_count
from bench.sample_cost import floor_ms, ticks_ms
from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import CapturedSample, Mode, Sample
from tests.guest_vm import scratch_ram_file
from tests.linux_vm import ROOT, running_linux

BUILD = ROOT / "examples" / "linux" / "build"
#: The workloads init starts, each its own program named after its comm.
WORKLOADS = tuple(BUILD / name for name in ("crunch", "crunchnofp", "sysloop", "pinned", "sleeper"))
#: The samples each stop tick captured, and what analysis made of them.
Kept = list[tuple[CapturedSample, Sample]]
#: Ratios kept per round: the tick's and the pause's (stop/floor), this process's CPU
#: per tick (stop/floor), nonblocking's rate against its floor's, after/before.
ROUND_RATIOS = ("tick", "pause", "cpu", "nonblocking_rate", "after_over_before")
#: Unthrottled nonblocking vCPU samples a second, qmpprof's and its floor's.
NONBLOCKING_RATES = ["nonblocking_vcpu_samples_per_s", "floor_nonblocking_vcpu_samples_per_s"]
#: Issue 27's baseline: the code before its work, measured beside this tree.
BASELINE = "267d6a9"
TREE_COST = Path(__file__).with_name("tree_cost.py")


class StopRound(NamedTuple):
    """One round of stop-mode ticks: wall times per tick, this process's CPU seconds."""

    path: list[float]
    analysis: list[float]
    pauses: list[float]
    cpu_per_tick: float
    connect_cpu: float


async def stop_ms(
    options: TargetOptions,
    analyzer: Analyzer,
    count: int,
    kept: Kept,
    profiler: cProfile.Profile | None = None,
) -> StopRound:
    """`count` stop-mode ticks over one connection as `qmpprof record` opens it; the
    ticks alone run under `profiler` if given."""
    started = time.process_time()
    async with connected(options, analyzer) as (session, _, capturer):
        connect_cpu = time.process_time() - started
        started = time.process_time()
        if profiler is not None:
            profiler.enable()
        pauses: list[float] = []
        path, analysis = await ticks_ms(session, analyzer, capturer, count, "stop", kept, pauses)
        if profiler is not None:
            profiler.disable()
        cpu = (time.process_time() - started) / count
        return StopRound(path, analysis, pauses, cpu, connect_cpu)


class Measured(NamedTuple):
    """Every round's times by name (seconds), each round's stop/floor ratios of the
    tick and of the pause, the samples, the kernel's ABI."""

    times: dict[str, list[float]]
    round_ratios: dict[str, list[float]]
    kept: Kept
    abi: str


def round_ratio(stop: list[float], floor: list[float]) -> float:
    return median(stop) / median(floor) if stop and floor else float("nan")


def measure(args: argparse.Namespace) -> Measured:
    """The floor's and the stop path's times, taking turns; the samples; the ABI."""
    names = ["floor", "stop", "analysis", "paused_stop", "floor_pause", "stop_pause"]
    names += ["paused_stop_pause", "floor_cpu", "stop_cpu", "paused_stop_cpu", "connect_cpu"]
    names += ["baseline_cpu_per_vcpu_sample", "tree_cpu_per_vcpu_sample"]
    names += NONBLOCKING_RATES
    times: dict[str, list[float]] = {name: [] for name in names}
    round_ratios: dict[str, list[float]] = {name: [] for name in ROUND_RATIOS}
    kept: Kept = []
    side_by_side = args.kernel == "memory" and args.ram == "file"
    with (
        tempfile.TemporaryDirectory(prefix="qmpprof-bench-") as directory,
        scratch_ram_file() as ram,
        running_linux(Path(directory), *boot_arguments(args, ram), abi=args.abi) as guest,
        baseline_tree(args.baseline if side_by_side else "none") as baseline,
    ):
        mem_path = ram if args.ram == "file" else None
        from_vmlinux = args.kernel == "vmlinux"
        options = TargetOptions(
            guest.qmp,
            guest.kernel if from_vmlinux else None,
            user_files=WORKLOADS if from_vmlinux else (),
            memory="direct",
            mem_path=mem_path,
        )
        analyzer = build_analyzer(options)
        print(f"kernel {guest.abi} from {args.kernel}, RAM {args.ram}", flush=True)
        paused = replace(options, unwind_paused=True)
        vcpus = vcpu_count(guest.qmp)
        for turn in range(args.rounds):
            started = time.process_time()
            floor_pauses: list[float] = []
            floor = floor_ms(guest.qmp, args.samples, "stop", floor_pauses)
            times["floor"] += floor
            times["floor_pause"] += floor_pauses
            times["floor_cpu"].append((time.process_time() - started) / args.samples)
            stop = asyncio.run(stop_ms(options, analyzer, args.samples, kept))
            round_ratios["tick"].append(round_ratio(stop.path, floor))
            round_ratios["pause"].append(round_ratio(stop.pauses, floor_pauses))
            times["stop"] += stop.path
            times["analysis"] += stop.analysis
            times["stop_pause"] += stop.pauses
            times["stop_cpu"].append(stop.cpu_per_tick)
            times["connect_cpu"].append(stop.connect_cpu)
            round_ratios["cpu"].append(stop.cpu_per_tick / times["floor_cpu"][-1])
            exact = asyncio.run(stop_ms(paused, analyzer, args.samples, []))
            times["paused_stop"] += exact.path
            times["paused_stop_pause"] += exact.pauses
            times["paused_stop_cpu"].append(exact.cpu_per_tick)
            if args.nonblocking_seconds > 0:
                ours, floor_rate = nonblocking_rates(options, guest.qmp, vcpus, args)
                times["nonblocking_vcpu_samples_per_s"].append(ours)
                times["floor_nonblocking_vcpu_samples_per_s"].append(floor_rate)
                round_ratios["nonblocking_rate"].append(ours / floor_rate)
            if baseline is not None:
                work = Path(directory)
                before, after = turns(baseline, guest.qmp, ram, args.samples, work, turn)
                times["baseline_cpu_per_vcpu_sample"].append(before)
                times["tree_cpu_per_vcpu_sample"].append(after)
                round_ratios["after_over_before"].append(after / before)
        if args.profile:
            profile_stop(options, analyzer, args.samples, args.profile)
        return Measured(times, round_ratios, kept, guest.abi)


def nonblocking_rates(
    options: TargetOptions, socket: str, vcpus: int, args: argparse.Namespace
) -> tuple[float, float]:
    """vCPU samples a second, unthrottled, of --nonblocking (every sample unwound and
    symbolized) and of its floor (`info registers -a` alone from a bare socket), one
    after the other (bench/linux_rates.py's runs)."""
    ours = asyncio.run(qmpprof_run(options, args.nonblocking_seconds, "nonblocking"))
    floor = floor_run(socket, args.nonblocking_seconds, "nonblocking", vcpus)
    return ours.samples / ours.seconds, floor.samples / floor.seconds


@contextmanager
def baseline_tree(revision: str) -> Iterator[Path | None]:
    """The qmpprof package of commit `revision` extracted into a temporary directory;
    None (and a line saying why) for `none` or where this clone does not hold it."""
    if revision == "none":
        yield None
        return
    command = ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "qmpprof"]
    try:
        archive = subprocess.run(command, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        reason = getattr(error, "stderr", b"") or str(error).encode()
        print(f"baseline {revision} not measured: {reason.decode(errors='replace').strip()}")
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="qmpprof-baseline-") as directory:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(directory, filter="data")
        yield Path(directory)


def turns(
    baseline: Path, socket: str, ram: str, ticks: int, work: Path, turn: int
) -> tuple[float, float]:
    """(baseline's, this tree's) CPU seconds per vCPU sample, measured one after the
    other, the baseline first on even turns."""
    trees = [("baseline", baseline), ("tree", ROOT)]
    order = trees if turn % 2 == 0 else trees[::-1]
    cost = {
        name: tree_cost(tree, socket, ram, ticks, work / f"derived-{name}") for name, tree in order
    }
    return cost["baseline"], cost["tree"]


def tree_cost(tree: Path, socket: str, ram: str, ticks: int, cache: Path) -> float:
    """The CPU seconds per vCPU sample of `tree`'s stop path (bench/tree_cost.py, a process of
    its own, with a derived cache of its own: another version may keep other entries)."""
    command = [sys.executable, str(TREE_COST), str(tree), socket, ram, "--ticks", str(ticks)]
    environment = os.environ | {"QMPPROF_DERIVED_CACHE": str(cache)}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"tree_cost.py on {tree} failed: {done.stderr.strip()[-800:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    return float(result["cpu_s"]) / max(int(result["samples"]), 1)


def boot_arguments(args: argparse.Namespace, path: str) -> tuple[str, ...]:
    """boot.sh's arguments for the vCPUs, the workloads and the guest RAM asked for."""
    ram = ("--memory-backend", path) if args.ram == "file" else ()
    workloads = ("--workloads", args.workloads) if args.workloads else ()
    return ("--smp", str(args.smp), *workloads, *ram)


def profile_stop(options: TargetOptions, analyzer: Analyzer, count: int, top: int) -> None:
    """Where the stop path's time goes: `top` functions by their own time, then by
    cumulative time, over `count` ticks (connecting left out)."""
    profiler = cProfile.Profile()
    asyncio.run(stop_ms(options, analyzer, count, [], profiler))
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def sample_figures(kept: Kept) -> dict[str, float | int | None]:
    """Windows read per sample, and how many kernel samples unwound into user space."""
    kernel = [sample for _, sample in kept if sample.mode is Mode.KERNEL]
    into_user = [s for s in kernel if any(not frame.is_kernel for frame in s.frames)]
    windows = [len(captured.raw.windows) for captured, _ in kept]
    return {
        "samples": len(kept),
        "windows_per_sample": round(sum(windows) / len(windows), 2) if windows else None,
        "windows_max": max(windows, default=0),
        "kernel_samples": len(kernel),
        "user_samples": sum(sample.mode is Mode.USER for _, sample in kept),
        "kernel_into_user": len(into_user),
        "kernel_into_user_share": round(len(into_user) / len(kernel), 3) if kernel else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=60, help="ticks per method per round")
    parser.add_argument("--abi", help="the Debian kernel to boot (boot.sh's default if none)")
    parser.add_argument("--smp", type=int, default=2, help="the guest's vCPUs (default 2)")
    parser.add_argument(
        "--workloads", help="the programs init starts, as crunch,sleeper (default: all five)"
    )
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    parser.add_argument(
        "--nonblocking-seconds",
        type=float,
        default=3.0,
        help="each round's unthrottled nonblocking run and its floor's (0: none)",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="REV",
        help=f"the commit measured beside this tree (default {BASELINE}, issue 27's; none)",
    )
    parser.add_argument(
        "--ram", choices=("file", "proc"), default="file", help="how qmpprof reads guest RAM"
    )
    parser.add_argument(
        "--kernel",
        choices=("memory", "vmlinux"),
        default="memory",
        help="the kernel read from guest memory (no --kernel), or the debug vmlinux",
    )
    args = parser.parse_args()
    times, round_ratios, kept, abi = measure(args)
    ms = {
        name: round(median(values) * 1000, 3)
        for name, values in times.items()
        if values and name not in NONBLOCKING_RATES
    }
    figures = sample_figures(kept)
    vcpus = figures["samples"] / (args.rounds * args.samples)  # every stop tick, each vCPU
    ms["cpu_per_vcpu_sample"] = round(ms["stop_cpu"] / vcpus, 3) if vcpus else float("nan")
    ratio = round(ms["stop"] / ms["floor"], 2)
    paused_ratio = round(ms["paused_stop"] / ms["floor"], 2)
    pause_ratio = round(ms["stop_pause"] / ms["floor_pause"], 2)
    print(
        f"floor {ms['floor']:.3f} ms, stop {ms['stop']:.3f} ms ({ratio:.2f}x the floor), "
        f"analysis {ms['analysis']:.3f} ms per tick; --unwind-paused {ms['paused_stop']:.3f}"
        f" ms ({paused_ratio:.2f}x)"
    )
    print(
        f"the VM's pause by QEMU's clock: floor {ms['floor_pause']:.3f} ms, stop "
        f"{ms['stop_pause']:.3f} ms ({pause_ratio:.2f}x), --unwind-paused "
        f"{ms['paused_stop_pause']:.3f} ms"
    )
    spread = {
        what: (round(min(values), 2), round(max(values), 2))
        for what, values in round_ratios.items()
        if values
    }
    print(
        f"stop/floor per round: tick {spread['tick'][0]:.2f}-{spread['tick'][1]:.2f}x, "
        f"pause {spread['pause'][0]:.2f}-{spread['pause'][1]:.2f}x ({args.rounds} rounds)"
    )
    print(
        f"our CPU per tick: floor {ms['floor_cpu']:.3f} ms, stop {ms['stop_cpu']:.3f} ms, "
        f"--unwind-paused {ms['paused_stop_cpu']:.3f} ms; connecting {ms['connect_cpu']:.1f} ms"
    )
    print(f"our CPU per vCPU sample: {ms['cpu_per_vcpu_sample']:.3f} ms ({vcpus:g} vCPUs)")
    cpu_ratio = round(ms["stop_cpu"] / ms["floor_cpu"], 2)
    low, high = spread["cpu"]
    print(
        f"our CPU per tick, stop/floor: {cpu_ratio:.2f}x ({low:.2f}-{high:.2f} by round; "
        f"issue 47's target 2.0)"
    )
    nonblocking_ratio = None
    rates = {
        name: round(median(runs), 1) for name in NONBLOCKING_RATES if (runs := times.pop(name))
    }
    if "nonblocking_rate" in spread:
        ours, floor = (
            rates["nonblocking_vcpu_samples_per_s"],
            rates["floor_nonblocking_vcpu_samples_per_s"],
        )
        nonblocking_ratio = round(ours / floor, 2)
        low, high = spread["nonblocking_rate"]
        print(
            f"nonblocking unthrottled: {ours:.0f} vCPU samples/s against its floor's "
            f"{floor:.0f} ({nonblocking_ratio:.2f}x, {low:.2f}-{high:.2f} by round; "
            f"issue 47's target 0.7)"
        )
    after_over_before = None
    if times["tree_cpu_per_vcpu_sample"]:
        before, after = ms["baseline_cpu_per_vcpu_sample"], ms["tree_cpu_per_vcpu_sample"]
        after_over_before = round(after / before, 2)
        low, high = (min(round_ratios["after_over_before"]), max(round_ratios["after_over_before"]))
        print(
            f"CPU per vCPU sample, each tree in a process of its own, taking turns: baseline "
            f"{args.baseline} {before:.3f} ms, this tree {after:.3f} ms: after/before "
            f"{after_over_before:.2f} ({low:.2f}-{high:.2f} by round; issue 27's target 0.25)"
        )
    print(
        f"{figures['windows_per_sample']} memory windows per sample (max "
        f"{figures['windows_max']}); {figures['kernel_into_user']} of "
        f"{figures['kernel_samples']} kernel samples reach user space "
        f"({figures['kernel_into_user_share']}); {figures['user_samples']} user samples"
    )
    summary = {"abi": abi, "ram": args.ram, "kernel": args.kernel, "baseline": args.baseline}
    summary |= {f"{name}_ms": value for name, value in ms.items()}
    ratios: dict[str, float | None] = {"stop_over_floor": ratio, "cpu_over_floor": cpu_ratio}
    ratios["nonblocking_rate_over_floor"] = nonblocking_ratio
    ratios |= {"paused_stop_over_floor": paused_ratio, "after_over_before": after_over_before}
    per_round = {f"{what}_ratio_range": list(bounds) for what, bounds in spread.items()}
    summary |= rates
    print(json.dumps(summary | ratios | {"pause_over_floor": pause_ratio} | per_round | figures))


if __name__ == "__main__":
    main()
