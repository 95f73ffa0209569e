/* A dynamically linked PIE, built like a stock distro program (-fPIE -pie -O2 -g
 * -fomit-frame-pointer: only CFI unwinds it), spending its time in libc and in
 * libqmpwork.so.1, CPU-bound and deterministic (a fixed seed, no sleeping), forever or,
 * given a number (spawner.c's children), that many rounds of its loop:
 *   main -> dyn_loop -> dyn_sort   -> qsort (libc) -> compare_keys -> key_weight
 *                    -> dyn_copy   -> memcpy (libc)
 *                    -> dyn_format -> snprintf (libc)
 *                    -> qmpwork_mix (libqmpwork)
 *                    -> qmpwork_each (libqmpwork) -> visit_key
 * With QMPPROF_STOP_IN_MAIN in its environment (init sets it) it stops itself (SIGSTOP)
 * first thing in main, so that its parent reads its maps with every library loaded. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qmpwork.h"

#define KEYS 512
#define COPY_BYTES (64 * 1024)

static uint32_t keys[KEYS];
static unsigned char source[COPY_BYTES], target[COPY_BYTES];
static char text[128];
static volatile uint64_t sink;

static uint32_t next_random(uint64_t *state) {
    *state = *state * 6364136223846793005UL + 1442695040888963407UL;
    return (uint32_t)(*state >> 33);
}

/* Enough work per comparison that qsort's time is mostly in the callback. */
__attribute__((noinline)) static uint32_t key_weight(uint32_t key) {
    uint32_t x = key;
    for (int i = 0; i < 24; i++) {
        x = x * 2654435761u + 0x9e3779b9u;
        x ^= x >> 15;
    }
    return x;
}

static int compare_keys(const void *left, const void *right) {
    uint32_t a = key_weight(*(const uint32_t *)left), b = key_weight(*(const uint32_t *)right);
    return (a > b) - (a < b);
}

static uint64_t visit_key(uint32_t key, uint64_t acc) {
    return acc * 31 + key_weight(key);
}

__attribute__((noinline)) static void dyn_sort(uint64_t *state) {
    for (size_t i = 0; i < KEYS; i++)
        keys[i] = next_random(state);
    qsort(keys, KEYS, sizeof keys[0], compare_keys);
    sink += keys[0];  /* work after the call: not a tail call, dyn_sort keeps its frame */
}

__attribute__((noinline)) static void dyn_copy(void) {
    for (int i = 0; i < 4; i++) {
        memcpy(target, source, sizeof source);
        source[i] ^= target[COPY_BYTES - 1 - i];
    }
}

__attribute__((noinline)) static void dyn_format(uint64_t seed) {
    for (int i = 0; i < 64; i++)
        sink += (uint64_t)snprintf(text, sizeof text, "%d:%llx:%.3f", i,
                                   (unsigned long long)(seed + (uint64_t)i), (double)i / 7.0);
}

__attribute__((noinline)) static void dyn_loop(long rounds) {
    uint64_t state = 1;
    for (long round = 0; rounds <= 0 || round < rounds; round++) {
        dyn_sort(&state);
        dyn_copy();
        dyn_format(state);
        sink += qmpwork_mix(state, 20000);
        sink += qmpwork_each(keys, KEYS, visit_key);
    }
}

int main(int argc, char **argv) {
    if (getenv("QMPPROF_STOP_IN_MAIN") != NULL)
        raise(SIGSTOP);
    dyn_loop(argc > 1 ? strtol(argv[1], NULL, 10) : 0);
    return 0;
}
