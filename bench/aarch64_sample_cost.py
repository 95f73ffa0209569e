"""What one sample costs on the AArch64 example guest, beside the x86-64 one, in one run.

Both guests run the user workload on two vCPUs (fp builds), booted together; the
methods take turns in --rounds rounds (this machine's load changes by the second):

  floor_ms     a bare-socket loop of stop, info registers -a, cont (no memory read)
  stop_ms      qmpprof's stop-mode tick: pause, registers, stacks, resume, guest RAM read
               on this host (direct; AArch64's page-table roots from QEMU's gdbstub and
               the guest's process table: docs/guides/aarch64.md), the OS adapter naming
               each sample's process
  cpu_ms       this process's CPU per vCPU sample over the stop-mode ticks, analysis
               included (registers parsed, stacks unwound and named)
  paused_ms    how long each stop-mode tick kept the VM paused, by QEMU's clock
  floor_paused_ms  the same for the floor's ticks

Figures are medians of all iterations; the ratios are AArch64's over x86-64's and
each architecture's tick over its own floor. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import sample_cost
from bench.common import booted_guest, booted_with_ram_file, median, sampling_session
from bench.sample_cost import ticks_ms
from qmpprof.model import CapturedSample, Sample
from tests.guest_vm import Guest

BOOT = ("--workload", "user", "--smp", "2", "--accel", "tcg")


def floor_ms(guest: Guest, count: int, paused: list[float]) -> list[float]:
    return sample_cost.floor_ms(guest.qmp, count, "stop", paused)


async def stop_ms(
    guest: Guest, ram: Path | None, count: int, cpu: list[float], paused: list[float]
) -> list[float]:
    async with sampling_session(guest, "direct", ram, with_adapter=True) as (
        session,
        analyzer,
        capturer,
    ):
        kept: list[tuple[CapturedSample, Sample]] = []
        started = time.process_time()
        path, _ = await ticks_ms(
            session,
            analyzer,
            capturer,
            count,
            "stop",
            kept,
            pauses=paused,
        )
        if kept:
            cpu.append((time.process_time() - started) / len(kept))
        return path


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {
        arch: {"floor_ms": [], "stop_ms": [], "cpu_ms": [], "paused_ms": [], "floor_paused_ms": []}
        for arch in ("x86_64", "aarch64")
    }
    with ExitStack() as stack:
        x86, ram = stack.enter_context(booted_with_ram_file(*BOOT))
        arm = stack.enter_context(booted_guest(*BOOT, "--arch", "aarch64"))
        guests = {"x86_64": (x86, ram), "aarch64": (arm, None)}
        for _ in range(args.rounds):
            for arch, (guest, ram_file) in guests.items():
                mine = figures[arch]
                cpu: list[float] = []
                paused: list[float] = []
                floor_paused: list[float] = []
                mine["floor_ms"] += [1000 * t for t in floor_ms(guest, args.samples, floor_paused)]
                mine["floor_paused_ms"] += [1000 * p for p in floor_paused]
                path = asyncio.run(stop_ms(guest, ram_file, args.samples, cpu, paused))
                mine["stop_ms"] += [1000 * t for t in path]
                mine["cpu_ms"] += [1000 * c for c in cpu]
                mine["paused_ms"] += [1000 * p for p in paused]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=40, help="ticks per method per round")
    args = parser.parse_args()
    figures = measure(args)
    medians = {
        arch: {name: round(median(values), 3) for name, values in mine.items() if values}
        for arch, mine in figures.items()
    }
    for arch, mine in medians.items():
        ratio = mine["stop_ms"] / mine["floor_ms"]
        print(f"{arch:8} " + "  ".join(f"{k} {v:.3f}" for k, v in mine.items()), end="")
        print(f"  stop/floor {ratio:.2f}")
    arm, x86 = medians["aarch64"], medians["x86_64"]
    ratios = {name: round(arm[name] / x86[name], 2) for name in x86 if x86[name]}
    print("aarch64 / x86_64: " + "  ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    print(json.dumps({"medians": medians, "aarch64_over_x86_64": ratios}))


if __name__ == "__main__":
    main()
