/* qmpprof example guest: the timer interrupt, C side.
 *
 * Called from timer_irq_entry (isr.S) TIMER_HZ times per second, with
 * interrupts disabled (interrupt gate), on top of whatever it interrupted.
 * It bumps timer_ticks (which drives the workload phases) and then does a
 * fixed amount of "accounting" work through a call chain of its own, so that
 * a profile has samples *inside* the interrupt handler, with the interrupted
 * chain beneath it:
 *
 *   timer_irq_entry (stub, .cfi_signal_frame) -> timer_interrupt_handler
 *       -> timer_account -> timer_account_update -> timer_account_leaf
 *
 * TIMER_ACCOUNT_ITERATIONS is calibrated for TCG: about 0.4-0.5 ms per
 * interrupt, i.e. ~4-5 % of CPU time at 100 Hz on a quiet host (more on a
 * loaded one). It is a fixed iteration count, not a time, so the share differs
 * under other accelerators (smaller under a fast KVM); in the user workload a
 * time cap (TIMER_ACCOUNT_MAX_US) bounds it on a slow host. The stub sends the
 * EOI after timer_interrupt_handler returns.
 *
 * User workload (boot option workload=user, sched_running != 0): the same
 * stub and handler serve the LAPIC timer of every CPU (TIMER_HZ each; the
 * 8259 is masked, the stub's PIC EOI is a no-op). Only CPU 0 advances
 * timer_ticks. After the same accounting chain the handler sends the LAPIC
 * EOI and calls sched_tick() (wakeups, round-robin preemption), which may
 * switch to another process's kernel stack; the interrupted context resumes
 * through here and the stub later. */
#include "proc.h"

#define TIMER_ACCOUNT_ITERATIONS 160000
/* User workload: a tick's accounting stops after this much guest time even if
 * its rounds are not done, so that a slow or overcommitted host (8 vCPU
 * threads on 2 host cores, or a VM paused and resumed hundreds of times a
 * second) cannot make the handler outlast the tick and keep a CPU in it for
 * good. A fifth of the 10 ms period: on a host that runs each vCPU at full
 * speed the rounds take ~0.5 ms and the cap never applies. */
#define TIMER_ACCOUNT_MAX_US 2000
#define TIMER_ACCOUNT_CHECK_EVERY 1024      /* rounds between two TSC reads */

volatile uint64_t timer_ticks;
/* timer_account_leaf rounds on all CPUs: TIMER_ACCOUNT_ITERATIONS per
 * interrupt (fewer if TIMER_ACCOUNT_MAX_US cut it short), added once at the
 * end of each (atomically: every CPU adds). */
volatile uint64_t timer_account_rounds;
/* Interrupts whose accounting TIMER_ACCOUNT_MAX_US cut short (all CPUs). */
volatile uint64_t timer_account_cut;

/* Result of the accounting work, so that nothing is optimized away. */
static uint64_t timer_account_state = 0x2545f4914f6cdd1dULL;

/* Each round stores its count to memory, as the workload leaves do, but to
 * this CPU's own stack. A shared global bumped every round was one cache line
 * written by every CPU at once: under multi-threaded TCG (one host thread per
 * vCPU) each store then waits for the line, a tick's 160000 rounds outlast
 * the 10 ms period, the next tick is already pending when the handler
 * returns, and with --smp 8 every CPU ends up in this loop for good (no idle,
 * no process runs; see README "SMP"). */
CHAIN_FN uint64_t timer_account_leaf(uint64_t x)
{
    /* tsc_per_ms is 0 in the kernel workload (one CPU, no calibration): no cap */
    uint64_t budget = TIMER_ACCOUNT_MAX_US * tsc_per_ms / 1000;
    uint64_t deadline = budget ? rdtsc() + budget : ~0ULL;
    volatile uint64_t rounds = 0;
    for (unsigned i = 0; i < TIMER_ACCOUNT_ITERATIONS; i++) {
        x = x * 2862933555777941757ULL + 3037000493ULL;           /* LCG */
        x ^= x >> 33;
        rounds = rounds + 1;
        if (i % TIMER_ACCOUNT_CHECK_EVERY == 0 && rdtsc() > deadline) {
            __atomic_add_fetch(&timer_account_cut, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    __atomic_add_fetch(&timer_account_rounds, rounds, __ATOMIC_RELAXED);
    return x;
}

CHAIN_FN uint64_t timer_account_update(uint64_t x)
{
    uint64_t r = timer_account_leaf(x);
    barrier();
    return r + 11;
}

CHAIN_FN void timer_account(void)
{
    timer_account_state = timer_account_update(timer_account_state);
    barrier();
}

CHAIN_FN void timer_interrupt_handler(void)
{
    if (sched_running) {
        sched_clock_tick();
        timer_account();
        lapic_eoi();
        sched_tick();
        barrier();
        return;
    }
    timer_ticks = timer_ticks + 1;
    timer_account();
    barrier();
}
