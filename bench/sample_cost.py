"""What one sample costs, measured side by side on the example guest (fp build).

  floor_ms        a bare-socket loop of the QMP commands a stopped sample needs
                  (stop, info registers -a, cont), no memory reads, no unwinding
  floor_nonblocking_ms  the same for a sample of the running VM (info registers -a)
  stop_ms         qmpprof's sampling path in stop mode: pause, registers, a copy of the
                  stack (direct memory), resume; with `stop` primed ahead of the tick, as
                  the sampler does whenever half a millisecond is left before a tick
                  (always, at the rates stop mode reaches)
  stop_unprimed_ms  the same with `stop` sent whole
  analysis_ms     what is left of one tick after the VM runs again (the unwind of the
                  stacks copied while it was paused, symbols, torn-stack checks), which
                  the recorder does between ticks
  nonblocking_ms  qmpprof --nonblocking: registers and stack while the VM runs, unwind
  nonblocking_primed_ms  the same when QEMU has had time to read the request ahead, as
                  the sampler lets it between ticks at rates with time to spare
                  (QmpSession.prime; the floor sends each command whole)
  naive_ms        the naive method: stop, registers, one HMP `x` per frame (following
                  the frame-pointer chain), cont; median of the walks at depth >= 8
  cpu_per_vcpu_sample_ms  this process's CPU time over the stop-mode ticks (analysis
                  included) per vCPU sample: what one sample costs qmpprof (issue 27)
  session_ms      the floor's three commands (stop, info registers -a, cont) through
                  qmpprof's own client, QmpSession.execute: what speaking QMP ourselves
                  costs over a bare socket
  qemu_qmp_ms     the same three commands through the qemu.qmp library's QMPClient,
                  the client qmpprof chose not to use (`pip install -e .[bench]`; the
                  column is skipped, with one line saying so, when it is missing)
The methods take turns in --rounds rounds (this machine's load changes by the second),
every tick of every method follows 2 ms of running VM (GAP_S, untimed), and each figure
is the median of all its iterations; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REGISTERS, booted_with_ram_file, floor_tick, median, sampling_session
from qmpprof.analysis import Analyzer
from qmpprof.model import CapturedSample, RecordStats, Sample
from qmpprof.record.capture import Capturer
from qmpprof.record.sampler import paused_take, running_capture
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from tests.guest_vm import BareQmp, Guest

DEEP = 8
#: Untimed, before every tick of every method: the VM runs between a sampler's ticks,
#: and a `stop` right after a `cont` (ticks back to back) is cheaper than one that must
#: interrupt a running vCPU. 2 ms is a tick at 500 Hz.
GAP_S = 0.002


def timed(count: int, once: Callable[[], object]) -> list[float]:
    durations = []
    for _ in range(count):
        time.sleep(GAP_S)
        started = time.perf_counter()
        once()
        durations.append(time.perf_counter() - started)
    return durations


#: Whether the qemu.qmp library is installed (the optional `bench` dependencies).
HAVE_QEMU_QMP = importlib.util.find_spec("qemu") is not None and (
    importlib.util.find_spec("qemu.qmp") is not None
)


def floor_ms(socket: str, count: int, mode: str, pauses: list[float] | None = None) -> list[float]:
    """The floor's ticks (bench.common.floor_tick) over the QMP socket at `socket`; each
    stop-mode tick's pause by QEMU's clock (STOP to RESUME) appended to `pauses`."""
    qmp = BareQmp(socket)

    def tick() -> None:
        qmp.run_events.clear()
        floor_tick(qmp, mode)
        stamps = dict(qmp.run_events)
        if pauses is not None and {"STOP", "RESUME"} <= stamps.keys():
            pauses.append(stamps["RESUME"] - stamps["STOP"])

    try:
        return timed(count, tick)
    finally:
        qmp.close()


def naive_ms(guest: Guest, count: int) -> tuple[list[float], list[int]]:
    """Stop, registers, one `x /2gx` per frame up the rbp chain, cont; and the depth."""
    qmp = BareQmp(guest.qmp)
    depths: list[int] = []

    def once() -> None:
        qmp.call("stop")
        text = qmp.call("human-monitor-command", REGISTERS)
        regs = parse_all(str(text))[0]
        rbp, depth = regs.rbp, 1
        while rbp and depth < 64:
            line = str(qmp.call("human-monitor-command", {"command-line": f"x /2gx {rbp:#x}"}))
            words = line.split(":", 1)[1].split() if ":" in line else []
            if len(words) < 2 or "Cannot" in line:
                break
            rbp, depth = int(words[0], 16), depth + 1
        depths.append(depth)
        qmp.call("cont")

    try:
        return timed(count, once), depths
    finally:
        qmp.close()


async def qmpprof_ms(
    guest: Guest, ram: Path, count: int, mode: str, cpu: list[float] | None = None
) -> tuple[list[float], list[float]]:
    """(sampling-path times, analysis times): the recorder analyses between ticks. This
    process's CPU seconds per vCPU sample appended to `cpu` if given."""
    async with sampling_session(guest, mem_path=ram) as (session, analyzer, capturer):
        kept: list[tuple[CapturedSample, Sample]] = []
        started = time.process_time()
        times = await ticks_ms(session, analyzer, capturer, count, mode, kept)
        if cpu is not None and kept:
            cpu.append((time.process_time() - started) / len(kept))
        return times


