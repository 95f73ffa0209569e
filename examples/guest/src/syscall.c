/* qmpprof example guest: system calls of the user workload.
 *
 * `int $0x80` -> syscall_entry (isr.S, signal-frame CFI) -> syscall_dispatch
 *   SYS_CHECKSUM: syscall_dispatch -> sys_checksum -> checksum_block -> checksum_leaf
 *   SYS_SLEEP:    syscall_dispatch -> sys_sleep -> schedule -> switch_to -> switch_context
 *   SYS_YIELD:    syscall_dispatch -> sys_yield -> schedule -> ...
 *   SYS_EXIT:     syscall_dispatch -> sys_exit -> schedule (never returns)
 *
 * checksum(n) is real kernel work done on behalf of the caller: n rounds of
 * a Fletcher-like sum over a 4 KiB kernel table (~5 ns per round under TCG,
 * n is capped at CHECKSUM_MAX_ROUNDS). Almost all of its time is spent in
 * checksum_leaf. */
#include "proc.h"

#define CHECKSUM_TABLE_WORDS 512            /* power of two */

static uint64_t checksum_table[CHECKSUM_TABLE_WORDS];
/* Total checksum_leaf rounds (all processes, all CPUs; approximate under SMP). */
volatile uint64_t checksum_rounds;

void syscall_init(void)
{
    uint64_t x = 0x853c49e6748fea9bULL;
    for (int i = 0; i < CHECKSUM_TABLE_WORDS; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        checksum_table[i] = x ^ (x >> 31);
    }
}

CHAIN_FN uint64_t checksum_leaf(const uint64_t *table, uint64_t n, uint64_t seed)
{
    uint64_t a = seed | 1, b = seed >> 7;
    for (uint64_t i = 0; i < n; i++) {
        a += table[i & (CHECKSUM_TABLE_WORDS - 1)] ^ i;
        b += a;
        b ^= b >> 29;
    }
    checksum_rounds = checksum_rounds + n;
    return a ^ (b << 1);
}

CHAIN_FN uint64_t checksum_block(uint64_t seed, uint64_t n)
{
    uint64_t r = checksum_leaf(checksum_table, n, seed);
    barrier();
    return r ^ n;
}

CHAIN_FN uint64_t sys_checksum(uint64_t n, struct process *p)
{
    if (n > CHECKSUM_MAX_ROUNDS)
        n = CHECKSUM_MAX_ROUNDS;
    uint64_t r = checksum_block((uint64_t)p->pid * 0x9e3779b97f4a7c15ULL, n);
    barrier();
    return r;
}

CHAIN_FN uint64_t syscall_dispatch(uint64_t nr, uint64_t a1, uint64_t a2)
{
    (void)a2;
    struct process *p = cpu_current[cpu_id()];
    uint64_t r;
    p->syscalls++;
    switch (nr) {
    case SYS_CHECKSUM:
        r = sys_checksum(a1, p);
        break;
    case SYS_SLEEP:
        r = sys_sleep(a1);
        break;
    case SYS_YIELD:
        r = sys_yield();
        break;
    case SYS_EXIT:
        sys_exit(a1);
    default:
        r = (uint64_t)-1;
        break;
    }
    barrier();
    return r;
}
