/* qmpprof example guest: user program "pulse" (pid 3).
 *
 * Built -O1 -fno-omit-frame-pointer -pg -mnop-mcount (like the fp kernel:
 * every function, leaves included, sets up rbp, so a frame-pointer walk
 * works). Every PERIOD_TICKS * 10 ms = 40 ms it uses BUDGET_US = 4 ms of
 * its own CPU time (10 % of one CPU), split by CPU time (as in crunch.c):
 *
 *   60 % wave   _start -> pulse_main -> pulse_beat -> pulse_wave -> wave_leaf
 *   40 % sync   _start -> pulse_main -> pulse_sync -> usys_checksum
 *               -> int $0x80 -> [kernel] syscall_entry -> syscall_dispatch
 *               -> sys_checksum -> checksum_block -> checksum_leaf
 *
 * then sleeps until the next period:  _start -> pulse_main -> usys_sleep
 * (kernel: syscall_dispatch -> sys_sleep -> schedule -> ...). */
#include "ulib.h"

#define PERIOD_TICKS    4
#define BUDGET_US       4000
#define WAVE_ROUNDS     4096
#define SYNC_ROUNDS     2048

static uint64_t wave_state = 0x3c6ef372fe94f82bULL;
static uint64_t sync_state;

NOINLINE uint64_t wave_leaf(uint64_t x)
{
    uint64_t phase = x;
    for (unsigned i = 0; i < WAVE_ROUNDS; i++) {
        phase += 0x9e3779b97f4a7c15ULL;             /* oscillator */
        x ^= phase * 0x2545f4914f6cdd1dULL;
        x = (x << 7) | (x >> 57);
        x += i;
    }
    return x;
}

NOINLINE uint64_t pulse_wave(uint64_t x)
{
    uint64_t r = wave_leaf(x);
    barrier();
    return r ^ 0x5a5a;
}

NOINLINE void pulse_beat(uint64_t until)
{
    while (CPUTIME() < until) {
        wave_state = pulse_wave(wave_state);
        barrier();
    }
}

NOINLINE void pulse_sync(uint64_t until)
{
    while (CPUTIME() < until) {
        sync_state ^= usys_checksum(SYNC_ROUNDS);
        barrier();
    }
}

NOINLINE int pulse_main(void)
{
    const struct user_info *ui = UINFO;
    uint64_t budget = BUDGET_US * ui->tsc_per_ms / 1000;
    uint64_t period = PERIOD_TICKS * ui->tsc_per_ms * 1000 / ui->hz;
    uint64_t next = RDTSC();
    uint64_t base = CPUTIME();
    for (;;) {
        next += period;
        pulse_beat(base + budget * 6 / 10);
        pulse_sync(base + budget);
        base = BUDGET_NEXT(base, budget);
        if (!SLEEP_UNTIL(next))         /* calls usys_sleep */
            next = RDTSC();
        barrier();
    }
    return 0;
}
