/* qmpprof example guest, i386: the 64-bit division helpers GCC calls with
 * -m32 (__udivdi3 and friends, normally from libgcc). There is no 32-bit
 * libgcc on the build machine, and these are compiled with the kernel's (or
 * the user program's) own flags, so they have frames (fp) and CFI (.eh_frame)
 * like every other function. Linked into the kernel and into each user
 * program. Only slow paths use them (printing, calibration, CPU budgets once
 * per period); none of the documented call chains calls them in its loop. */
#include <stdint.h>

uint64_t __udivmoddi4(uint64_t n, uint64_t d, uint64_t *rem);
uint64_t __udivdi3(uint64_t n, uint64_t d);
uint64_t __umoddi3(uint64_t n, uint64_t d);
int64_t __divdi3(int64_t n, int64_t d);
int64_t __moddi3(int64_t n, int64_t d);

uint64_t __udivmoddi4(uint64_t n, uint64_t d, uint64_t *rem)
{
    if ((d >> 32) == 0) {
        /* 64 / 32: two divl (the high half first, its remainder carried) */
        uint32_t dl = (uint32_t)d;
        uint32_t nh = (uint32_t)(n >> 32), nl = (uint32_t)n;
        uint32_t qh = nh / dl, r = nh % dl, ql;
        __asm__("divl %4" : "=a"(ql), "=d"(r) : "a"(nl), "d"(r), "rm"(dl));
        if (rem)
            *rem = r;
        return ((uint64_t)qh << 32) | ql;
    }
    /* d >= 2^32: the quotient has at most 32 bits; shift and subtract */
    uint64_t q = 0, r = 0;
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1);
        if (r >= d) {
            r -= d;
            q |= 1ULL << i;
        }
    }
    if (rem)
        *rem = r;
    return q;
}

uint64_t __udivdi3(uint64_t n, uint64_t d)
{
    return __udivmoddi4(n, d, 0);
}

uint64_t __umoddi3(uint64_t n, uint64_t d)
{
    uint64_t r;
    __udivmoddi4(n, d, &r);
    return r;
}

int64_t __divdi3(int64_t n, int64_t d)
{
    uint64_t un = n < 0 ? -(uint64_t)n : (uint64_t)n;
    uint64_t ud = d < 0 ? -(uint64_t)d : (uint64_t)d;
    uint64_t q = __udivmoddi4(un, ud, 0);
    return (int64_t)(((n < 0) != (d < 0)) ? -q : q);
}

int64_t __moddi3(int64_t n, int64_t d)
{
    uint64_t un = n < 0 ? -(uint64_t)n : (uint64_t)n;
    uint64_t ud = d < 0 ? -(uint64_t)d : (uint64_t)d;
    uint64_t r;
    __udivmoddi4(un, ud, &r);
    return (int64_t)(n < 0 ? -r : r);
}
