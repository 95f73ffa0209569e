/* qmpprof example guest: user program "crunch" (pids 1 and 2).
 *
 * Built -O2 -fomit-frame-pointer (no frame pointers: only DWARF CFI from
 * .eh_frame can unwind it). Every PERIOD_TICKS * 10 ms = 100 ms it uses
 * BUDGET_MS = 30 ms of its own CPU time (30 % of one CPU, measured with the
 * TSC through its user_info page, kernel time on its behalf included), split
 * by CPU time, not by work done, so the shares do not depend on the host's
 * speed (cumulative targets on a fixed TSC grid of periods, see BUDGET_NEXT
 * and SLEEP_UNTIL in ulib.h):
 *
 *   50 % hash      _start -> crunch_main -> crunch_hash -> hash_block -> hash_leaf
 *   30 % sort      _start -> crunch_main -> crunch_sort -> sort_leaf
 *   20 % checksum  _start -> crunch_main -> crunch_checksum -> usys_checksum
 *                  -> int $0x80 -> [kernel] syscall_entry -> syscall_dispatch
 *                  -> sys_checksum -> checksum_block -> checksum_leaf
 *
 * then sleeps until the next period:  _start -> crunch_main -> usys_sleep.
 * Each leaf call is short (~20-30 us under TCG); the budget is checked
 * between calls. */
#include "ulib.h"

#define PERIOD_TICKS    10
#define BUDGET_MS       30
#define HASH_ROUNDS     4096
#define SORT_N          96
#define CHECKSUM_ROUNDS 4096

static uint64_t hash_state = 0x6a09e667f3bcc908ULL;
static uint64_t sort_state = 0xbb67ae8584caa73bULL;
static uint64_t checksum_state;

/* ---- hash: 3 user frames below crunch_main ---- */

NOINLINE uint64_t hash_leaf(uint64_t x)
{
    for (unsigned i = 0; i < HASH_ROUNDS; i++) {
        x ^= x >> 30;
        x *= 0xbf58476d1ce4e5b9ULL;                 /* splitmix64 finalizer */
        x ^= x >> 27;
        x *= 0x94d049bb133111ebULL;
        x ^= x >> 31;
        x += i;
    }
    return x;
}

NOINLINE uint64_t hash_block(uint64_t x)
{
    uint64_t r = hash_leaf(x);
    barrier();
    return r + 1;
}

NOINLINE void crunch_hash(uint64_t until)
{
    while (CPUTIME() < until) {
        hash_state = hash_block(hash_state);
        barrier();
    }
}

/* ---- sort: 2 user frames below crunch_main ---- */

NOINLINE uint64_t sort_leaf(uint64_t seed)
{
    uint32_t a[SORT_N];
    uint64_t x = seed;
    for (int i = 0; i < SORT_N; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        a[i] = (uint32_t)(x >> 32);
    }
    for (int i = 1; i < SORT_N; i++) {                /* insertion sort */
        uint32_t v = a[i];
        int j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
    return x ^ a[0] ^ ((uint64_t)a[SORT_N / 2] << 32) ^ a[SORT_N - 1];
}

NOINLINE void crunch_sort(uint64_t until)
{
    while (CPUTIME() < until) {
        sort_state = sort_leaf(sort_state) + 1;
        barrier();
    }
}

/* ---- checksum: system call, the kernel does the work ---- */

NOINLINE void crunch_checksum(uint64_t until)
{
    while (CPUTIME() < until) {
        checksum_state += usys_checksum(CHECKSUM_ROUNDS);
        barrier();
    }
}

NOINLINE int crunch_main(void)
{
    const struct user_info *ui = UINFO;
    uint64_t budget = BUDGET_MS * ui->tsc_per_ms;
    hash_state ^= (uint64_t)ui->pid << 32;
    sort_state ^= (uint64_t)ui->pid;
    uint64_t period = PERIOD_TICKS * ui->tsc_per_ms * 1000 / ui->hz;
    uint64_t next = RDTSC();
    uint64_t base = CPUTIME();
    for (;;) {
        next += period;
        crunch_hash(base + budget / 2);
        crunch_sort(base + budget * 8 / 10);
        crunch_checksum(base + budget);
        base = BUDGET_NEXT(base, budget);
        if (!SLEEP_UNTIL(next))         /* calls usys_sleep */
            next = RDTSC();             /* overran the period: start a new one now */
        barrier();
    }
    return 0;
}
