/* qmpprof example guest: the freestanding "libc" of the user programs. */
#ifndef QMPPROF_GUEST_ULIB_H
#define QMPPROF_GUEST_ULIB_H

#include <stdint.h>
#include "uapi.h"

/* A function that must keep its own frame (no inlining, cloning or tail
 * calls: calls are followed by barrier()). */
#define NOINLINE __attribute__((noinline, noclone, used))
#define barrier() __asm__ volatile("" ::: "memory")

/* The process's read-only info page (see src/uapi.h). */
#define UINFO ((const struct user_info *)USER_INFO_VA)

#define RDTSC()                                                          \
    ({                                                                   \
        uint32_t lo_, hi_;                                               \
        __asm__ volatile("rdtsc" : "=a"(lo_), "=d"(hi_));                \
        ((uint64_t)hi_ << 32) | lo_;                                     \
    })

/* CPU time this process has used, in TSC cycles (time switched in, kernel
 * time on its behalf included). A macro on purpose: as an inline function
 * it would show up as an inline frame in GDB backtraces. */
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

/* CPU-time budgets and periods. A program works until CPUTIME() reaches a
 * target and checks it only between short chunks of work (~20 us), so it
 * overshoots a target by up to one chunk, or by much more if the host
 * deschedules the vCPU thread during that chunk (TSC and guest clock keep
 * running: the guest cannot tell). Targets are therefore cumulative: each
 * period's budget starts where the previous one should have ended
 * (base += budget), so an overshoot is paid back by the next period(s) and
 * the long-run share is exact. Only a debt above MAX_DEBT_MS is forgiven. */
#define MAX_DEBT_MS 200
#define BUDGET_NEXT(base, budget)                                        \
    ({                                                                   \
        uint64_t nb_ = (base) + (budget);                                \
        uint64_t c_ = CPUTIME();                                         \
        uint64_t max_ = MAX_DEBT_MS * UINFO->tsc_per_ms;                 \
        c_ > nb_ + max_ ? c_ - max_ : nb_;                               \
    })

/* Periods are a fixed grid in TSC time (not in timer ticks, which QEMU
 * drops when its timer thread runs late on a loaded host): sleep until the
 * tick at or after `next`, then next += period. */
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

/* System call wrappers (usys.c): each is a real function whose body
 * executes `int $0x80`. */
uint64_t usys_checksum(uint64_t rounds);
uint64_t usys_sleep(uint64_t ticks);
uint64_t usys_yield(void);
void usys_exit(int code) __attribute__((noreturn));

#endif
