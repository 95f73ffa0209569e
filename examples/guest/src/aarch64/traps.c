/* qmpprof example guest, AArch64 build: unexpected exceptions.
 *
 * exception_common (EL1 synchronous exceptions, unused vectors) and
 * syscall_entry (an EL0 synchronous exception that is not an SVC) call
 * exception_handler with the frame entry.S built. A fault in EL0 ends the
 * process; anything else prints the state and halts the CPU. */
#include "proc.h"

void exception_handler(struct exception_frame *f)
{
    if ((f->pstate & 0xf) == 0 && sched_running) {
        struct process *p = cpu_current[cpu_id()];
        spin_lock(&console_lock);
        kprintf("\nqmpprof-guest: EXCEPTION in process %d (%s): esr=%lx pc=%lx sp=%lx far=%lx\n",
                p ? p->pid : -1, p ? p->name : "?", f->esr, f->pc, f->sp, f->far);
        spin_unlock(&console_lock);
        sys_exit((uint64_t)-1);
    }
    kprintf("\nqmpprof-guest: EXCEPTION esr=%lx pc=%lx pstate=%lx sp=%lx far=%lx x29=%lx x30=%lx\n",
            f->esr, f->pc, f->pstate, f->sp, f->far, f->x[29], f->x[30]);
    for (;;)
        __asm__ volatile("msr daifset, #2; wfi" ::: "memory");
}
