/* qmpprof example guest: the user/kernel interface of the "user" workload.
 * Shared by the kernel (src/) and the user programs (user/). */
#ifndef QMPPROF_GUEST_UAPI_H
#define QMPPROF_GUEST_UAPI_H

/* System calls: `int $0x80`, number in rax, arguments in rdi, rsi, result in
 * rax. Every other register is preserved.
 * i386, and a 32-bit process under the x86-64 kernel (compatibility mode,
 * workload=compat): number in eax, arguments in ebx, ecx, 64-bit result in
 * edx:eax. Every other register is preserved. */
#define SYSCALL_VECTOR  0x80
#define SYS_EXIT        0   /* exit(code): never returns */
#define SYS_SLEEP       1   /* sleep(ticks): block for `ticks` timer ticks (10 ms each); 0 = yield */
#define SYS_CHECKSUM    2   /* checksum(n): n rounds of kernel work, returns the checksum */
#define SYS_YIELD       3   /* yield(): give up the CPU, stay runnable */

#define CHECKSUM_MAX_ROUNDS 65536

/* Address space of a 32-bit process: static ELF32 linked at 0x08048000, user
 * half below 0xC0000000. The i386 build's processes, and (x86-64 build,
 * workload=compat) a 32-bit process under the 64-bit kernel in compatibility
 * mode, which has the same layout. */
#define USER32_LOAD_ADDR 0x08048000
#define USER32_STACK_TOP 0xbff00000            /* initial esp, 16-byte aligned */
#define USER32_INFO_VA   0xbffff000            /* struct user_info, read-only */
#define USER32_VA_END    0xbff00000            /* ELF segments end below the user stack */

#ifndef __i386__
/* Address space of every process (static, non-PIE ELF64 linked at 0x400000). */
#define USER_LOAD_ADDR   0x400000
#define USER_STACK_TOP   0x7ffffff00000        /* initial rsp, 16-byte aligned */
#define USER_STACK_PAGES 8                     /* 32 KiB below USER_STACK_TOP */
#define USER_INFO_VA     0x7ffffffff000        /* struct user_info, read-only */
#else
/* i386: static ELF32 linked at 0x08048000; user half below 0xC0000000. */
#define USER_LOAD_ADDR   USER32_LOAD_ADDR
#define USER_STACK_TOP   USER32_STACK_TOP      /* initial esp, 16-byte aligned */
#define USER_STACK_PAGES 8                     /* 32 KiB below USER_STACK_TOP */
#define USER_INFO_VA     USER32_INFO_VA        /* struct user_info, read-only */
#endif

#ifndef __ASSEMBLY__
#include <stdint.h>

/* One read-only page per process, written by the kernel (a tiny vDSO): the
 * process uses it to budget its own CPU time without a system call.
 * CPU time used so far = run_tsc + (rdtsc - run_start), valid while seq does
 * not change (seq changes every time the process is switched in). */
struct user_info {
    volatile uint64_t seq;          /* +1 on every switch-in */
    volatile uint64_t run_tsc;      /* TSC cycles run before the current run */
    volatile uint64_t run_start;    /* TSC at the current switch-in */
    volatile uint64_t ticks;        /* global timer tick counter (100 Hz) */
    uint64_t tsc_per_ms;            /* TSC cycles per millisecond (calibrated) */
    int32_t pid;
    int32_t ncpu;
    uint32_t hz;                    /* timer ticks per second (sleep unit) */
};
/* The same offsets for -m64 and -m32 (the 8-byte members come first; -m32
 * aligns a uint64_t member to 4 bytes only): a 32-bit process under the
 * 64-bit kernel (workload=compat) reads the page the kernel writes. */
_Static_assert(__builtin_offsetof(struct user_info, pid) == 40 &&
               __builtin_offsetof(struct user_info, hz) == 48, "struct user_info layout");
#endif

#endif
