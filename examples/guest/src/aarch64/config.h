/* qmpprof example guest, AArch64 build: constants shared by C and assembly.
 *
 * Replaces src/config.h for ARCH=aarch64 (the Makefile force-includes
 * src/aarch64/proc.h, which includes this file, before every kernel source;
 * the include guard makes the shared headers no-ops). */
#ifndef QMPPROF_GUEST_CONFIG_H
#define QMPPROF_GUEST_CONFIG_H

/* Memory map (QEMU -M virt): RAM from 0x40000000, the kernel image loaded at
 * its ELF LMA 0x40200000 (QEMU writes the DTB, up to 1 MiB, at the start of
 * RAM only if it fits below the image).
 * The kernel half is reached through TTBR1_EL1: virtual = physical +
 * KERNEL_VMA for physical 0..2 GiB (two 1 GiB blocks: devices, RAM). */
#define KERNEL_VMA          0xffff000000000000
#define RAM_PHYS            0x40000000
#define KERNEL_PHYS         0x40200000          /* LMA of .text (_start) */
#define KERNEL_STACK_SIZE   16384               /* per CPU, aligned to its size */
#define MAX_CPUS            8
#define TIMER_HZ            100                 /* generic timer, EL1 virtual timer */
#define NCPU                MAX_CPUS            /* size of cpu_current[] */
#define NPROC               8                   /* size of process_table[] */
#define PHYS_ALLOC_START    (RAM_PHYS + 0x400000)   /* page allocator: RAM + 4 MiB ... */

/* Devices of the virt board (physical; mapped at KERNEL_VMA + phys) */
#define UART_PHYS           0x09000000          /* PL011 */
#define GICD_PHYS           0x08000000          /* GICv2 distributor */
#define GICC_PHYS           0x08010000          /* GICv2 CPU interface */
#define TIMER_INTID         27                  /* PPI 11: EL1 virtual timer */
#define RESCHED_SGI         1                   /* IPI: an idle CPU has work */
#define GIC_SPURIOUS        1023

/* PSCI (QEMU's built-in firmware, conduit HVC when booted at EL1) */
#define PSCI_CPU_ON         0xc4000003
#define PSCI_AFFINITY_INFO  0xc4000004

/* Exception frame (struct exception_frame / user registers) that the
 * exception stubs (entry.S) build on the kernel stack. */
#define FRAME_X0            0                   /* x0..x30 at 8 * n */
#define FRAME_X30           240
#define FRAME_SP            248                 /* interrupted sp (SP_EL0 from EL0) */
#define FRAME_PC            256                 /* ELR_EL1 */
#define FRAME_PSTATE        264                 /* SPSR_EL1 */
#define FRAME_ESR           272                 /* ESR_EL1 (sync) / GICC_IAR (irq) */
#define FRAME_FAR           280                 /* FAR_EL1 (sync) */
#define FRAME_RECORD        288                 /* frame record {x29, pc}: x29 of the
                                                   stub points here */
#define FRAME_SIZE          304

/* switch_context() frame: x29 x30 x19..x28 (12 words, 96 bytes) */
#define SWITCH_FRAME_SIZE   96

#endif
