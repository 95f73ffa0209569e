"""An AArch64 guest's page-table roots, which QEMU's register dump lacks: TTBR1_EL1 and
TCR_EL1 read from QEMU's gdbstub (target/gdbstub.py) or remembered for the QEMU process
(target/remembered.py), checked before direct memory walks with them, and each vCPU's
TPIDR_EL1 with them. Each task's TTBR0_EL1 comes from the OS adapter
(Capturer._with_user_roots)."""

from __future__ import annotations

from dataclasses import dataclass

from qmpprof.errors import DirectMemoryUnavailable, MemoryFault
from qmpprof.target.direct import DirectMemory
from qmpprof.target.gdbstub import read_system_registers
from qmpprof.target.paging import Aarch64PagingState, UnsupportedPaging
from qmpprof.target.qmp import QmpSession
from qmpprof.target.registers import parse_all
from qmpprof.target.remembered import Remembered

_KERNEL_HALF = 1 << 63
#: A TTBRn_EL1's table address: without the ASID above and CnP below.
_TABLE_ADDRESS = 0x0000_FFFF_FFFF_FFC0


#: The QEMU targets (QMP query-target) whose register dump has the page-table roots.
_ROOTS_IN_DUMP = ("x86_64", "i386")
_SYSTEM_REGISTERS = ("TTBR1_EL1", "TCR_EL1", "TPIDR_EL1")


@dataclass(frozen=True)
class Aarch64System:
    """What an AArch64 guest's register dump lacks and does not change after boot: the
    kernel's page-table root (TTBR1_EL1's table address) and TCR_EL1, which every vCPU
    shares, and each vCPU's TPIDR_EL1 (Linux keeps its CPU's per-CPU offset there)."""

    ttbr1: int
    tcr: int
    #: By vCPU index.
    tpidr: tuple[int, ...]

    @property
    def roots(self) -> tuple[int, int]:
        return self.ttbr1, self.tcr


async def page_table_roots(session: QmpSession, user_roots: bool) -> Aarch64System | None:
    """What an AArch64 guest's page walks need and its register dump lacks, read from
    QEMU's gdbstub (target/gdbstub.py) and remembered for the QEMU process; those
    remembered where the stub cannot be used (the VM paused, a debugger attached). None
    for x86, whose dump has its roots. Raises DirectMemoryUnavailable where they cannot
    be had."""
    target = await session.execute("query-target")
    arch = target.get("arch") if isinstance(target, dict) else None
    if arch in _ROOTS_IN_DUMP:
        return None
    if arch != "aarch64":
        raise DirectMemoryUnavailable(f"the page tables of an {arch} guest are not walked yet")
    if not user_roots:
        raise DirectMemoryUnavailable("no OS adapter says each task's page tables (TTBR0_EL1)")
    remembered = Remembered.of(session, "aarch64-system")
    try:
        values = await read_system_registers(session, _SYSTEM_REGISTERS)
    except DirectMemoryUnavailable:
        known = remembered.numbers()
        if known is None or len(known) < 3:
            raise
        return Aarch64System(known[0], known[1], known[2:])
    # Linux keeps an ASID in TTBR1_EL1's top bits, which changes with the address space:
    # the table is the rest. With KPTI, a vCPU at EL0 has a trampoline's table there.
    pairs = {(vcpu["TTBR1_EL1"] & _TABLE_ADDRESS, vcpu["TCR_EL1"]) for vcpu in values.values()}
    if len(pairs) != 1:
        raise DirectMemoryUnavailable("the vCPUs' kernel page tables (TTBR1_EL1) differ")
    ((ttbr1, tcr),) = pairs
    tpidr = tuple(values[vcpu]["TPIDR_EL1"] for vcpu in sorted(values))
    remembered.keep(ttbr1, tcr, *tpidr)
    return Aarch64System(ttbr1, tcr, tpidr)


async def use_roots(session: QmpSession, direct: DirectMemory, system: Aarch64System) -> None:
    """`direct` walks with `system`'s roots once they are checked: a granule and address size
    walked here, and every vCPU in the kernel (a reboot may have moved the tables since
    they were remembered) with its pc mapped by them. Raises DirectMemoryUnavailable."""
    roots = system.roots
    try:
        Aarch64PagingState(None, *roots).mode  # noqa: B018 (it raises for what is not walked)
    except UnsupportedPaging as err:
        await direct.close()
        raise DirectMemoryUnavailable(str(err)) from err
    direct.aarch64_roots = roots
    direct.aarch64_tpidr = system.tpidr
    registers = parse_all(await session.hmp("info registers -a"))
    direct.set_registers(registers)
    for regs in registers:
        if regs.isa == "aarch64" and not regs.user_mode and regs.pc >= _KERNEL_HALF:
            try:
                direct.reader(regs.vcpu).read(regs.pc, 4)
            except MemoryFault as err:
                await direct.close()
                raise DirectMemoryUnavailable(
                    f"TTBR1_EL1 {roots[0]:#x} does not map vCPU {regs.vcpu}'s pc"
                ) from err
