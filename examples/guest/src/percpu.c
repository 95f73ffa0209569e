/* qmpprof example guest: per-CPU data.
 *
 * Only CPU 0 runs today (application processors are never started and stay
 * in real mode), but the stacks are already an array indexed by CPU number
 * so SMP can be added without moving things around. Each stack is
 * KERNEL_STACK_SIZE bytes and aligned to its size, so
 *     cpu = (rsp - kernel_stacks) / KERNEL_STACK_SIZE
 * and the stack base is rsp & ~(KERNEL_STACK_SIZE - 1). */
#include "kernel.h"

uint8_t kernel_stacks[MAX_CPUS][KERNEL_STACK_SIZE]
    __attribute__((aligned(KERNEL_STACK_SIZE)));
