"""How much profiling slows the guest: its progress counter per second of host time.

The example guest (fp build) bumps `workload_progress` as it works. The counter is read
from the guest's RAM file (QEMU shares it with us), so reading it never touches QEMU.
Unprofiled phases alternate with profiled ones (stop mode and --nonblocking, at 100 Hz
and 1000 Hz) so that drifts in this machine's load hit both; each profiled phase is
compared with the mean of the unprofiled phases around it. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ProgressCounter, booted_with_ram_file, sample_for
from tests.guest_vm import Guest

MODES = [(100, "stop"), (100, "nonblocking"), (1000, "stop"), (1000, "nonblocking")]


def unprofiled_rate(counter: ProgressCounter, seconds: float) -> float:
    start, started = counter.read(), time.monotonic()
    time.sleep(seconds)  # the guest runs undisturbed: this is the measurement itself
    return (counter.read() - start) / (time.monotonic() - started)


async def profiled_rate(
    guest: Guest, ram: Path, counter: ProgressCounter, hz: int, mode: str, seconds: float
) -> float:
    start, started = counter.read(), time.monotonic()
    await sample_for(guest, ram, hz, mode, seconds)
    return (counter.read() - start) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    result: dict[str, float] = {}
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        counter = ProgressCounter(ram, guest.kernel)
        baseline = unprofiled_rate(counter, args.seconds)
        for hz, mode in MODES:
            rate = asyncio.run(profiled_rate(guest, ram, counter, hz, mode, args.seconds))
            after = unprofiled_rate(counter, args.seconds)
            reference = (baseline + after) / 2
            slowdown = 100 * (1 - rate / reference)
            print(
                f"{hz} Hz {mode}: {rate:.3g}/s against {reference:.3g}/s unprofiled "
                f"-> slowdown {slowdown:.1f} %"
            )
            result[f"slowdown_pct_{hz}hz_{mode}"] = round(slowdown, 1)
            baseline = after
        counter.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
