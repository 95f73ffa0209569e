/* qmpprof example guest: constants shared by C and assembly.
 * Two architectures: x86-64 (default) and i386 (make ARCH=i386, gcc -m32;
 * the second block). */
#ifndef QMPPROF_GUEST_CONFIG_H
#define QMPPROF_GUEST_CONFIG_H

#ifndef __i386__
#define KERNEL_VMA          0xffffffff80000000  /* virtual = physical + KERNEL_VMA */
#else
#define KERNEL_VMA          0xC0000000          /* 3G/1G split: virtual = physical + KERNEL_VMA */
#endif
#define KERNEL_STACK_SIZE   16384               /* per CPU, aligned to its size */
#define MAX_CPUS            8
#define TIMER_HZ            100                 /* PIT channel 0 via the 8259 PIC */
#define TIMER_VECTOR        0x20                /* IRQ0 after PIC remap */
#define KERNEL_CS           0x08
#define KERNEL_DS           0x10

/* ---- user workload (boot option workload=user) ---- */
#define USER_DS             0x1b                /* GDT 0x18 | RPL 3 */
#define USER_CS             0x23                /* GDT 0x20 | RPL 3 */
#ifndef __i386__
#define TSS_SEL             0x28                /* per-CPU TSS (16-byte descriptor) */
#define USER32_CS           0x3b                /* GDT 0x38 | RPL 3: 32-bit user code (L=0, D=1),
                                                   compatibility mode (workload=compat) */
#else
#define TSS_SEL             0x28                /* per-CPU TSS (8-byte descriptor) */
#define PERCPU_SEL          0x33                /* GDT 0x30 | RPL 3: %gs, base = &cpus[id] */
#endif
#define NCPU                MAX_CPUS            /* size of cpu_current[] */
#define NPROC               8                   /* size of process_table[] */
#define RESCHED_VECTOR      0x41                /* IPI: an idle CPU has work */
#define SPURIOUS_VECTOR     0xff                /* LAPIC spurious interrupts */
#define AP_TRAMPOLINE_PHYS  0x8000              /* real-mode AP entry (SIPI vector 8) */
#define LAPIC_PHYS          0xfee00000
#ifndef __i386__
#define LAPIC_VIRT          0xffffffffc0000000  /* PML4[511] -> PDPT[511] -> 2 MiB page */
#else
#define LAPIC_VIRT          0xfee00000          /* = LAPIC_PHYS, one 4 MiB / 2 MiB page */
#define KERNEL_MAP_SIZE     0x20000000          /* physical 0..512 MiB mapped at KERNEL_VMA */
#endif
#define PHYS_ALLOC_START    0x400000            /* page allocator: 4 MiB ... end of RAM */

/* Callee-saved registers switch_context() pushes (the initial kernel stack
 * of a process has this many zero words below the return address). */
#ifndef __i386__
#define SWITCH_SAVED_REGS   6                   /* rbp rbx r12 r13 r14 r15 */
#else
#define SWITCH_SAVED_REGS   4                   /* ebp ebx esi edi */
#endif

#endif
