"""How much profiling slows the guest: its progress counter per second of host time.

The example guest (fp build) bumps `workload_progress` as it works. The counter is read
from the guest's RAM file (QEMU shares it with us), so reading it never touches QEMU.

This machine's speed drifts by several percent from one second to the next, more than
the effect measured. So each method connects once, then alternates --rounds short
unprofiled and profiled phases; each profiled phase is compared with the mean of the
unprofiled phases on either side, and the figure is the median of those comparisons.
The methods: qmpprof in stop mode and --nonblocking, and each one's floor (`floor_stop`,
`floor_nonblocking`: the same schedule and QMP commands from a bare socket, no memory
reads, no unwinding: what QEMU's own work costs the guest), at 100 Hz and 1000 Hz.
`noise_pct` is the same comparison with nothing profiling at all: the median size of
the differences this machine shows by itself. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from argparse import Namespace
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ProgressCounter, booted_with_ram_file, median, sampling_method
from tests.guest_vm import Guest

METHODS = [
    (hz, method)
    for hz in (100, 1000)
    for mode in ("stop", "nonblocking")
    for method in (mode, f"floor_{mode}")
]


async def progress_rate(counter: ProgressCounter, phase: Awaitable[object]) -> float:
    """The guest's progress per second while `phase` runs."""
    start, started = counter.read(), time.monotonic()
    await phase
    return (counter.read() - start) / (time.monotonic() - started)


async def slowdowns(
    counter: ProgressCounter,
    profile: Callable[[], Awaitable[object]] | None,
    rounds: int,
    seconds: float,
) -> list[float]:
    """Per round, 100 * (1 - profiled / unprofiled); `profile` None measures the noise."""
    results = []
    before = await progress_rate(counter, asyncio.sleep(seconds))
    for _ in range(rounds):
        phase = profile() if profile is not None else asyncio.sleep(seconds)
        profiled = await progress_rate(counter, phase)
        after = await progress_rate(counter, asyncio.sleep(seconds))
        results.append(100 * (1 - 2 * profiled / (before + after)))
        before = after
    return results


async def method_slowdowns(
    guest: Guest, ram: Path, counter: ProgressCounter, hz: int, method: str, args: Namespace
) -> list[float]:
    async with sampling_method(guest, ram, method) as run_at:
        return await slowdowns(counter, lambda: run_at(hz, args.seconds), args.rounds, args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=15, help="profiled phases per method")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    result: dict[str, float] = {}
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        counter = ProgressCounter(ram, guest.kernel)
        noise = asyncio.run(slowdowns(counter, None, args.rounds, args.seconds))
        result["noise_pct"] = round(median([abs(n) for n in noise]), 1)
        print(f"no profiling: differences {spread(noise)}")
        for hz, method in METHODS:
            found = asyncio.run(method_slowdowns(guest, ram, counter, hz, method, args))
            print(f"{hz} Hz {method}: slowdown {spread(found)}")
            result[f"slowdown_pct_{hz}hz_{method}"] = round(median(found), 1)
        counter.close()
    print(json.dumps(result))


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"median {median(values):.1f} % (from {ordered[0]:.1f} to {ordered[-1]:.1f} %)"


if __name__ == "__main__":
    main()
