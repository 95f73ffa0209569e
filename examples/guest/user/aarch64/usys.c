/* qmpprof example guest, AArch64 build: system call wrappers (see
 * src/uapi.h; replaces user/usys.c). `svc #0`: number in x8, arguments in
 * x0, x1, result in x0; the kernel preserves every other register. The same
 * functions as user/usys.c, each a real function whose body is the svc. */
#include "ulib.h"

#define SYSCALL1(nr, a1)                                                  \
    ({                                                                    \
        register uint64_t x0_ __asm__("x0") = (uint64_t)(a1);             \
        register uint64_t x8_ __asm__("x8") = (uint64_t)(nr);             \
        __asm__ volatile("svc #0" : "+r"(x0_) : "r"(x8_) : "memory");     \
        x0_;                                                              \
    })

NOINLINE uint64_t usys_checksum(uint64_t rounds)
{
    return SYSCALL1(SYS_CHECKSUM, rounds);
}

NOINLINE uint64_t usys_sleep(uint64_t ticks)
{
    return SYSCALL1(SYS_SLEEP, ticks);
}

NOINLINE uint64_t usys_yield(void)
{
    return SYSCALL1(SYS_YIELD, 0);
}

NOINLINE void usys_exit(int code)
{
    SYSCALL1(SYS_EXIT, code);
    for (;;)
        barrier();
}
