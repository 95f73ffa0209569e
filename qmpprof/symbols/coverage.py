"""How many kernel-mode PCs the kernel's symbols name: a --kernel that does not match
the guest, or a guest with no kernel symbols at all (Windows, BSD, firmware, a hobby
kernel) that is profiled with bare addresses and told how to name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from qmpprof.model import Mode, Sample


class KernelHolder(Protocol):
    """What holds the kernel's symbols (analysis.Analyzer): the kernel, once known, and
    the width of its code."""

    @property
    def kernel(self) -> object | None: ...

    @property
    def kernel_bits(self) -> int: ...


@dataclass
class KernelCoverage:
    """Kernel-mode samples seen and how many of their PCs a symbol covers.

    `mismatched`: a kernel ELF was given (`kernel_given`, a --kernel file) and more than
    half its kernel-mode PCs are unresolved, over at least `min_samples`: the ELF is not
    the guest's kernel (or the guest relocated it); the run stops and fails. A vCPU in
    16-bit mode, or in a mode narrower than the kernel's (a 32-bit vCPU under an ELF64
    kernel), runs firmware or the boot code before the kernel's own mode: it says
    nothing of the ELF. Without a given ELF nothing mismatches: the guest is profiled
    for as long as asked, and `unnamed_line` says what went unnamed.
    """

    min_samples: int = 20
    #: The width of the kernel ELF's code: 64 for ELF64, 32 for ELF32.
    kernel_bits: int = 64
    #: Whether the kernel ELF is a file the user gave (--kernel): only that can be wrong.
    kernel_given: bool = True
    kernel_samples: int = 0
    resolved: int = 0
    #: Every kernel-mode sample whatever the vCPU's width, and how many name their PC.
    privileged: int = 0
    named: int = 0
    #: Where `kernel_bits` and whether there is a kernel are read as samples come (`of`).
    source: KernelHolder | None = field(default=None, repr=False)

    @classmethod
    def of(cls, analyzer: KernelHolder) -> KernelCoverage:
        """Coverage of the samples `analyzer` symbolizes, made before connecting: a
        kernel it holds then is a file given (--kernel); one read from the guest's
        memory comes later, and is reported on, never stopped for."""
        return cls(
            kernel_bits=analyzer.kernel_bits,
            kernel_given=analyzer.kernel is not None,
            source=analyzer,
        )

    def add(self, sample: Sample) -> None:
        if self.source is not None:  # a kernel read once connected
            self.kernel_bits = self.source.kernel_bits
        if sample.mode is Mode.USER:  # `hlt` is privileged: idle PCs are kernel PCs too
            return
        known = sample.frames[0].function is not None
        self.privileged += 1
        self.named += known
        if sample.bits == 16 or sample.bits < self.kernel_bits:
            return
        self.kernel_samples += 1
        self.resolved += known

    @property
    def mismatched(self) -> bool:
        """The given kernel ELF does not name the guest's kernel PCs (never without one)."""
        return self.kernel_given and self._mostly_unresolved

    @property
    def _mostly_unresolved(self) -> bool:
        enough = self.kernel_samples >= self.min_samples
        return enough and 2 * self.resolved < self.kernel_samples

    def describe(self, kernel: str) -> str:
        unresolved = self.kernel_samples - self.resolved
        return (
            f"{kernel} does not match the guest: {unresolved} of {self.kernel_samples} "
            "kernel-mode PCs are outside its symbols"
        )

    def unnamed_line(self, has_kernel: bool | None = None) -> str | None:
        """The summary's line when kernel-mode PCs went unnamed with no --kernel given
        (None otherwise): with no kernel at all (`has_kernel` false, by default whether
        `source` has one: none given, none read from the guest's memory), all of them;
        with one read from the guest's memory, more than half of them."""
        if self.kernel_given:
            return None
        if has_kernel is None:
            has_kernel = self.source is not None and self.source.kernel is not None
        if not has_kernel and self.privileged > self.named:
            why = "no --kernel given, and none read from the guest's memory"
            return _unnamed(self.privileged - self.named, self.privileged, why, "ELF")
        if has_kernel and self._mostly_unresolved:
            why = "outside the symbols of the kernel read from the guest's memory"
            unresolved = self.kernel_samples - self.resolved
            return _unnamed(unresolved, self.kernel_samples, why, "VMLINUX")
        return None


def _unnamed(unnamed: int, total: int, why: str, file: str) -> str:
    return (
        f"kernel: no symbols for {unnamed} of {total} kernel-mode PCs ({why}): "
        f"give --kernel {file} to name them"
    )
