/* qmpprof example guest, AArch64 build: the freestanding "libc" of the user
 * programs. Replaces user/ulib.h (same guard; the Makefile force-includes
 * this file, so crunch.c and pulse.c compile unchanged): the same macros,
 * with RDTSC() reading the generic timer's virtual counter CNTVCT_EL0 (the
 * kernel lets EL0 read it, CNTKCTL_EL1.EL0VCTEN; user_info.tsc_per_ms is in
 * its units). */
#ifndef QMPPROF_GUEST_ULIB_H
#define QMPPROF_GUEST_ULIB_H

#include <stdint.h>
#include "uapi.h"

#define NOINLINE __attribute__((noinline, noclone, used))
#define barrier() __asm__ volatile("" ::: "memory")

#define UINFO ((const struct user_info *)USER_INFO_VA)

#define RDTSC()                                                          \
    ({                                                                   \
        uint64_t v_;                                                     \
        __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v_) : : "memory"); \
        v_;                                                              \
    })

/* The rest as in user/ulib.h. */
#define CPUTIME()                                                        \
    ({                                                                   \
        uint64_t s_, a_, b_, t_;                                         \
        do {                                                             \
            s_ = UINFO->seq;                                             \
            a_ = UINFO->run_tsc;                                         \
            b_ = UINFO->run_start;                                       \
            t_ = RDTSC();                                                \
        } while (UINFO->seq != s_);                                      \
        a_ + (t_ - b_);                                                  \
    })

#define MAX_DEBT_MS 200
#define BUDGET_NEXT(base, budget)                                        \
    ({                                                                   \
        uint64_t nb_ = (base) + (budget);                                \
        uint64_t c_ = CPUTIME();                                         \
        uint64_t max_ = MAX_DEBT_MS * UINFO->tsc_per_ms;                 \
        c_ > nb_ + max_ ? c_ - max_ : nb_;                               \
    })

#define SLEEP_UNTIL(next)                                                \
    ({                                                                   \
        uint64_t tick_ = UINFO->tsc_per_ms * 1000 / UINFO->hz;           \
        uint64_t now_ = RDTSC();                                         \
        int slept_ = 0;                                                  \
        if (now_ < (next)) {                                             \
            usys_sleep(((next) - now_ + tick_ - 1) / tick_);             \
            slept_ = 1;                                                  \
        }                                                                \
        slept_;                                                          \
    })

uint64_t usys_checksum(uint64_t rounds);
uint64_t usys_sleep(uint64_t ticks);
uint64_t usys_yield(void);
void usys_exit(int code) __attribute__((noreturn));

#endif
