/* Two threads, each pinned to its own CPU (sched_setaffinity), both CPU-bound:
 *   CPU 0: main -> pin_to(0), then main -> spin -> churn
 *   CPU 1: (glibc's clone3 -> start_thread) -> second_thread -> spin -> churn
 * Both threads are called `pinned` (a thread inherits its creator's comm). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>

static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long churn(unsigned long x) {
    for (int i = 0; i < 1000; i++)
        x = (x ^ (x >> 7)) * 0x9E3779B97F4A7C15UL;
    return x;
}

__attribute__((noinline)) static void spin(unsigned long seed) {
    for (;;)
        sink = seed = churn(seed);
}

static void pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)  /* 0: the calling thread */
        dprintf(2, "pinned: cannot pin to CPU %d\n", cpu);
}

static void *second_thread(void *unused) {
    (void)unused;
    pin_to(1);
    spin(2);
    return NULL;
}

int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, second_thread, NULL) != 0)
        dprintf(2, "pinned: no second thread\n");
    pin_to(0);
    spin(1);
}
