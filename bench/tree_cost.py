"""One qmpprof tree's stop-mode CPU per vCPU sample on a running Linux guest: the
`qmpprof` package is imported from TREE (another commit's, extracted by
linux_sample_cost.py --baseline, or this one's), so that two versions are measured the
same way, side by side, on one guest.

Connects as `qmpprof record` does (no vmlinux: the kernel read from guest memory; the
RAM file mapped), takes WARM_TICKS untimed ticks, then TICKS stop-mode ticks (primed
`stop`, registers and copy while paused, `cont`, the copies unwound and symbolized), a
GAP_S sleep before each, as bench/sample_cost.py's ticks. Prints one JSON object: this
process's CPU seconds over the timed ticks, the ticks, the vCPU samples.
Only calls that issue 27's baseline (267d6a9) has too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

WARM_TICKS = 20
#: The guest runs between two ticks, as it does between a sampler's ticks.
GAP_S = 0.002


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="the directory holding the qmpprof package")
    parser.add_argument("socket", help="the guest's QMP socket")
    parser.add_argument("ram", help="the guest's RAM file")
    parser.add_argument("--ticks", type=int, default=100)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import qmpprof

    where = Path(qmpprof.__file__).resolve()
    if not where.is_relative_to(args.tree.resolve()):
        raise SystemExit(f"qmpprof came from {where}, not from {args.tree}")
    print(json.dumps(asyncio.run(measure(args.socket, args.ram, args.ticks))))


async def measure(socket: str, ram: str, ticks: int) -> dict[str, float]:
    from qmpprof.commands.common import TargetOptions, build_analyzer
    from qmpprof.commands.connect import connected
    from qmpprof.model import RecordStats
    from qmpprof.record.sampler import paused_take

    options = TargetOptions(socket, None, memory="direct", mem_path=ram)
    analyzer = build_analyzer(options)
    async with connected(options, analyzer) as (session, _, capturer):

        async def tick() -> int:
            session.prime("stop")
            time.sleep(GAP_S)
            taken = await paused_take(session, capturer, RecordStats())
            captured = await capturer.finish(taken) if taken is not None else []
            for one in captured:
                analyzer.symbolize(one)
            return len(captured)

        for _ in range(WARM_TICKS):
            await tick()
        started = time.process_time()
        samples = sum([await tick() for _ in range(ticks)])
        cpu = time.process_time() - started
    return {"cpu_s": cpu, "ticks": ticks, "samples": samples}


if __name__ == "__main__":
    main()
