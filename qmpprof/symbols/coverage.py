"""Does the kernel ELF we were given match the guest? Count kernel PCs it names."""

from __future__ import annotations

from dataclasses import dataclass

from qmpprof.model import Mode, Sample


@dataclass
class KernelCoverage:
    """Kernel-mode samples seen and how many of their PCs a symbol covers.

    More than half unresolved, over at least `min_samples`, means the ELF is not the
    guest's kernel (or the guest relocated it). A vCPU in 16-bit mode, or in a mode
    narrower than the kernel's (a 32-bit vCPU under an ELF64 kernel), runs firmware or
    the boot code before the kernel's own mode: it says nothing of the ELF.
    """

    min_samples: int = 20
    #: The width of the kernel ELF's code: 64 for ELF64, 32 for ELF32.
    kernel_bits: int = 64
    kernel_samples: int = 0
    resolved: int = 0

    def add(self, sample: Sample) -> None:
        if sample.bits == 16 or sample.bits < self.kernel_bits:
            return
        if sample.mode is not Mode.USER:  # `hlt` is privileged: idle PCs are kernel PCs too
            self.kernel_samples += 1
            self.resolved += sample.frames[0].function is not None

    @property
    def mismatched(self) -> bool:
        enough = self.kernel_samples >= self.min_samples
        return enough and 2 * self.resolved < self.kernel_samples

    def describe(self, kernel: str) -> str:
        unresolved = self.kernel_samples - self.resolved
        return (
            f"{kernel} does not match the guest: {unresolved} of {self.kernel_samples} "
            "kernel-mode PCs are outside its symbols"
        )