async def ticks_ms(
    session: QmpSession,
    analyzer: Analyzer,
    capturer: Capturer,
    count: int,
    mode: str,
    kept: list[tuple[CapturedSample, Sample]] | None = None,
    pauses: list[float] | None = None,
) -> tuple[list[float], list[float]]:
    """`count` ticks of `mode` over an open connection: (sampling-path times, analysis
    times), each sample captured and analysed also appended to `kept` if given, each
    stop-mode tick's pause by QEMU's clock to `pauses`. In stop mode the path ends when
    the VM runs again: the copied stacks unwound after that are analysis."""
    analysis: list[float] = []

    async def once() -> None:
        stats = RecordStats()
        if mode.startswith("stop"):
            taken = await paused_take(session, capturer, stats)
            started = time.perf_counter()
            captured = await capturer.finish(taken) if taken is not None else []
        else:
            captured = await running_capture(session, capturer, stats) or []
            started = time.perf_counter()
        samples = [analyzer.symbolize(one) for one in captured]
        analysis.append(time.perf_counter() - started)
        if pauses is not None and stats.paused_s:
            pauses.append(stats.paused_s)
        if kept is not None:
            kept.extend(zip(captured, samples, strict=True))

    async def before() -> None:
        if mode == "stop":
            session.prime("stop")
        elif mode == "nonblocking_primed":
            capturer.prime()
        time.sleep(GAP_S)  # untimed: the sampler waits for its tick

    totals = await timed_async(count, once, before)
    return [t - a for t, a in zip(totals, analysis, strict=True)], analysis


async def client_ms(guest: Guest, count: int, client: str) -> list[float]:
    """The floor's stop, info registers -a and cont through a QMP client library:
    qmpprof's QmpSession or qemu.qmp's QMPClient."""
    execute: Callable[..., Awaitable[Any]]
    if client == "session":
        session = await QmpSession.connect(guest.qmp)
        execute, close = session.execute, session.close
    else:
        from qemu.qmp import QMPClient

        library = QMPClient("qmpprof-bench")
        await library.connect(guest.qmp)
        execute, close = library.execute, library.disconnect

    async def once() -> None:
        await execute("stop")
        await execute("human-monitor-command", REGISTERS)
        await execute("cont")

    async def before() -> None:
        time.sleep(GAP_S)  # untimed, as for the floor

    try:
        return await timed_async(count, once, before)
    finally:
        await close()


async def timed_async(
    count: int, once: Callable[[], Awaitable[None]], before: Callable[[], Awaitable[None]]
) -> list[float]:
    durations = []
    for _ in range(count):
        await before()
        started = time.perf_counter()
        await once()
        durations.append(time.perf_counter() - started)
    return durations


