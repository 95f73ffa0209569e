"""Offline unwinding speed: our compiled CFI tables against decoding pyelftools' tables.

Captures 10,000 samples of the nofp example guest (registers + stack bytes), then
unwinds all of them offline, one core, pure Python:
  frames_per_s        qmpprof's unwinder (rules compiled once per FDE, cached by address)
  naive_frames_per_s  the same unwinds, decoding the FDE's table with pyelftools at
                      every lookup and interpreting its rules directly
Both must produce the same frames; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import pickle
import sys
import time
from pathlib import Path

from elftools.dwarf.callframe import FDE, RegisterRule
from elftools.elf.elffile import ELFFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import booted_guest, capture_samples
from qmpprof.memory import MemoryReader, WindowMemory
from qmpprof.model import RawSample
from qmpprof.unwind.cfi import load_cfi
from qmpprof.unwind.rules import RIP, RSP
from qmpprof.unwind.unwinder import Strategy, dwarf_registers, unwind

MAX_DEPTH = 64
#: pyelftools caches a decoded table in a cached_property; the naive way decodes anew.
_DECODE = FDE._decode_CFI_table.func  # type: ignore[attr-defined]


def ours(samples: list[RawSample], kernel: Path) -> tuple[list[list[int]], float]:
    table = load_cfi(kernel)
    started = time.perf_counter()
    stacks = []
    for sample in samples:
        memory = WindowMemory(sample.windows)
        result = unwind(
            dwarf_registers(sample.registers), memory, table, Strategy.CFI, max_depth=MAX_DEPTH
        )
        stacks.append([frame.address for frame in result.frames])
    return stacks, time.perf_counter() - started


class NaiveUnwinder:
    """Finds the FDE by bisection, then decodes its table with pyelftools every time."""

    def __init__(self, kernel: Path) -> None:
        self._stream = kernel.open("rb")
        entries = ELFFile(self._stream).get_dwarf_info().EH_CFI_entries()
        fdes = sorted(
            (e for e in entries if isinstance(e, FDE)), key=lambda e: e.header["initial_location"]
        )
        self._fdes = fdes
        self._starts = [e.header["initial_location"] for e in fdes]

    def row(self, address: int) -> dict[object, object] | None:
        index = bisect.bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        fde = self._fdes[index]
        if address >= fde.header["initial_location"] + fde.header["address_range"]:
            return None
        table = _DECODE(fde).table  # decode on every lookup: the naive way
        rows = [row for row in table if row["pc"] <= address]
        return rows[-1] if rows else None

    def unwind(self, regs: list[int | None], memory: MemoryReader) -> list[int]:
        frames = [regs[RIP]]
        exact = True
        while len(frames) < MAX_DEPTH:
            pc = regs[RIP]
            assert pc is not None
            row = self.row(pc if exact else pc - 1)
            if row is None:
                break
            cfa_rule = row["cfa"]
            cfa = regs[cfa_rule.reg] + cfa_rule.offset  # type: ignore[attr-defined]
            caller = list(regs)
            caller[RSP] = cfa
            ra = row.get(16)
            if ra is None or ra.type != RegisterRule.OFFSET:  # type: ignore[attr-defined]
                break
            for register, rule in row.items():
                if isinstance(register, int) and rule.type == RegisterRule.OFFSET:  # type: ignore[attr-defined]
                    value = memory.read_u64(cfa + rule.arg)  # type: ignore[attr-defined]
                    caller[RIP if register == 16 else register] = value
            exact = self._is_signal(pc if exact else pc - 1)
            regs = caller
            frames.append(regs[RIP])
        return [f for f in frames if f is not None]

    def _is_signal(self, address: int) -> bool:
        index = bisect.bisect_right(self._starts, address) - 1
        cie = self._fdes[index].cie
        return cie is not None and b"S" in bytes(cie.header.get("augmentation") or b"")


def naive(samples: list[RawSample], kernel: Path) -> tuple[list[list[int]], float]:
    unwinder = NaiveUnwinder(kernel)
    started = time.perf_counter()
    stacks = []
    for sample in samples:
        memory = WindowMemory(sample.windows)
        stacks.append(unwinder.unwind(dwarf_registers(sample.registers), memory))
    return stacks, time.perf_counter() - started


def capture(count: int) -> tuple[list[RawSample], Path]:
    with booted_guest("--variant", "nofp", "--accel", "tcg") as guest:
        started = time.perf_counter()
        samples = asyncio.run(capture_samples(guest, count, 2048))
        print(f"captured {len(samples)} samples in {time.perf_counter() - started:.1f} s")
        return samples, guest.kernel


def save_samples(path: Path, samples: list[RawSample], kernel: Path) -> None:
    """The samples and a copy of the kernel, so the same unwinds can be timed again."""
    path.write_bytes(pickle.dumps((samples, kernel.read_bytes())))


def load_samples(path: Path) -> tuple[list[RawSample], Path]:
    samples, kernel_bytes = pickle.loads(path.read_bytes())  # our own file, from --save
    kernel = path.with_suffix(".elf")
    kernel.write_bytes(kernel_bytes)
    return samples, kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--save", type=Path, help="keep the captured samples (and kernel) here")
    parser.add_argument("--load", type=Path, help="unwind samples saved by --save, no guest")
    args = parser.parse_args()
    if args.load is not None:
        samples, kernel = load_samples(args.load)
    else:
        samples, kernel = capture(args.samples)
        if args.save is not None:
            save_samples(args.save, samples, kernel)
    samples = [s for s in samples if s.windows]
    stacks, seconds = ours(samples, kernel)
    frames = sum(map(len, stacks))
    subset = samples
    naive_stacks, naive_seconds = naive(subset, kernel)
    naive_frames = sum(map(len, naive_stacks))
    mismatches = sum(a != b for a, b in zip(stacks, naive_stacks, strict=False))
    print(f"qmpprof: {frames} frames of {len(samples)} samples in {seconds:.2f} s")
    print(
        f"naive:   {naive_frames} frames of {len(subset)} samples in {naive_seconds:.2f} s, "
        f"{mismatches} stacks differ from qmpprof's"
    )
    result = {
        "samples": len(samples),
        "frames": frames,
        "frames_per_s": round(frames / seconds),
        "naive_frames_per_s": round(naive_frames / naive_seconds),
        "ratio": round((frames / seconds) / (naive_frames / naive_seconds), 1),
        "naive_mismatched_stacks": mismatches,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
