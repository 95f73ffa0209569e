/* qmpprof example guest: constants shared by C and assembly. */
#ifndef QMPPROF_GUEST_CONFIG_H
#define QMPPROF_GUEST_CONFIG_H

#define KERNEL_VMA          0xffffffff80000000  /* virtual = physical + KERNEL_VMA */
#define KERNEL_STACK_SIZE   16384               /* per CPU, aligned to its size */
#define MAX_CPUS            8
#define TIMER_HZ            100                 /* PIT channel 0 via the 8259 PIC */
#define TIMER_VECTOR        0x20                /* IRQ0 after PIC remap */
#define KERNEL_CS           0x08
#define KERNEL_DS           0x10

#endif
