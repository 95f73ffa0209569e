/* libqmpwork.so.1, the shared library dynwork links with: built -fPIC -shared -O2 -g
 * without frame pointers, installed in the guest as /usr/lib/x86_64-linux-gnu/libqmpwork.so.1.
 *   qmpwork_mix   a loop of its own (user code in a library)
 *   qmpwork_each  calls back into the program through a function pointer
 *                 (dynwork -> libqmpwork -> dynwork) */
#include "qmpwork.h"

uint64_t qmpwork_mix(uint64_t seed, unsigned rounds) {
    uint64_t x = seed;
    for (unsigned i = 0; i < rounds; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        x ^= x >> 29;
        __asm__ volatile("" : "+r"(x));  /* keeps every round: no closed form */
    }
    return x;
}

uint64_t qmpwork_each(const uint32_t *keys, size_t count,
                      uint64_t (*visit)(uint32_t key, uint64_t acc)) {
    uint64_t acc = count;
    for (size_t i = 0; i < count; i++)
        acc = visit(keys[i], acc) + i;
    return acc;
}
