"""GDB's view of the i386 Linux guest's vCPUs, the oracle for qmpprof's stacks. Run inside
GDB (gdb-stacks.sh does) with the debug vmlinux loaded (moved by the KASLR slide) and
the gdbstub's address in QMPPROF_I386_GDB; it attaches QMPPROF_I386_SAMPLES times,
QMPPROF_I386_INTERVAL seconds apart, and detaches after each look.

For each vCPU (GDB thread N is CPU N-1) it prints the task running there (per-CPU
current_task: &current_task + __per_cpu_offset[cpu], the address x86-32 reaches through
%fs), whether the vCPU is in user or kernel mode, GDB's backtrace, and for a task of ours
(build/COMM exists) the user stack:
- in user mode: add-symbol-file build/COMM (and, for `sysenter`, the -dbg package's
  vdso32.so at the vDSO's address), then GDB's backtrace from the vCPU's registers;
- in kernel mode: the user registers the entry code saved, put in the vCPU's eip/esp/ebp
  for the backtrace and put back right after (see user_registers).
Kernel memory is read from guest physical memory (QEMU's Qqemu.PhyMemMode: a vCPU in user
mode, or in entry code before it switches CR3, runs on PTI's user page tables, which do
not map the kernel's data); lowmem's physical address is its virtual address less
PAGE_OFFSET (0xc0000000), KASLR or not (x86-32 KASLR moves the kernel in both alike).
"""

import os
import time

import gdb

USER_DIR = os.environ.get("QMPPROF_I386_USER_DIR", "build")
VDSO = os.environ.get("QMPPROF_I386_VDSO", "")
PAGE_OFFSET = 0xC0000000
THREAD_SIZE = 8192
TOP_OF_KERNEL_STACK_PADDING = 8  # CONFIG_X86_32 without CONFIG_VM86
PT_REGS = 68
USER_CS = 0x73
#: entry_SYSENTER_32's instructions before it leaves the entry stack (`movl
#: TSS_entry2task_stack(%esp), %esp` at +29 in Debian's 6.1.0-50-686-pae).
SYSENTER_ON_ENTRY_STACK = 29
#: int80_landing_pad in the vDSO (vdso32.so): where a sysenter returns to user space.
LANDING_PAD = 0x559
ENTRY_STACK = 4096


def offset(type_name, field):
    return int(gdb.parse_and_eval(f"(unsigned long)&((({type_name} *)0)->{field})"))


def symbol(name):
    """`name`'s running address: GDB loaded the vmlinux moved by the KASLR slide."""
    return int(gdb.parse_and_eval(f"(unsigned long)&{name}"))


def physical(on):
    gdb.execute(f"maint packet Qqemu.PhyMemMode:{1 if on else 0}", to_string=True)
    gdb.execute("maint flush dcache", to_string=True)


def read_kernel(address, size):
    """`size` bytes of lowmem at `address`, read through guest physical memory."""
    physical(True)
    try:
        return bytes(gdb.selected_inferior().read_memory(address - PAGE_OFFSET, size))
    finally:
        physical(False)


def word(data, at):
    return int.from_bytes(data[at : at + 4], "little")


def u32(address):
    return word(read_kernel(address, 4), 0)


def registers():
    frame = gdb.newest_frame()
    names = ("eip", "esp", "ebp", "cs")
    return {name: int(frame.read_register(name)) & 0xFFFFFFFF for name in names}


def backtrace(limit=40):
    try:
        text = gdb.execute(f"bt {limit}", to_string=True)
    except gdb.error as error:
        text = f"(bt failed: {error})\n"
    return "".join("    " + line + "\n" for line in text.splitlines())


def entry_stack_top(cpu):
    """TSS.sp0 of `cpu`: the top of its entry stack. The TSS is the per-CPU cpu_tss_rw
    (x86_tss.sp0 at offset 4); TSS.sp1 (offset 12) is the task stack's top."""
    area = u32(symbol("__per_cpu_offset") + 4 * cpu)
    return u32(symbol("cpu_tss_rw") + area + 4)


