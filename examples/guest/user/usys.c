/* qmpprof example guest: system call wrappers (see src/uapi.h).
 * int $0x80: number in rax, arguments in rdi/rsi, result in rax; the kernel
 * preserves every other register. i386: number in eax, argument in ebx,
 * 64-bit result in edx:eax. */
#include "ulib.h"

#ifndef __i386__
#define SYSCALL1(nr, a1)                                                  \
    ({                                                                    \
        uint64_t r_;                                                      \
        __asm__ volatile("int %[vec]"                                     \
                         : "=a"(r_)                                       \
                         : [vec] "i"(SYSCALL_VECTOR), "a"((uint64_t)(nr)),\
                           "D"((uint64_t)(a1))                            \
                         : "memory");                                     \
        r_;                                                               \
    })
#else
#define SYSCALL1(nr, a1)                                                  \
    ({                                                                    \
        uint64_t r_;                                                      \
        __asm__ volatile("int %[vec]"                                     \
                         : "=A"(r_)                                       \
                         : [vec] "i"(SYSCALL_VECTOR), "a"((uint32_t)(nr)),\
                           "b"((uint32_t)(a1))                            \
                         : "memory");                                     \
        r_;                                                               \
    })
#endif

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
