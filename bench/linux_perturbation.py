"""How much profiling slows the Linux example guest, by its own work counter, and how
often --nonblocking's stacks tear there.

Boots examples/linux (Debian's kernel, 2 vCPUs, its RAM a file under /dev/shm) with its
usual busy workloads, or attaches to one already running (--qmp and --mem-path). The
work counter: `crunch` and `crunchnofp` (workloads/crunch.c) count the calls of their
mix function in a static struct that starts with a marker. Its page is found in the
guest's RAM file by the marker, once both processes run: the copies whose count moves
are the processes' own (the program files' copies in the initramfs stay 0), and their
sum is the guest's work. It is read from the RAM file QEMU shares with us, as
perturbation.py reads the example guest's counter: reading it never touches QEMU. Two
CPU-bound processes among the guest's six busy threads: their progress follows the
vCPU time the guest gets, whatever takes it (a pause, or QEMU's monitor thread and
qmpprof on the host's cores). A physical page could move under us (Linux compacting);
a phase in which the counter does not move is found again and measured again.

As perturbation.py does, each method connects once (as `qmpprof record` connects: the
debug vmlinux, its KASLR slide, every workload's binary, the sysroot) and alternates
--rounds unprofiled and profiled phases; each profiled phase is compared with the mean
of the unprofiled ones on either side, the figure is the median. Methods: stop mode and
--nonblocking at 99 Hz, every sample symbolized, and each one's floor (bench/common.py
floor_loop: the same schedule and QMP commands from a bare socket, no memory read,
nothing unwound: what QEMU's own work costs the guest). `noise_pct`: the same
comparison with nothing profiling (the median size of this machine's own differences).

Then --nonblocking at 200 Hz, --torn-runs one-second runs without retakes (every
sample published as first read) alternating with as many with them (record's default,
sampler.MAX_RETAKES), over one connection: the share of published samples that
are torn (Sample.torn: a return address that follows no call), that read another task
than the registers' (sampler.switched_task), and, with retakes, the share taken again
and the extra register reads per tick. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import floor_loop, median
from bench.perturbation import spread
from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.commands.connect import connected
from qmpprof.model import CapturedSample, RecordStats
from qmpprof.record.sampler import MAX_RETAKES, LoopConfig, sample_loop, switched_task
from tests.guest_vm import BareQmp, scratch_ram_file
from tests.linux_vm import BUILD, running_linux

#: workloads/crunch.c's marker, NUL-padded to its 32 bytes; the count follows it.
MARKER = b"qmpprof-linux crunch progress:\0\0"
#: How long to watch each copy of the marker to tell the processes' from the files'.
WATCH_S = 0.5
#: How long to wait for both crunch processes' counters to show.
FIND_TIMEOUT_S = 60.0
#: Processes that count (crunch and crunchnofp).
COUNTERS = 2


class CrunchProgress:
    """The sum of the crunch processes' `progress.rounds`, read from the guest's RAM file."""

    def __init__(self, ram_file: Path) -> None:
        self._file = ram_file.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, prot=mmap.PROT_READ)
        self._offsets: list[int] = []
        self.found_again = 0
        self.find()

    def _candidates(self) -> list[int]:
        found, at = [], self._map.find(MARKER)
        while at >= 0:
            found.append(at + len(MARKER))
            at = self._map.find(MARKER, at + 1)
        return found

    def _count_at(self, offset: int) -> int:
        return int.from_bytes(self._map[offset : offset + 8], "little")

    def find(self) -> None:
        """The copies whose count moves: the running processes' (at most COUNTERS)."""
        deadline = time.monotonic() + FIND_TIMEOUT_S
        while True:
            candidates = self._candidates()
            before = {offset: self._count_at(offset) for offset in candidates}
            time.sleep(WATCH_S)
            moving = [o for o in candidates if self._count_at(o) != before[o]]
            if len(moving) >= COUNTERS or (moving and time.monotonic() > deadline):
                self._offsets = moving[:COUNTERS]
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no crunch progress counter moves in {len(candidates)} copies")

    def read(self) -> int:
        return sum(self._count_at(offset) for offset in self._offsets)

    def close(self) -> None:
        self._map.close()
        self._file.close()


async def progress_rate(counter: CrunchProgress, phase: Awaitable[object]) -> float:
    """The guest's progress per second while `phase` runs."""
    start, started = counter.read(), time.monotonic()
    await phase
    return (counter.read() - start) / (time.monotonic() - started)


