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
 * under other accelerators (smaller under a fast KVM). The stub sends the EOI
 * after timer_interrupt_handler returns.
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

volatile uint64_t timer_ticks;
/* Bumped once per timer_account_leaf round (TIMER_ACCOUNT_ITERATIONS per
 * interrupt). */
volatile uint64_t timer_account_rounds;

/* Result of the accounting work, so that nothing is optimized away. */
static uint64_t timer_account_state = 0x2545f4914f6cdd1dULL;

CHAIN_FN uint64_t timer_account_leaf(uint64_t x)
{
    for (unsigned i = 0; i < TIMER_ACCOUNT_ITERATIONS; i++) {
        x = x * 2862933555777941757ULL + 3037000493ULL;           /* LCG */
        x ^= x >> 33;
        timer_account_rounds = timer_account_rounds + 1;
    }
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