CLIENTS = ("floor", "session", "qemu_qmp")


def measure(args: argparse.Namespace) -> tuple[dict[str, list[float]], list[int]]:
    """Every method's times (and the naive walks' depths), the methods taking turns."""
    names = ["floor", "session", "qemu_qmp", "floor_nonblocking", "stop", "stop_unprimed"]
    names += ["nonblocking", "nonblocking_primed", "naive", "analysis", "cpu_per_vcpu_sample"]
    times: dict[str, list[float]] = {name: [] for name in names}
    depths: list[int] = []
    with booted_with_ram_file("--accel", args.accel) as (guest, ram):
        for _ in range(args.rounds):
            times["floor"] += floor_ms(guest.qmp, args.samples, "stop")
            times["session"] += asyncio.run(client_ms(guest, args.samples, "session"))
            if HAVE_QEMU_QMP:
                times["qemu_qmp"] += asyncio.run(client_ms(guest, args.samples, "qemu_qmp"))
            times["floor_nonblocking"] += floor_ms(guest.qmp, args.samples, "nonblocking")
            for mode in ("stop", "stop_unprimed", "nonblocking", "nonblocking_primed"):
                cpu = times["cpu_per_vcpu_sample"] if mode == "stop" else None
                path, analysis = asyncio.run(qmpprof_ms(guest, ram, args.samples, mode, cpu))
                times[mode] += path
                times["analysis"] += analysis
            naive, round_depths = naive_ms(guest, args.samples)
            times["naive"] += naive
            depths += round_depths
    return times, depths


def client_line(ms: dict[str, float | None]) -> str:
    """The three QMP clients side by side, each with its ratio to the bare socket."""
    labels = {"floor": "bare socket", "session": "QmpSession", "qemu_qmp": "qemu.qmp"}
    cells = []
    for name in CLIENTS:
        value = ms[name]
        floor = ms["floor"]
        cells.append(
            f"{labels[name]} {value:.3f} ms ({value / floor:.2f}x)"
            if value is not None and floor
            else f"{labels[name]} skipped"
        )
    return "stop + info registers -a + cont: " + ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=60, help="iterations per method per round")
    parser.add_argument("--accel", default="tcg")
    args = parser.parse_args()
    if not HAVE_QEMU_QMP:
        print("qemu.qmp is not installed (pip install -e '.[bench]'): its column is skipped")
    times, depths = measure(args)
    # The comparison is at stack depth >= 8: keep the naive walks that deep.
    deep = [t for t, d in zip(times["naive"], depths, strict=True) if d >= DEEP]
    times["naive"] = deep or times["naive"]
    ms: dict[str, float | None] = {
        name: median(values) * 1000 if values else None for name, values in times.items()
    }
    depth = DEEP if deep else median([float(d) for d in depths])
    print(
        ", ".join(f"{name} {value:.3f} ms" for name, value in ms.items() if value is not None)
        + f" (naive over {len(times['naive'])} walks of depth >= {depth:.0f})"
    )
    print(client_line(ms))
    print(json.dumps(summary(ms, depth)))


def summary(ms: dict[str, float | None], depth: float) -> dict[str, float | None]:
    """The JSON line: every median, rounded, and the ratios the README quotes."""

    def ratio(top: str, bottom: str) -> float | None:
        over, under = ms[top], ms[bottom]
        return round(over / under, 2) if over is not None and under else None

    figures: dict[str, float | None] = {
        f"{name}_ms": None if value is None else round(value, 3) for name, value in ms.items()
    }
    return figures | {
        "naive_depth": depth,
        "stop_over_floor": ratio("stop", "floor"),
        "naive_over_stop": ratio("naive", "stop"),
        "nonblocking_over_floor": ratio("nonblocking", "floor_nonblocking"),
        "session_over_floor": ratio("session", "floor"),
        "qemu_qmp_over_floor": ratio("qemu_qmp", "floor"),
        "qemu_qmp_over_session": ratio("qemu_qmp", "session"),
    }


if __name__ == "__main__":
    main()