async def steady_rate(counter: CrunchProgress, phase: Callable[[], Awaitable[object]]) -> float:
    """The guest's progress per second while `phase()` runs; a phase in which it did not
    move (the counter's page moved) is run again after the counter is found again."""
    for _ in range(3):
        rate = await progress_rate(counter, phase())
        if rate > 0:
            return rate
        counter.found_again += 1
        counter.find()
    raise RuntimeError("the crunch progress counter stopped moving")


async def slowdowns(
    counter: CrunchProgress,
    profile: Callable[[], Awaitable[object]] | None,
    rounds: int,
    seconds: float,
) -> list[float]:
    """Per round, 100 * (1 - profiled / unprofiled); `profile` None measures the noise."""

    def idle() -> Awaitable[object]:
        return asyncio.sleep(seconds)

    results = []
    before = await steady_rate(counter, idle)
    for _ in range(rounds):
        profiled = await steady_rate(counter, profile or idle)
        after = await steady_rate(counter, idle)
        results.append(100 * (1 - 2 * profiled / (before + after)))
        before = after
    return results


@dataclass
class Published:
    """What a run of nonblocking sampling published, summed over runs."""

    samples: int = 0
    torn: int = 0
    switched: int = 0
    ticks: int = 0
    retaken: int = 0
    retakes: int = 0
    seconds: float = 0.0
    rates: list[float] = field(default_factory=list)

    def add(self, stats: RecordStats, torn: int, switched: int) -> None:
        self.samples += stats.samples
        self.ticks += stats.ticks
        self.torn += torn
        self.switched += switched
        self.retaken += stats.retaken
        self.retakes += stats.retakes
        self.seconds += stats.elapsed_s
        self.rates.append(stats.rate_hz)

    def pct(self, count: int) -> float:
        return round(100 * count / self.samples, 2) if self.samples else float("nan")


#: Runs qmpprof's loop at `hz` for `seconds`, nonblocking or not, with `retakes`: the
#: stats, and how many published samples were torn and read another task.
RunAt = Callable[[float, float, bool, int], Awaitable[tuple[RecordStats, int, int]]]


@asynccontextmanager
async def qmpprof_loop(options: TargetOptions, analyzer: Analyzer) -> AsyncIterator[RunAt]:
    """qmpprof's sampling loop over one connection, every sample symbolized."""
    async with connected(options, analyzer) as (session, _, capturer):

        async def run(
            hz: float, seconds: float, nonblocking: bool, retakes: int
        ) -> tuple[RecordStats, int, int]:
            counts = {"torn": 0, "switched": 0}

            def analyse_all(captured: list[CapturedSample]) -> None:
                for one in captured:
                    counts["torn"] += analyzer.symbolize(one).torn
                    counts["switched"] += switched_task(one)

            config = LoopConfig(1 / hz, seconds, nonblocking=nonblocking, retakes=retakes)
            stats = await sample_loop(session, capturer, config, asyncio.Event(), analyse_all)
            return stats, counts["torn"], counts["switched"]

        yield run


async def measure_torn(run: RunAt, seconds: float, runs: int) -> dict[int, Published]:
    """Nonblocking at 200 Hz, one-second runs without retakes and with, taking turns."""
    published = {0: Published(), MAX_RETAKES: Published()}
    for _ in range(runs):
        for retakes, sums in published.items():
            stats, torn, switched = await run(200, seconds, True, retakes)
            sums.add(stats, torn, switched)
    return published


