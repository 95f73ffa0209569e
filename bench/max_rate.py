"""The highest sampling rate qmpprof sustains, per mode, with full unwinding.

A rate is sustained when, over --seconds of sampling the example guest (fp build) with
unwinding and symbolization of every sample, at least 95 % of the requested samples
are taken on time (neither missed nor late). The rate is raised by 1.5x until it fails,
then bisected. Side by side, the same search for the floor: the same schedule and QMP
commands from a bare socket, with no memory reads and no unwinding, which is as fast as
QEMU on this machine can be sampled at all. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import booted_with_ram_file, sampling_method
from tests.guest_vm import Guest

ON_TIME = 0.95


async def max_rate(guest: Guest, ram: Path, method: str, seconds: float) -> float:
    async with sampling_method(guest, ram, method) as run_at:

        async def sustained(hz: float) -> bool:
            stats = await run_at(hz, seconds)
            fraction = (stats.ticks - stats.late) / max(stats.requested, 1)
            print(f"  {method} {hz:.0f} Hz: {fraction:.1%} on time")
            return fraction >= ON_TIME

        low, high = 0.0, 50.0
        while await sustained(high) and high < 20_000:
            low, high = high, high * 1.5
        for _ in range(4):
            middle = (low + high) / 2
            low, high = (middle, high) if await sustained(middle) else (low, middle)
        return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each trial")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    result: dict[str, float] = {}
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        for mode in ("stop", "nonblocking"):
            for method in (mode, f"floor_{mode}"):
                rate = asyncio.run(max_rate(guest, ram, method, args.seconds))
                result[f"max_hz_{method}"] = round(rate)
            result[f"{mode}_of_floor"] = round(
                result[f"max_hz_{mode}"] / max(result[f"max_hz_floor_{mode}"], 1), 2
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
