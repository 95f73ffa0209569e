/* qmpprof example guest: per-CPU data.
 *
 * Kernel workload: only CPU 0 runs (application processors are never
 * started and stay in real mode). User workload: every CPU boots on (and
 * runs its idle context on) kernel_stacks[its LAPIC ID]. Each stack is
 * KERNEL_STACK_SIZE bytes and aligned to its size, so
 *     cpu = (rsp - kernel_stacks) / KERNEL_STACK_SIZE
 * and the stack base is rsp & ~(KERNEL_STACK_SIZE - 1). */
#include "kernel.h"

uint8_t kernel_stacks[MAX_CPUS][KERNEL_STACK_SIZE]
    __attribute__((aligned(KERNEL_STACK_SIZE)));
