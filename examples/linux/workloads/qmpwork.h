/* libqmpwork.so.1: the small shared library dynwork calls into (qmpwork.c). */
#ifndef QMPWORK_H
#define QMPWORK_H

#include <stddef.h>
#include <stdint.h>

/* `rounds` steps of a 64-bit LCG from `seed`: pure computation inside the library. */
uint64_t qmpwork_mix(uint64_t seed, unsigned rounds);

/* Folds `visit` over `keys`: the library calls back into its caller for each key. */
uint64_t qmpwork_each(const uint32_t *keys, size_t count,
                      uint64_t (*visit)(uint32_t key, uint64_t acc));

#endif