def user_registers(cpu, task, layout, regs, vdso):
    """The user's eip, esp and ebp as the kernel's entry left them, printed; None when
    there are none to trust."""
    sp0 = entry_stack_top(cpu)
    sysenter = symbol("entry_SYSENTER_32")
    if sysenter <= regs["eip"] < sysenter + SYSENTER_ON_ENTRY_STACK:
        # sysenter saves nothing: the vDSO did `movl %esp, %ebp` first, so the user's esp
        # (and ebp) is the live ebp, and the kernel will return to int80_landing_pad.
        if not vdso:
            print("  in entry_SYSENTER_32 on the entry stack; no vDSO address to return to")
            return None
        user = {"ebp": regs["ebp"], "eip": vdso + LANDING_PAD, "esp": regs["ebp"]}
        print(
            f"  in entry_SYSENTER_32 on the entry stack: user sp = live ebp = "
            f"{regs['ebp']:#x}, ip = int80_landing_pad {user['eip']:#x}"
        )
        return user
    if sp0 - ENTRY_STACK <= regs["esp"] < sp0:
        # entry_INT80_32 or an interrupt/exception entry still on the entry stack: the
        # hardware's frame (ip, cs, flags, sp, ss) is at its top, ebp is still the user's.
        # sysenter pushes nothing, and the exit paths copy pt_regs back here and pop them.
        frame = bytes(gdb.selected_inferior().read_memory(sp0 - 20, 20))
        ip, cs, flags, sp = (word(frame, at) for at in (0, 4, 8, 12))
        # A stale frame (an earlier entry's, left below sp0) passes for one unless checked:
        # user cs, eflags with its always-one bit 1 and IF, ip and sp below PAGE_OFFSET.
        plausible = (
            cs & 0xFFFF == USER_CS
            and flags & 0x202 == 0x202
            and 0x1000 <= ip < PAGE_OFFSET
            and 0x1000 <= sp < PAGE_OFFSET
        )
        if not plausible:
            print(
                f"  on the entry stack (sp0={sp0:#x}) with no user frame at its top "
                f"(the sysenter/sysexit path keeps the user's state in registers)"
            )
            return None
        print(
            f"  on the entry stack (sp0={sp0:#x}): hardware frame ip={ip:#x} sp={sp:#x}, "
            f"live ebp={regs['ebp']:#x}"
        )
        return {"ebp": regs["ebp"], "eip": ip, "esp": sp}
    stack = u32(task + layout["stack"])
    regs_at = stack + THREAD_SIZE - TOP_OF_KERNEL_STACK_PADDING - PT_REGS
    saved = read_kernel(regs_at, PT_REGS)
    user = {"ebp": word(saved, 20), "eip": word(saved, 48), "esp": word(saved, 60)}
    cs = word(saved, 52)
    print(
        f"  pt_regs at {regs_at:#x}: ip={user['eip']:#x} sp={user['esp']:#x} "
        f"bp={user['ebp']:#x} cs={cs:#x} orig_ax={word(saved, 44)}"
    )
    if cs & 0xFFFF != USER_CS or user["eip"] == 0:
        # entry_SYSENTER_32 pushes 0 for ip and sp; do_SYSENTER_32 fills them in.
        print("  (not a user frame yet)")
        return None
    return user


def sample():
    layout = {
        name: offset("struct task_struct", name) for name in ("comm", "pid", "tgid", "stack", "mm")
    }
    current_task = symbol("current_task")
    per_cpu_offset = symbol("__per_cpu_offset")
    loaded = loaded_vdso = None
    for thread in sorted(gdb.selected_inferior().threads(), key=lambda t: t.num):
        cpu = thread.num - 1
        thread.switch()
        regs = registers()
        mode = "user" if regs["cs"] & 3 == 3 else "kernel"
        task = u32(current_task + u32(per_cpu_offset + 4 * cpu))
        comm = read_kernel(task + layout["comm"], 16).split(b"\0")[0].decode(errors="replace")
        pid, tgid, mm = (u32(task + layout[name]) for name in ("pid", "tgid", "mm"))
        print(
            f"CPU {cpu}: {mode} eip={regs['eip']:#x} esp={regs['esp']:#x} "
            f"ebp={regs['ebp']:#x} task={task:#x} comm={comm} pid={pid} tgid={tgid} mm={mm:#x}"
        )
        program = os.path.join(USER_DIR, comm)
        ours = mm != 0 and os.path.isfile(program)
        if ours and loaded != program:
            if loaded:
                gdb.execute(f"remove-symbol-file {loaded}", to_string=True)
            gdb.execute(f"add-symbol-file {program}", to_string=True)
            loaded = program
        if ours and comm == "sysenter" and os.path.isfile(VDSO):
            # Its vDSO, for __kernel_vsyscall's symbols and CFI: the -dbg package's
            # vdso32.so (linked at 0) at the address the program keeps (AT_SYSINFO_EHDR).
            vdso = int(gdb.parse_and_eval("vdso_base")) & 0xFFFFFFFF
            if vdso and vdso != loaded_vdso:
                if loaded_vdso:
                    gdb.execute(f"remove-symbol-file {VDSO}", to_string=True)
                gdb.execute(f"add-symbol-file {VDSO} -o {vdso:#x}", to_string=True)
                loaded_vdso = vdso
                print(f"  vDSO at {vdso:#x}")
        print("  GDB backtrace:")
        print(backtrace(), end="")
        if mode == "kernel" and ours:
            vdso = loaded_vdso if comm == "sysenter" else 0
            user = user_registers(cpu, task, layout, regs, vdso)
            if user is not None:
                try:
                    for name in ("eip", "esp", "ebp"):
                        gdb.execute(f"set ${name} = {user[name]:#x}", to_string=True)
                    print("  GDB backtrace of those user registers:")
                    print(backtrace(), end="")
                finally:
                    for name in ("eip", "esp", "ebp"):
                        gdb.execute(f"set ${name} = {regs[name]:#x}", to_string=True)
                    assert registers() == regs
    if loaded:
        gdb.execute(f"remove-symbol-file {loaded}", to_string=True)
    if loaded_vdso:
        gdb.execute(f"remove-symbol-file {VDSO}", to_string=True)


def main():
    target = os.environ["QMPPROF_I386_GDB"]
    samples = int(os.environ.get("QMPPROF_I386_SAMPLES", "1"))
    interval = float(os.environ.get("QMPPROF_I386_INTERVAL", "1"))
    for number in range(1, samples + 1):
        print(f"=== sample {number}")
        gdb.execute(f"target remote {target}", to_string=True)
        try:
            sample()
        finally:
            gdb.execute("detach", to_string=True)
        if number < samples:
            time.sleep(interval)


main()
