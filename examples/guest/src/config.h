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

/* ---- user workload (boot option workload=user) ---- */
#define USER_DS             0x1b                /* GDT 0x18 | RPL 3 */
#define USER_CS             0x23                /* GDT 0x20 | RPL 3 */
#define TSS_SEL             0x28                /* per-CPU TSS (16-byte descriptor) */
#define NCPU                MAX_CPUS            /* size of cpu_current[] */
#define NPROC               8                   /* size of process_table[] */
#define RESCHED_VECTOR      0x41                /* IPI: an idle CPU has work */
#define SPURIOUS_VECTOR     0xff                /* LAPIC spurious interrupts */
#define AP_TRAMPOLINE_PHYS  0x8000              /* real-mode AP entry (SIPI vector 8) */
#define LAPIC_PHYS          0xfee00000
#define LAPIC_VIRT          0xffffffffc0000000  /* PML4[511] -> PDPT[511] -> 2 MiB page */
#define PHYS_ALLOC_START    0x400000            /* page allocator: 4 MiB ... end of RAM */

#endif
