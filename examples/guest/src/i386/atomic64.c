/* qmpprof example guest, i386: the one 64-bit atomic GCC does not inline with
 * -m32 -mgeneral-regs-only (it would need x87/SSE for the 64-bit load):
 * __atomic_fetch_add_8, used by __atomic_add_fetch on the uint64_t counters
 * timer_account_rounds, timer_account_cut and sched_switches. A lock
 * cmpxchg8b loop (SMP-safe). Called once per timer interrupt / context
 * switch, not in any loop of the documented chains. */
#include <stdint.h>

/* The asm label gives the libatomic name without redeclaring GCC's builtin. */
uint64_t atomic_fetch_add_8(volatile void *p, uint64_t v, int order)
    __asm__("__atomic_fetch_add_8");

uint64_t atomic_fetch_add_8(volatile void *p, uint64_t v, int order)
{
    volatile uint64_t *q = p;
    uint64_t old = *q;                  /* may be torn: cmpxchg8b checks it */
    (void)order;                        /* always sequentially consistent */
    for (;;) {
        uint64_t nv = old + v;
        uint8_t ok;
        /* if (*q == edx:eax) *q = ecx:ebx, else edx:eax = *q */
        __asm__ volatile("lock cmpxchg8b %1\n\tsete %0"
                         : "=q"(ok), "+m"(*q), "+A"(old)
                         : "b"((uint32_t)nv), "c"((uint32_t)(nv >> 32))
                         : "memory", "cc");
        if (ok)
            return old;
    }
}
