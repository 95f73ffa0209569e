"""Turning samples into outputs, shared by `record` (live) and `report` (replayed)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from qmpprof.analysis import Analyzer
from qmpprof.model import RawSample, Recording, Sample
from qmpprof.output.writers import Format, write_profile
from qmpprof.profile import Profile
from qmpprof.record.capfile import CapturedSample, CaptureWriter
from qmpprof.symbols.coverage import KernelCoverage


class Collector:
    """Analyses raw samples and feeds the profile, the sample list and a capture file."""

    def __init__(
        self,
        analyzer: Analyzer,
        profile: Profile,
        captures: list[CaptureWriter] | None = None,
    ) -> None:
        self.analyzer = analyzer
        self.profile = profile
        self.samples: list[Sample] = []
        self.coverage = KernelCoverage()
        self._captures = captures or []

    def add_raw(self, raw: RawSample) -> None:
        """Analyse one raw sample."""
        stack = self.analyzer.unwind(raw)
        process = self.analyzer.process(raw)
        for capture in self._captures:
            capture.add(CapturedSample(raw, stack, process))
        self.add(self.analyzer.symbolize(raw, stack, process))

    def add(self, sample: Sample) -> None:
        self.profile.add(sample)
        self.samples.append(sample)
        self.coverage.add(sample)

    def write(self, fmt: Format, recording: Recording, path: Path, out: Console) -> None:
        """Write the output file (a capture file is already written) and say so."""
        if fmt is not Format.QMPCAP:
            write_profile(fmt, self.samples, self.profile, recording, path)
        what = (
            f"{len(self.samples)} samples"
            if fmt is Format.QMPCAP
            else (f"{len(self.profile.stacks)} distinct stacks")
        )
        out.print(f"wrote {what} to {path} ({fmt.value})", soft_wrap=True, markup=False)
