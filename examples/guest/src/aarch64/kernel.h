/* qmpprof example guest, AArch64 build: shared declarations.
 *
 * Replaces src/kernel.h for ARCH=aarch64 (same guard; see config.h). The
 * portable sources (workload.c, timer.c, sched.c, syscall.c, serial.c,
 * lib.c, percpu.c) are compiled unchanged against it:
 *
 *  - the x86 instructions they use in inline assembly ("sti; hlt",
 *    "cli; hlt", "pause") are assembler macros defined below:
 *    sti = msr daifclr,#2 (unmask IRQs), hlt = wfi, cli = msr daifset,#2,
 *    pause = yield;
 *  - rdtsc() reads the generic timer's virtual counter CNTVCT_EL0
 *    (62.5 MHz under QEMU; "TSC" means this counter in the AArch64 build);
 *  - serial.c's COM1 accesses (outb/inb) go to the PL011 UART (see below). */
#ifndef QMPPROF_GUEST_KERNEL_H
#define QMPPROF_GUEST_KERNEL_H

#include <stdint.h>
#include <stddef.h>
#include <stdarg.h>
#include "config.h"

#define CHAIN_FN __attribute__((noinline, noclone, used))
#define barrier() __asm__ volatile("" ::: "memory")

__asm__(".ifndef qmpprof_x86_macros\n"
        ".set qmpprof_x86_macros, 1\n"
        ".macro sti\n\tmsr daifclr, #2\n.endm\n"
        ".macro cli\n\tmsr daifset, #2\n.endm\n"
        ".macro hlt\n\twfi\n.endm\n"
        ".macro pause\n\tyield\n.endm\n"
        ".endif\n");

/* ---- MMIO ---- */
#define PHYS_TO_KVA(p) ((uintptr_t)(p) + KERNEL_VMA)
static inline void mmio_write32(uintptr_t phys, uint32_t v)
{
    *(volatile uint32_t *)PHYS_TO_KVA(phys) = v;
}
static inline uint32_t mmio_read32(uintptr_t phys)
{
    return *(volatile uint32_t *)PHYS_TO_KVA(phys);
}

/* ---- serial.c's COM1 on the PL011 ----
 * serial.c (shared) drives a 16550 at port 0x3f8: its data register writes
 * go to the PL011 data register, its line-status reads report "transmitter
 * empty" (0x20) when the PL011 transmit FIFO is not full. The 16550 setup
 * writes are ignored (QEMU's PL011 needs none). */
#define PL011_DR   0x000
#define PL011_FR   0x018
#define PL011_FR_TXFF 0x20
static inline void outb(uint16_t port, uint8_t val)
{
    if (port == 0x3f8)
        mmio_write32(UART_PHYS + PL011_DR, val);
}
static inline uint8_t inb(uint16_t port)
{
    if (port == 0x3f8 + 5)
        return (mmio_read32(UART_PHYS + PL011_FR) & PL011_FR_TXFF) ? 0 : 0x20;
    return 0;
}
static inline void cpu_sti(void) { __asm__ volatile("msr daifclr, #2" ::: "memory"); }
static inline void cpu_cli(void) { __asm__ volatile("msr daifset, #2" ::: "memory"); }

/* The generic timer's virtual counter (EL0 may read it too: CNTKCTL_EL1.EL0VCTEN). */
static inline uint64_t rdtsc(void)
{
    uint64_t v;
    __asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v) : : "memory");
    return v;
}

/* ---- boot.S ---- */
extern uint64_t kernel_l0[512];      /* TTBR1_EL1 (and TTBR0_EL1 while booting) */
extern uint64_t kernel_l1[512];      /* 1 GiB blocks: [0] devices, [1] RAM */
extern uint64_t empty_l0[512];       /* TTBR0_EL1 when no process runs: no mappings */
void kernel_entry(void);             /* first code in the upper half, calls kernel_main */
void ap_entry(void);                 /* same for the other CPUs, calls ap_main */
void secondary_start(void);          /* physical PSCI CPU_ON entry point */
extern char _start_phys[];

/* ---- per-CPU data (percpu.c) ---- */
extern uint8_t kernel_stacks[MAX_CPUS][KERNEL_STACK_SIZE];

/* ---- serial.c ---- */
void serial_init(void);
void serial_putc(char c);
void serial_puts(const char *s);
void kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- exceptions (entry.S, traps.c, timer.c) ---- */
struct exception_frame {             /* entry.S, FRAME_* in config.h */
    uint64_t x[31];                  /* x0..x30 */
    uint64_t sp;                     /* interrupted sp (SP_EL0 if from EL0) */
    uint64_t pc;                     /* ELR_EL1 */
    uint64_t pstate;                 /* SPSR_EL1 */
    uint64_t esr;                    /* ESR_EL1 (sync) / GICC_IAR (irq) */
    uint64_t far;                    /* FAR_EL1 (sync) */
    uint64_t record[2];              /* frame record: interrupted x29, pc */
};
_Static_assert(sizeof(struct exception_frame) == FRAME_SIZE, "exception frame");
extern char exception_vectors[];
void exception_handler(struct exception_frame *f);
void timer_interrupt_handler(void);
extern volatile uint64_t timer_ticks;

/* ---- workload.c ---- */
extern volatile uint64_t workload_progress;
extern volatile uint32_t workload_stop;
void workload_loop(void);

/* ---- lib.c ---- */
void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);

void kernel_main(void);

/* ---- boot command line (main.c, from the DTB's /chosen/bootargs) ---- */
enum workload_kind { WORKLOAD_KERNEL = 0, WORKLOAD_USER = 1 };
extern enum workload_kind boot_workload;
extern char boot_cmdline[256];
extern uint64_t boot_mem_start, boot_mem_size;   /* from the DTB's /memory node */
void dtb_scan(void);                             /* dtb.c: bootargs and memory */

/* ---- smp.c: GIC, generic timer, PSCI ---- */
void gic_init(void);                 /* distributor (once) */
void gic_cpu_init(void);             /* this CPU's interface, its PPIs/SGIs */
void gic_eoi(uint32_t iar);
void gic_send_sgi(uint32_t cpu, uint32_t sgi);
void timer_start(void);              /* EL1 virtual timer at TIMER_HZ */
extern uint64_t timer_interval;      /* counter ticks per timer tick */
extern volatile uint32_t irq_count_spurious;

#endif