@contextmanager
def linux_guest(args: argparse.Namespace) -> Iterator[TargetOptions]:
    """The guest to measure: booted here (stopped on the way out) or the one given."""
    with ExitStack() as stack:
        if args.qmp is not None:
            if args.mem_path is None:
                raise SystemExit("--qmp needs --mem-path (the guest's RAM file)")
            qmp, ram, kernel, sysroot = args.qmp, args.mem_path, args.kernel, args.sysroot
        else:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="qmpprof-bench-"))
            ram = stack.enter_context(scratch_ram_file())
            guest = stack.enter_context(
                running_linux(Path(directory), "--memory-backend", ram, abi=args.abi)
            )
            qmp, kernel, sysroot = guest.qmp, guest.kernel, guest.sysroot
            print(f"booted kernel {guest.abi}", flush=True)
        yield TargetOptions(
            qmp, kernel, user_dirs=(BUILD,), sysroot=sysroot, memory="direct", mem_path=ram
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=15, help="profiled phases per method")
    parser.add_argument("--rate", type=float, default=99.0, help="Hz of the slowdown phases")
    parser.add_argument(
        "--torn-runs", type=int, default=10, help="one-second 200 Hz runs per retake setting"
    )
    parser.add_argument("--abi", help="the Debian kernel to boot (boot.sh's default if none)")
    parser.add_argument("--qmp", help="attach to this running guest's QMP socket instead")
    parser.add_argument("--mem-path", help="with --qmp: its RAM file (boot.sh --memory-backend)")
    parser.add_argument("--kernel", type=Path, help="with --qmp: its debug vmlinux")
    parser.add_argument("--sysroot", type=Path, default=BUILD / "sysroot")
    args = parser.parse_args()
    result: dict[str, object] = {}
    with linux_guest(args) as options:
        assert options.mem_path is not None
        counter = CrunchProgress(Path(options.mem_path))
        analyzer = build_analyzer(options)
        noise = asyncio.run(slowdowns(counter, None, args.rounds, args.seconds))
        result["noise_pct"] = round(median([abs(n) for n in noise]), 1)
        print(f"no profiling: differences {spread(noise)}", flush=True)
        hz = args.rate
        for mode in ("stop", "floor_stop", "nonblocking", "floor_nonblocking"):
            found, rates = asyncio.run(mode_slowdowns(options, analyzer, counter, mode, args))
            print(
                f"{hz:g} Hz {mode}: slowdown {spread(found)}; sampled at "
                f"{median(rates):.1f} Hz (median of the phases)",
                flush=True,
            )
            result[f"slowdown_pct_{hz:g}hz_{mode}"] = round(median(found), 1)
            result[f"rate_hz_{hz:g}hz_{mode}"] = round(median(rates), 1)
        published = asyncio.run(torn_runs(options, analyzer, args))
        result |= torn_figures(published)
        result["counter_found_again"] = counter.found_again
        counter.close()
    print(json.dumps(result))


async def mode_slowdowns(
    options: TargetOptions,
    analyzer: Analyzer,
    counter: CrunchProgress,
    mode: str,
    args: argparse.Namespace,
) -> tuple[list[float], list[float]]:
    """The slowdowns of one mode's phases, and the rate each phase sampled at."""
    rates: list[float] = []
    if mode.startswith("floor_"):
        qmp = BareQmp(options.qmp_socket)
        try:

            async def floor_phase() -> None:
                stats = await floor_loop(qmp, args.rate, mode.removeprefix("floor_"), args.seconds)
                rates.append(stats.rate_hz)

            return await slowdowns(counter, floor_phase, args.rounds, args.seconds), rates
        finally:
            qmp.close()
    async with qmpprof_loop(options, analyzer) as run:

        async def phase() -> None:
            stats, _, _ = await run(args.rate, args.seconds, mode == "nonblocking", MAX_RETAKES)
            rates.append(stats.rate_hz)

        found = await slowdowns(counter, phase, args.rounds, args.seconds)
    return found, rates


async def torn_runs(
    options: TargetOptions, analyzer: Analyzer, args: argparse.Namespace
) -> dict[int, Published]:
    async with qmpprof_loop(options, analyzer) as run:
        return await measure_torn(run, 1.0, args.torn_runs)


def torn_figures(published: dict[int, Published]) -> dict[str, object]:
    """The 200 Hz figures, printed, and as the JSON's entries."""
    before, after = published[0], published[MAX_RETAKES]
    for name, sums in (("without retakes", before), (f"with {MAX_RETAKES} retakes", after)):
        print(
            f"200 Hz nonblocking {name}: {sums.samples} samples published at "
            f"{median(sums.rates):.1f} Hz, torn {sums.torn} ({sums.pct(sums.torn)} %), "
            f"another task than the registers' {sums.switched} ({sums.pct(sums.switched)} %)"
            + (
                f"; retaken {sums.retaken} ({sums.pct(sums.retaken)} %) in {sums.retakes} "
                f"more register reads ({sums.retakes / max(sums.ticks, 1):.2f} a tick)"
                if sums is after
                else ""
            ),
            flush=True,
        )
    return {
        "samples_200hz_before": before.samples,
        "torn_pct_200hz_before": before.pct(before.torn),
        "switched_pct_200hz_before": before.pct(before.switched),
        "rate_hz_200hz_before": round(median(before.rates), 1),
        "samples_200hz_after": after.samples,
        "torn_pct_200hz_after": after.pct(after.torn),
        "switched_pct_200hz_after": after.pct(after.switched),
        "retaken_pct_200hz": after.pct(after.retaken),
        "retakes_per_tick_200hz": round(after.retakes / max(after.ticks, 1), 3),
        "rate_hz_200hz_after": round(median(after.rates), 1),
    }


if __name__ == "__main__":
    main()
