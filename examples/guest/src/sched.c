/* qmpprof example guest: scheduler of the user workload.
 *
 * Preemptive round robin, one run queue for all CPUs (runq_lock), time
 * slice = one LAPIC timer tick (10 ms). All of it runs with interrupts
 * disabled (timer / IPI / syscall handlers use interrupt gates).
 *
 * Contexts: every process has its own kernel stack; every CPU has an idle
 * context on kernel_stacks[cpu] (the stack it booted on), which runs
 * cpu_idle() (sti; hlt) with cpu_current[cpu] = NULL and CR3 = kernel_pml4.
 * A switch always happens inside schedule() -> switch_to() ->
 * switch_context(), called from
 *   timer_interrupt_handler -> sched_tick -> schedule      (preemption, wakeup)
 *   resched_interrupt_handler -> schedule                  (IPI to an idle CPU)
 *   syscall_dispatch -> sys_sleep / sys_yield / sys_exit -> schedule
 * so a process that is switched out always has one of these chains on its
 * kernel stack, above the interrupt/syscall stub and its user frames.
 *
 * Wakeups: CPU 0 advances timer_ticks and wakes sleepers on each of its
 * ticks, then sends a RESCHED_VECTOR IPI to idle CPUs if it woke more
 * processes than it can run itself. */
#include "proc.h"

struct process process_table[NPROC];
struct process *cpu_current[NCPU];
volatile uint32_t procs_started;
volatile uint32_t sched_running;
uintptr_t kernel_cr3;
spinlock_t console_lock;
/* Number of context switches (all CPUs). */
volatile uint64_t sched_switches;

static spinlock_t runq_lock;
static struct process *runq_head, *runq_tail;
static volatile uint32_t runq_len;

static void runq_push(struct process *p)
{
    p->next = NULL;
    if (runq_tail)
        runq_tail->next = p;
    else
        runq_head = p;
    runq_tail = p;
    runq_len = runq_len + 1;
}

static struct process *runq_pop(void)
{
    struct process *p = runq_head;
    if (p) {
        runq_head = p->next;
        if (!runq_head)
            runq_tail = NULL;
        p->next = NULL;
        runq_len = runq_len - 1;
    }
    return p;
}

void sched_make_runnable(struct process *p)
{
    spin_lock(&runq_lock);
    p->state = PROC_RUNNABLE;
    runq_push(p);
    spin_unlock(&runq_lock);
}

/* The idle loop of every CPU (its idle context, cpu_current[cpu] == NULL). */
CHAIN_FN void cpu_idle(void)
{
    for (;;)
        __asm__ volatile("sti; hlt" ::: "memory");
}

CHAIN_FN void switch_to(struct cpu *c, struct process *prev, struct process *next)
{
    uint64_t now = rdtsc();
    if (prev) {
        prev->run_tsc += now - prev->run_start;
        prev->info->run_tsc = prev->run_tsc;
    } else {
        c->idle_tsc += now - c->idle_start;
    }
    if (next) {
        /* the CPU that ran it last may still be on its kernel stack */
        while (__atomic_load_n(&next->on_cpu, __ATOMIC_ACQUIRE))
            __asm__ volatile("pause");
        next->on_cpu = 1;
        next->cpu = (int)c->id;
        if (next->runs++ == 0)
            __atomic_add_fetch(&procs_started, 1, __ATOMIC_RELAXED);
        next->run_start = rdtsc();
        next->info->run_tsc = next->run_tsc;
        next->info->run_start = next->run_start;
        next->info->seq = next->info->seq + 1;
        tss_set_sp0(c, next->kstack_top);
    } else {
        c->idle_start = now;
    }
    cpu_current[c->id] = next;
    __atomic_add_fetch(&sched_switches, 1, __ATOMIC_RELAXED);
    switch_context(prev ? &prev->ksp : &c->idle_ksp,
                   next ? next->ksp : c->idle_ksp,
                   next ? next->cr3 : kernel_cr3,
                   prev ? &prev->on_cpu : NULL);
    barrier();
}

/* Put the current process (if still running) at the end of the run queue
 * and switch to the head of the queue, or to the idle context if empty. */
CHAIN_FN void schedule(void)
{
    struct cpu *c = this_cpu();
    struct process *prev = cpu_current[c->id];
    spin_lock(&runq_lock);
    if (prev && prev->state == PROC_RUNNING) {
        prev->state = PROC_RUNNABLE;
        runq_push(prev);
    }
    struct process *next = runq_pop();
    if (next)
        next->state = PROC_RUNNING;
    spin_unlock(&runq_lock);
    if (next != prev)
        switch_to(c, prev, next);
    barrier();
}

/* Start of a LAPIC timer tick, before the accounting chain. */
void sched_clock_tick(void)
{
    struct cpu *c = this_cpu();
    c->ticks = c->ticks + 1;
    c->tick_tsc = rdtsc();
    if (c->id == 0) {
        timer_ticks = timer_ticks + 1;
        for (int i = 0; i < NPROC; i++)
            if (process_table[i].info)
                process_table[i].info->ticks = timer_ticks;
    }
}

static uint32_t wake_sleepers(void)
{
    uint32_t woken = 0;
    spin_lock(&runq_lock);
    for (int i = 0; i < NPROC; i++) {
        struct process *p = &process_table[i];
        if (p->state == PROC_SLEEPING && timer_ticks >= p->wake_tick) {
            p->state = PROC_RUNNABLE;
            runq_push(p);
            woken++;
        }
    }
    spin_unlock(&runq_lock);
    return woken;
}

/* End of a LAPIC timer tick (after the EOI): wakeups (CPU 0), round robin.
 * Processes woken on CPU 0 go to idle CPUs first (IPI); the current process
 * is preempted only if someone is left waiting for a CPU. */
CHAIN_FN void sched_tick(void)
{
    uint32_t id = cpu_id();
    uint32_t kicked = 0;
    if (id == 0) {
        uint32_t woken = wake_sleepers();
        if (woken && cpu_current[0] == NULL)
            woken--;                    /* CPU 0 runs one of them right below */
        for (uint32_t i = 1; i < ncpus && woken; i++) {
            if (cpus[i].online && cpu_current[i] == NULL) {
                lapic_send_ipi(i, RESCHED_VECTOR);
                woken--;
                kicked++;
            }
        }
    }
    if (runq_len > kicked)              /* someone is waiting: time slice over */
        schedule();
    barrier();
}

CHAIN_FN void resched_interrupt_handler(void)
{
    lapic_eoi();
    schedule();
    barrier();
}

/* ---- system calls handled here ---- */

CHAIN_FN uint64_t sys_yield(void)
{
    schedule();
    barrier();
    return 0;
}

CHAIN_FN uint64_t sys_sleep(uint64_t ticks)
{
    if (ticks == 0)
        return sys_yield();
    struct process *p = cpu_current[cpu_id()];
    spin_lock(&runq_lock);
    p->wake_tick = timer_ticks + ticks;
    p->state = PROC_SLEEPING;
    spin_unlock(&runq_lock);
    schedule();
    barrier();
    return 0;
}

CHAIN_FN void sys_exit(uint64_t code)
{
    struct process *p = cpu_current[cpu_id()];
    spin_lock(&runq_lock);
    p->state = PROC_EXITED;
    spin_unlock(&runq_lock);
    spin_lock(&console_lock);
    kprintf("qmpprof-guest: process %d (%s) exited with code %ld\n", p->pid, p->name,
            (int64_t)code);
    spin_unlock(&console_lock);
    schedule();
    for (;;)
        __asm__ volatile("cli; hlt");
}
