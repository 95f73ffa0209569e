"""No --kernel: the guest's Linux kernel read from its own memory (guest/linux/from_memory.py).

Once per connection, before the KASLR check: VMCOREINFO is looked for in guest RAM
read on this host (only `--memory direct` can look through all of it), where it was
last time first (remembered per QEMU process, so the next command finds it at once; a
reboot that moved it costs one scan), then the kernel's kallsyms, ORC and BTF are read
from its image. What kallsyms decodes to is kept in the derived cache under a digest of
the tables' bytes, never under the build-id the guest claims. Anything that does not
check ends here with one line for the user, and qmpprof goes on as without a kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from qmpprof.errors import BadGuestKernel, KernelMismatch, MemoryFault
from qmpprof.guest.linux import vmcoreinfo
from qmpprof.guest.linux.from_memory import GuestKernel, read_guest_kernel
from qmpprof.modules import Module
from qmpprof.target.direct import DirectMemory
from qmpprof.target.memory import MemoryBackend
from qmpprof.target.qmp import QmpSession
from qmpprof.target.remembered import Remembered
from qmpprof.visible import visible

#: What to pass when the kernel cannot be read from memory.
ADVICE = "kernel frames stay unnamed; --kernel VMLINUX names them"


def read_kernel(
    session: QmpSession, memory: MemoryBackend, notice: Callable[[str], None]
) -> GuestKernel | None:
    """The guest's kernel from its memory; None, after one line to `notice`, when it
    cannot be had (not Linux, no VMCOREINFO, memory read through QEMU's monitor)."""
    if not isinstance(memory, DirectMemory):
        notice(f"no --kernel, and guest RAM is read through QEMU's monitor: {ADVICE}")
        return None
    try:
        info = guest_vmcoreinfo(session, memory)
        return read_guest_kernel(info, memory.physical.read_physical)
    except (BadGuestKernel, MemoryFault) as err:
        notice(f"no --kernel, and the guest's memory gives none: {err}; {ADVICE}")
        return None


def guest_vmcoreinfo(session: QmpSession, memory: DirectMemory) -> vmcoreinfo.VmcoreInfo:
    """The guest's checked VMCOREINFO, its place remembered. Raises BadGuestKernel."""
    physical = memory.physical
    ranges = [(segment.start, segment.end) for segment in physical.segments]
    remembered = Remembered.of(session, "vmcoreinfo")
    page, info = vmcoreinfo.find(physical.read_physical, ranges, remembered.page())
    remembered.keep(page)
    return info


def check_build_id(session: QmpSession, memory: MemoryBackend, kernel: Module) -> None:
    """Raise KernelMismatch when the guest's VMCOREINFO names another build of the
    kernel than `kernel` (a --kernel file); nothing to say without either build-id."""
    if kernel.build_id is None or not isinstance(memory, DirectMemory):
        return
    try:
        info = guest_vmcoreinfo(session, memory)
    except BadGuestKernel:
        return
    if info.build_id is not None and info.build_id != kernel.build_id:
        raise KernelMismatch(
            f"--kernel {kernel.path} does not match the guest: its build-id is "
            f"{kernel.build_id.hex()}, the guest runs {visible(info.release)}, build-id "
            f"{info.build_id.hex()} (its VMCOREINFO)"
        )
