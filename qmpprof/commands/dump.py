"""`qmpprof dump`: the current stack of every vCPU, once. A paused VM stays paused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from qmpprof.commands.common import (
    TargetOptions,
    build_analyzer,
    mapped_sources,
    module_files,
    say_on_stderr,
)
from qmpprof.commands.connect import connected
from qmpprof.errors import KernelMismatch, UsageError
from qmpprof.output.dump import dump_json, dump_text
from qmpprof.symbols.coverage import KernelCoverage
from qmpprof.symbols.lines import SourceLookup
from qmpprof.target.pause import paused

if TYPE_CHECKING:
    from qmpprof.console import Printer

#: How long dump may hold the VM paused before it gives up (TickOverrun), VM resumed.
DUMP_BUDGET_S = 5.0


@dataclass(frozen=True)
class DumpOptions:
    target: TargetOptions
    as_json: bool = False
    lines: bool = False


async def run_dump(options: DumpOptions, out: Printer) -> None:
    """Print every vCPU's stack. Raises QmpprofError (KernelMismatch after printing)."""
    analyzer = build_analyzer(options.target)
    async with (
        connected(options.target, analyzer) as (session, _, capturer),
        paused(session, DUMP_BUDGET_S),
    ):
        captured = await capturer.capture()
    if analyzer.kernel_source is not None:
        say_on_stderr(analyzer.kernel_source)
    if not captured:
        raise UsageError(f"no vCPU {', '.join(map(str, options.target.cpus))} in this guest")
    samples = [analyzer.symbolize(one) for one in captured]
    sources = SourceLookup(
        module_files(analyzer), mapped_sources(analyzer)
    )  # inlined calls are shown by default
    if options.as_json:
        out.out(dump_json(samples, sources, options.lines), highlight=False)
    else:
        out.out(dump_text(samples, sources, options.lines), highlight=False, end="")
    given = options.target.kernel is not None
    coverage = KernelCoverage(min_samples=1, kernel_bits=analyzer.kernel_bits, kernel_given=given)
    for sample in samples:
        coverage.add(sample)
    if coverage.mismatched:
        raise KernelMismatch(coverage.describe(str(options.target.kernel)))
