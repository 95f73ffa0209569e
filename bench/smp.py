"""What one sample costs against the number of vCPUs, beside the bare-socket floor.

The example guest's user workload (three processes, every CPU in the scheduler) is
booted with --smp 1, 2, 4 and 8 in turn; on each, --rounds rounds of --samples ticks
of every method, taking turns, each tick after GAP_S of running VM:

  floor        stop, info registers -a, cont from a bare socket (no memory, no unwind)
  stop         qmpprof's stop-mode tick (sample_cost.py's `stop`: primed stop,
               registers, each vCPU's stack, cont)
  floor_nb     info registers -a on the running VM from a bare socket
  nonblocking  qmpprof's --nonblocking tick
  analysis     what the recorder does after a stop tick, per tick (all vCPUs)

For each count the medians, what qmpprof adds to its floor, and at the end the cost
per added vCPU (least-squares slope over the four counts). Boots are compared with
each other, so a quiet host gives the clearest slope; ratios inside one row are
measured side by side. On 2 busy host cores the defaults take 1-3 minutes:
8 TCG vCPUs there make a stop cost tens of milliseconds. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import booted_with_ram_file, median
from bench.sample_cost import floor_ms, qmpprof_ms

COUNTS = (1, 2, 4, 8)
#: Columns of the table: (key, heading).
COLUMNS = (
    ("floor", "floor"),
    ("stop", "stop"),
    ("stop_over_floor", "+floor"),
    ("floor_nb", "floor_nb"),
    ("nonblocking", "nonblock"),
    ("nonblocking_over_floor", "+floor_nb"),
    ("analysis", "analysis"),
)


def measure(count: int, args: argparse.Namespace) -> dict[str, float]:
    """Median milliseconds per tick of every method on a guest with `count` vCPUs."""
    times: dict[str, list[float]] = {"floor": [], "stop": [], "floor_nb": []}
    times |= {"nonblocking": [], "analysis": []}
    boot = ("--accel", args.accel, "--smp", str(count), "--workload", "user")
    with booted_with_ram_file(*boot, "--timeout", "180") as (guest, ram):
        for _ in range(args.rounds):
            times["floor"] += floor_ms(guest.qmp, args.samples, "stop")
            stop, analysis = asyncio.run(qmpprof_ms(guest, ram, args.samples, "stop"))
            times["stop"] += stop
            times["analysis"] += analysis
            times["floor_nb"] += floor_ms(guest.qmp, args.samples, "nonblocking")
            times["nonblocking"] += asyncio.run(
                qmpprof_ms(guest, ram, args.samples, "nonblocking")
            )[0]
    ms = {name: median(values) * 1000 for name, values in times.items()}
    ms["stop_over_floor"] = ms["stop"] - ms["floor"]
    ms["nonblocking_over_floor"] = ms["nonblocking"] - ms["floor_nb"]
    return ms


def slope(counts: list[int], values: list[float]) -> float:
    """Least-squares milliseconds per added vCPU."""
    mean_x = sum(counts) / len(counts)
    mean_y = sum(values) / len(values)
    spread = sum((x - mean_x) ** 2 for x in counts)
    if not spread:
        return float("nan")  # one count: no slope
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(counts, values, strict=True)) / spread


def table(rows: dict[int, dict[str, float]]) -> list[str]:
    """The per-count rows and the slope row, milliseconds per tick."""
    lines = ["vCPUs " + "".join(f"{heading:>10}" for _, heading in COLUMNS) + "   (ms/tick)"]
    for count, ms in rows.items():
        lines.append(f"{count:>5} " + "".join(f"{ms[key]:>10.3f}" for key, _ in COLUMNS))
    counts = list(rows)
    slopes = [slope(counts, [ms[key] for ms in rows.values()]) for key, _ in COLUMNS]
    lines.append("/vCPU " + "".join(f"{value:>10.3f}" for value in slopes))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=60, help="ticks per method per round")
    parser.add_argument("--accel", default="tcg")
    parser.add_argument("--counts", default=",".join(map(str, COUNTS)), help="vCPU counts")
    args = parser.parse_args()
    counts = [int(count) for count in args.counts.split(",")]
    rows = {count: measure(count, args) for count in counts}
    print("\n".join(table(rows)))
    slopes = {key: round(slope(counts, [ms[key] for ms in rows.values()]), 4) for key, _ in COLUMNS}
    rounded = {str(count): {k: round(v, 3) for k, v in ms.items()} for count, ms in rows.items()}
    print(json.dumps({"ms_per_tick": rounded, "ms_per_added_vcpu": slopes}))


if __name__ == "__main__":
    main()
