"""The highest sampling rate qmpprof sustains, per mode, with full unwinding.

A rate is sustained when, over --seconds of sampling the example guest (fp build) with
unwinding and symbolization of every sample, at least 95 % of the requested samples
are taken on time (neither missed nor late). The rate is raised by 1.5x until it fails,
then bisected. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import booted_with_ram_file, sample_for
from tests.guest_vm import Guest

ON_TIME = 0.95


async def on_time_fraction(guest: Guest, ram: Path, hz: float, mode: str, seconds: float) -> float:
    stats = await sample_for(guest, ram, hz, mode, seconds)
    return (stats.ticks - stats.late) / max(stats.requested, 1)


def max_rate(guest: Guest, ram: Path, mode: str, seconds: float) -> float:
    def sustained(hz: float) -> bool:
        fraction = asyncio.run(on_time_fraction(guest, ram, hz, mode, seconds))
        print(f"  {mode} {hz:.0f} Hz: {fraction:.1%} on time")
        return fraction >= ON_TIME

    low, high = 0.0, 50.0
    while sustained(high) and high < 20_000:
        low, high = high, high * 1.5
    for _ in range(4):
        middle = (low + high) / 2
        low, high = (middle, high) if sustained(middle) else (low, middle)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each trial")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    result = {}
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        for mode in ("stop", "nonblocking"):
            result[f"max_hz_{mode}"] = round(max_rate(guest, ram, mode, args.seconds))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
