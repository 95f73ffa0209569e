"""Reading `perf script` text: one host sample per block, its call chain leaf first.

perf prints each sample as a header line (`COMM PID/TID SECONDS.NS: PERIOD`) followed by
one tab-indented line per frame (`ADDRESS SYMBOL (DSO)`) and a blank line. With DWARF
call graphs the chain of a sample in TCG's generated code (no unwind tables) is its
leaf alone.

The text is input: a thread name may hold anything, and every count is bounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from qmpprof.errors import HostProfileFailed

#: Frames kept per sample: perf's own limit is 127 by default (kernel.perf_event_max_stack).
MAX_FRAMES = 512
#: Longer lines are not perf's (a C++ symbol can be long, not this long).
MAX_LINE = 64 * 1024
#: Samples read from one recording: an hour at 1 kHz on 16 threads, far beyond a real run.
MAX_SAMPLES = 60_000_000

_HEADER = re.compile(
    r"(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?P<time>\d+\.\d+):\s+(?P<period>\d+)\s*"
)
_FRAME = re.compile(r"\s*(?P<address>[0-9a-fA-F]+)\s+(?P<symbol>.*?)\s*\((?P<dso>[^()]*)\)\s*")


@dataclass(frozen=True)
class HostFrame:
    """One frame perf named: its address (in the host kernel, or perf's address in the
    file for user code), its symbol (None: perf had none) and the file it lies in."""

    address: int
    symbol: str | None
    dso: str


@dataclass(frozen=True)
class HostSample:
    """One sample of one host thread, on the monotonic clock."""

    comm: str
    pid: int
    tid: int
    time_s: float
    period: int
    #: Leaf first; () when perf printed none.
    frames: tuple[HostFrame, ...]


def parse_frame(line: str) -> HostFrame | None:
    """One frame line; None for a line that is not one."""
    found = _FRAME.fullmatch(line)
    if found is None:
        return None
    symbol = found["symbol"]
    return HostFrame(
        int(found["address"], 16),
        None if symbol in ("", "[unknown]") else symbol,
        found["dso"],
    )


def parse_samples(lines: Iterable[str]) -> Iterator[HostSample]:
    """Host samples from perf script's lines. Raises HostProfileFailed for text that is
    not perf's."""
    for count, (header, frames) in enumerate(_blocks(lines)):
        if count >= MAX_SAMPLES:
            raise HostProfileFailed(f"perf recorded over {MAX_SAMPLES} samples")
        yield HostSample(
            header["comm"].strip(),
            int(header["pid"]),
            int(header["tid"]),
            float(header["time"]),
            int(header["period"]),
            frames,
        )


def _blocks(lines: Iterable[str]) -> Iterator[tuple[re.Match[str], tuple[HostFrame, ...]]]:
    header: re.Match[str] | None = None
    frames: list[HostFrame] = []
    for line in lines:
        if len(line) > MAX_LINE:
            raise HostProfileFailed(f"perf script printed a line of over {MAX_LINE} characters")
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if not text.startswith("\t"):
            found = _HEADER.fullmatch(text)
            if found is None:
                raise HostProfileFailed(f"perf script printed an unexpected line: {text[:80]!r}")
            if header is not None:
                yield header, tuple(frames)
            header, frames = found, []
            continue
        frame = parse_frame(text)
        if header is None or frame is None:
            raise HostProfileFailed(f"perf script printed an unexpected line: {text[:80]!r}")
        if len(frames) < MAX_FRAMES:
            frames.append(frame)
    if header is not None:
        yield header, tuple(frames)
