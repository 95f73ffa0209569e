/* qmpprof example guest: the timer interrupt, C side.
 *
 * Called from timer_irq_entry (isr.S) TIMER_HZ times per second. Kept tiny
 * on purpose: the workload phases are driven by timer_ticks. */
#include "kernel.h"

volatile uint64_t timer_ticks;

void timer_interrupt_handler(void)
{
    timer_ticks = timer_ticks + 1;
}
