"""The highest sampling rate qmpprof sustains, per mode, with full unwinding.

A rate is sustained when, over --seconds of sampling the example guest (fp build) with
unwinding and symbolization of every sample, at least 95 % of the requested samples
are taken on time (neither missed nor late). Each method's rate is raised by 1.5x until
it fails, then bisected. Side by side, the same search for the floor: the same schedule
and QMP commands from a bare socket, with no memory reads and no unwinding, which is as
fast as QEMU on this machine can be sampled at all.

The searches run interleaved: each step tries every method once, one after another, so
that load which comes and goes on a shared host lands on all of them alike and a ratio
of one round still means something. --rounds repeats the whole search; each round's
method/floor ratios are printed, and their median. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import booted_with_ram_file, median, sampling_method
from tests.guest_vm import Guest

ON_TIME = 0.95
METHODS = ("stop", "floor_stop", "nonblocking", "floor_nonblocking")
#: Where each search starts, what it never goes beyond, and its bisection steps.
FIRST_HZ, MAX_HZ, BISECTIONS = 50.0, 20_000.0, 4


class RateSearch:
    """One method's search: the rate to try next, until `done`; `low`, the highest rate
    found sustained."""

    def __init__(self) -> None:
        self.low, self.high = 0.0, FIRST_HZ
        self.rising = True
        self.bisections = 0

    @property
    def done(self) -> bool:
        return self.bisections >= BISECTIONS

    def next_hz(self) -> float:
        return self.high if self.rising else (self.low + self.high) / 2

    def record(self, hz: float, sustained: bool) -> None:
        if self.rising and sustained and self.high < MAX_HZ:
            self.low, self.high = self.high, self.high * 1.5
            return
        if self.rising:
            self.rising = False
            return
        self.low, self.high = (hz, self.high) if sustained else (self.low, hz)
        self.bisections += 1


async def sustained(guest: Guest, ram: Path, method: str, hz: float, seconds: float) -> bool:
    """One trial, over a connection of its own (QEMU serves one client per socket, and
    the floor's is a bare socket)."""
    async with sampling_method(guest, ram, method) as run_at:
        stats = await run_at(hz, seconds)
    fraction = (stats.ticks - stats.late) / max(stats.requested, 1)
    print(f"  {method} {hz:.0f} Hz: {fraction:.1%} on time", flush=True)
    return fraction >= ON_TIME


async def one_round(guest: Guest, ram: Path, seconds: float) -> dict[str, float]:
    """Every method's highest sustained rate, the searches taking turns step by step."""
    searches = {method: RateSearch() for method in METHODS}
    while not all(search.done for search in searches.values()):
        for method, search in searches.items():
            if not search.done:
                hz = search.next_hz()
                search.record(hz, await sustained(guest, ram, method, hz, seconds))
    return {method: search.low for method, search in searches.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each trial")
    parser.add_argument("--rounds", type=int, default=1, help="whole searches, one after another")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    rounds: list[dict[str, float]] = []
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        for number in range(args.rounds):
            rates = asyncio.run(one_round(guest, ram, args.seconds))
            rounds.append(rates)
            shown = ", ".join(f"{method} {hz:.0f} Hz" for method, hz in rates.items())
            print(f"round {number + 1}: {shown}; {ratios_line(rates)}", flush=True)
    result: dict[str, object] = {}
    for method in METHODS:
        result[f"max_hz_{method}"] = round(median([r[method] for r in rounds]))
    for mode in ("stop", "nonblocking"):
        each = [r[mode] / max(r[f"floor_{mode}"], 1) for r in rounds]
        result[f"{mode}_of_floor"] = round(median(each), 2)
        result[f"{mode}_of_floor_by_round"] = [round(ratio, 2) for ratio in each]
    print(json.dumps(result))


def ratios_line(rates: dict[str, float]) -> str:
    return ", ".join(
        f"{mode}/floor {rates[mode] / max(rates[f'floor_{mode}'], 1):.2f}"
        for mode in ("stop", "nonblocking")
    )


if __name__ == "__main__":
    main()
