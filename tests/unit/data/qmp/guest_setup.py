"""How the capture and tick recordings were made, shared by their recorder
(record_capture.py) and the tests that replay them: the same binaries and settings make
the same requests, which the replay checks byte for byte.

The guest is the example guest's fp build running its user workload on two vCPUs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from qmpprof.analysis import Analyzer
from qmpprof.commands.common import TargetOptions, build_analyzer
from qmpprof.record.capture import CaptureConfig

ROOT = Path(__file__).resolve().parents[4]
GUEST = ROOT / "examples" / "guest"
VARIANT = "fp"
BUILD = GUEST / "build" / VARIANT
KERNEL = BUILD / "kernel.elf"
USER_DIR = BUILD / "user"
#: How the recorder boots the guest (tests/guest_vm.py, boot.sh arguments).
BOOT_ARGS = ("--variant", VARIANT, "--workload", "user", "--smp", "2", "--accel", "tcg")

#: The capture recordings: one page of stack holds the example guest's deepest stacks.
CAPTURE = CaptureConfig(stack_bytes=4096)
#: The tick recordings, where only the sampler's decisions matter: a small window each.
TICK = CaptureConfig(stack_bytes=256)
#: What the failing ticks ask instead of `info registers -a`: HMP answers it with a
#: usage text, not a register dump.
MISSPELT_REGISTERS = "info registers -z"
#: Below this, a user address; the kernel runs from 0xffffffff80100000.
USER_END = 1 << 47


def built_guest() -> None:
    """Build the example guest's binaries if they are not there (make is a no-op then)."""
    subprocess.run(["make", "-s", "-C", str(GUEST), f"VARIANT={VARIANT}"], check=True)


def guest_analyzer() -> Analyzer:
    """The kernel and user binaries, and the example guest's OS adapter, as `record`
    loads them with `--kernel` and `--user-dir`."""
    return build_analyzer(TargetOptions("", KERNEL, (USER_DIR,)))


def tick_analyzer() -> Analyzer:
    """No binaries and one frame: a tick reads the registers and one window per vCPU."""
    return Analyzer(max_depth=1)
